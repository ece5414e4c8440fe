#pragma once
// The own-layer example on any backend (examples/own_layer.cpp: the host; own_layer_cuda.cu:
// CUDA): a 2-stage pipeline with a Scale after each hidden Linear learns the spiral of
// examples/spiral.hpp; on a backend other than the host, one step's loss and gradients are first
// compared with the host backend's (the host kernels are the reference of the CUDA kernels).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <gpipe/core.hpp>
#include <gpipe/testing/relative_error.hpp>
#include <string>
#include <vector>

#include "../spiral.hpp"
#include "scale.hpp"

namespace own_layer {

using Model = gpipe::Pipeline<
    gpipe::Stage<gpipe::Linear<2, 64>, Scale<64>, gpipe::GELU>,
    gpipe::Stage<gpipe::Linear<64, 64>, Scale<64>, gpipe::GELU, gpipe::Linear<64, 3>>>;

template <class Backend>
using Trainer = gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, Backend, gpipe::OneFOneB>;

inline constexpr std::size_t micro_batches = 4;
inline constexpr std::uint64_t seed = 42;

// One step on `backend` and on the host backend, same model, seed and batch: the largest
// relative error of the loss and of any gradient, against the host's.
template <class Backend>
double compare_with_host(Backend& backend, const spiral::Dataset& batch) {
  Trainer<Backend> trainer(backend, {.micro_batches = micro_batches, .seed = seed});
  gpipe::host::Backend host_backend(Model::num_stages);
  Trainer<gpipe::host::Backend> host(host_backend, {.micro_batches = micro_batches, .seed = seed});
  const float loss = trainer.forward_backward(batch.x, batch.y);
  const float host_loss = host.forward_backward(batch.x, batch.y);
  double worst =
      gpipe::testing::relative_error(std::vector<float>{loss}, std::vector<float>{host_loss});
  for (const gpipe::ParameterInfo& p : trainer.parameter_info()) {
    if (std::isnan(worst)) break;  // a NaN is the answer: it fails every bound
    const double error =
        gpipe::testing::relative_error(trainer.gradient(p.name), host.gradient(p.name));
    if (!(error <= worst)) worst = error;  // a larger error, or NaN
  }
  return worst;
}

// Trains on the spiral (AdamW, cosine learning rate) and returns the held-out accuracy.
template <class Backend>
double train(Trainer<Backend>& trainer, int steps) {
  const spiral::Dataset train_set = spiral::make_spiral(400, 1),
                        test_set = spiral::make_spiral(200, 2);
  const std::size_t batch = 240;
  gpipe::optim::AdamW optimizer({.lr = 1e-2, .weight_decay = 1e-4});
  spiral::Dataset mini_batch;
  gpipe::Rng order(7);
  const gpipe::optim::WarmupCosine lr(
      {.max_lr = 1e-2, .min_lr = 0, .total_steps = static_cast<std::size_t>(steps)});
  for (int step = 1; step <= steps; ++step) {
    spiral::sample(train_set, batch, order, mini_batch);
    optimizer.options.lr = lr(static_cast<std::size_t>(step));
    trainer.zero_grad();
    const float loss = trainer.forward_backward(mini_batch.x, mini_batch.y);
    trainer.step(optimizer);
    if (step % 100 == 0 || step == 1) std::printf("step %4d  loss %.4f\n", step, loss);
  }
  return spiral::accuracy(trainer, test_set);
}

// Trains a fresh model on `backend` for `steps` and reports the learned scales: 0 when the
// held-out accuracy exceeds 90%.
template <class Backend>
int train_and_report(Backend& backend, const std::string& devices, int steps) {
  Trainer<Backend> trainer(backend, {.micro_batches = micro_batches, .seed = seed});
  std::printf("training %zu stages on %s, Scale<64> after each hidden Linear, %d steps\n",
              Model::num_stages, devices.c_str(), steps);
  const double accuracy = train(trainer, steps);
  for (const char* name : {"1.weight", "4.weight"}) {  // layers 1 and 4: the Scales
    const std::vector<float> w = trainer.parameter(name);
    float lo = w[0], hi = w[0];
    for (const float v : w) lo = std::min(lo, v), hi = std::max(hi, v);
    std::printf("learned %s: %zu scales in [%.3f, %.3f] (initialized to 1)\n", name, w.size(), lo,
                hi);
  }
  std::printf("test accuracy: %.1f%% (chance: 33.3%%)\n", 100 * accuracy);
  return accuracy > 0.9 ? 0 : 1;
}

}  // namespace own_layer
