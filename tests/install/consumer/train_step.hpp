#pragma once
// The consumers' check (main.cpp on the host backend, cuda_main.cu on the CUDA backend): one SGD
// step of a two-stage pipeline on two devices must lower the loss; prints both losses.

#include <cstdint>
#include <cstdio>
#include <gpipe/core.hpp>
#include <string>
#include <vector>

template <class Backend>
void check_one_step_lowers_the_loss(Backend& backend, const char* who) {
  using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 16>, gpipe::ReLU>,
                                gpipe::Stage<gpipe::Linear<16, 2>>>;
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, Backend> trainer(backend, {.micro_batches = 2});
  // Class 1 when the first feature is positive.
  const std::vector<float> x = {1, 0, 0, 0, -1, 0, 0, 0, 2, 1, 0, 0, -2, 1, 0, 0};
  const std::vector<std::int32_t> y = {1, 0, 1, 0};
  const float before = trainer.forward_backward(x, y);
  trainer.step(gpipe::optim::SGD({.lr = 0.5}));
  trainer.zero_grad();
  const float after = trainer.forward_backward(x, y);
  if (!(after < before)) throw gpipe::Error(std::string(who) + ": a step did not lower the loss");
  std::printf("%s: ok (loss %.4f -> %.4f)\n", who, before, after);
}
