#pragma once
// The spiral example on any backend (examples/spiral.cpp: the host backend; examples/
// spiral_cuda.cu: the CUDA backend): a 4-stage pipeline learns to tell apart the arms of a noisy
// three-armed spiral, a classic problem that no linear model solves, so the accuracy shows that
// the network really learned. At the end it traces one step and draws its timeline (one row per
// device, the GPipe fill-drain staircase) into an SVG file in the current directory.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <gpipe/core.hpp>
#include <gpipe/io/svg_timeline.hpp>
#include <numbers>
#include <string>
#include <thread>
#include <vector>

namespace spiral {

constexpr std::size_t classes = 3;

using Model = gpipe::Pipeline<
    gpipe::Stage<gpipe::Linear<2, 64>, gpipe::GELU>,
    gpipe::Stage<gpipe::Linear<64, 64>, gpipe::GELU, gpipe::LayerNorm<64>>,
    gpipe::Stage<gpipe::Residual<gpipe::Linear<64, 64>, gpipe::GELU, gpipe::Linear<64, 64>>,
                 gpipe::LayerNorm<64>>,
    gpipe::Stage<gpipe::Linear<64, 32>, gpipe::ReLU, gpipe::Linear<32, classes>>>;

struct Dataset {
  std::vector<float> x;         // (n, 2)
  std::vector<std::int32_t> y;  // (n)
};

// n points per arm; arm c winds from the centre outwards, rotated by 2 pi c / 3, with noise.
inline Dataset make_spiral(std::size_t per_class, std::uint64_t seed) {
  gpipe::Rng rng(seed);
  Dataset d;
  for (std::size_t i = 0; i < per_class; ++i) {
    for (std::size_t c = 0; c < classes; ++c) {
      const float r = static_cast<float>(i + 1) / static_cast<float>(per_class);
      const float angle = 10.0f * r +
                          2.0f * std::numbers::pi_v<float> * static_cast<float>(c) / classes +
                          rng.uniform(-0.3f, 0.3f);
      d.x.push_back(r * std::cos(angle));
      d.x.push_back(r * std::sin(angle));
      d.y.push_back(static_cast<std::int32_t>(c));
    }
  }
  return d;
}

// A mini-batch of `batch` points drawn from `data` with replacement, in the order of `order`.
inline void sample(const Dataset& data, std::size_t batch, gpipe::Rng& order, Dataset& out) {
  out.x.resize(batch * 2);
  out.y.resize(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    const std::size_t j = order.next_u64() % data.y.size();
    out.x[2 * i] = data.x[2 * j];
    out.x[2 * i + 1] = data.x[2 * j + 1];
    out.y[i] = data.y[j];
  }
}

// Fraction of points whose largest logit is their arm.
template <class Trainer>
double accuracy(Trainer& trainer, const Dataset& data) {
  const std::vector<float> logits = trainer.predict(data.x);
  std::size_t correct = 0;
  for (std::size_t i = 0; i < data.y.size(); ++i) {
    std::size_t best = 0;
    for (std::size_t j = 1; j < classes; ++j)
      if (logits[i * classes + j] > logits[i * classes + best]) best = j;
    correct += best == static_cast<std::size_t>(data.y[i]);
  }
  return static_cast<double>(correct) / static_cast<double>(data.y.size());
}

struct Options {
  int steps = 400;
  std::size_t micro_batches = 8;
};

// Options from the command line ([steps] [micro_batches]); false after a usage message.
inline bool parse(int argc, char** argv, Options& options) {
  if (argc > 1) options.steps = std::atoi(argv[1]);
  if (argc > 2) options.micro_batches = std::strtoul(argv[2], nullptr, 10);
  if (options.steps <= 0 || options.micro_batches == 0) {
    std::fprintf(stderr, "usage: %s [steps > 0] [micro_batches > 0]\n", argv[0]);
    return false;
  }
  return true;
}

// Trains on `backend` (Model::num_stages devices, described by `devices`, e.g. "host devices"),
// prints the progress, writes `timeline` (an SVG file); 0 when the test accuracy exceeds 90%.
template <class Backend>
int train(Backend& backend, const std::string& devices, const Options& options,
          const std::string& timeline) {
  const Dataset train_set = make_spiral(400, 1), test_set = make_spiral(200, 2);
  const std::size_t batch = 240;
  const int steps = options.steps;
  const std::size_t micro_batches = options.micro_batches;

  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, Backend> trainer(
      backend, {.micro_batches = micro_batches, .remat = gpipe::Remat::except_last, .seed = 42});
  gpipe::optim::AdamW optimizer({.lr = 3e-3, .weight_decay = 1e-4});

  const auto sim = gpipe::simulate(trainer.schedule());
  std::printf(
      "gpipe spiral: %zu stages on %zu %s, %zu parameters, batch %zu in %zu micro-batches\n",
      Model::num_stages, backend.num_devices(), devices.c_str(), Model::num_params, batch,
      micro_batches);
  std::printf(
      "schedule: GPipe fill-drain, simulated bubble %.1f%% (theory (K-1)/(M+K-1) = "
      "%.1f%%)\n",
      100 * sim.bubble_fraction,
      100.0 * (Model::num_stages - 1) / (micro_batches + Model::num_stages - 1));
  std::printf("accuracy before training: %.1f%% (chance: 33.3%%)\n",
              100 * accuracy(trainer, test_set));

  const auto start = std::chrono::steady_clock::now();
  Dataset mini_batch;
  gpipe::Rng order(7);
  double running = 0;
  // 3e-3 decayed to 0 along half a cosine over the run, no warmup
  const gpipe::optim::WarmupCosine lr(
      {.max_lr = 3e-3, .min_lr = 0, .total_steps = static_cast<std::size_t>(steps)});
  for (int step = 1; step <= steps; ++step) {
    sample(train_set, batch, order, mini_batch);
    optimizer.options.lr = lr(static_cast<std::size_t>(step));
    trainer.zero_grad();
    const float loss = trainer.forward_backward(mini_batch.x, mini_batch.y);
    trainer.step(optimizer);
    running = step == 1 ? loss : 0.9 * running + 0.1 * loss;
    if (step % 50 == 0 || step == 1)
      std::printf("step %4d  loss %.4f  (smoothed %.4f)  measured bubble %.1f%%\n", step, loss,
                  running, 100 * trainer.last_step().bubble_fraction);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double acc = accuracy(trainer, test_set);
  std::printf("trained %d steps in %.1f s (%.0f samples/s)\n", steps, seconds,
              steps * static_cast<double>(batch) / seconds);
  std::printf("test accuracy: %.1f%% on %zu held-out points\n", 100 * acc, test_set.y.size());
  // Why the measured bubble exceeds the schedule's: the stages' ops differ in length (stage 0
  // is one small Linear), and this model's ops last microseconds, about what the executor adds
  // to each (hand-overs between devices, workers waking up).
  const auto why = trainer.bubble_breakdown();
  std::printf(
      "last step: measured bubble %.1f%% = the schedule's %.1f%% + %.1f%% uneven stages + %.1f%% "
      "executor overhead\n",
      100 * why.measured, 100 * why.schedule, 100 * why.imbalance, 100 * why.overhead);
  std::printf("  mean op per device (us):");
  for (const double us : why.device_op_us) std::printf(" %.0f", us);
  std::printf(" (the schedule's figure holds for ops of a millisecond or more)\n");
  if (why.devices_share_cores)
    std::printf("note: %zu devices computed on %u hardware threads: they took turns on cores\n",
                why.busy_devices, std::thread::hardware_concurrency());
  // One more step, traced, drawn as a timeline.
  backend.set_tracing(true);
  trainer.zero_grad();
  trainer.forward_backward(mini_batch.x, mini_batch.y);
  backend.set_tracing(false);
  const auto events = backend.take_trace();
  gpipe::io::write_svg_timeline(timeline, events,
                                {.title = "example_spiral on " + devices + ": one training step",
                                 .num_devices = backend.num_devices()});
  std::printf("timeline of one step (%zu ops, measured bubble %.1f%%) written to %s\n",
              events.size(), 100 * trainer.last_step().bubble_fraction, timeline.c_str());
  std::printf("peak memory per device (bytes):");
  for (std::size_t d = 0; d < backend.num_devices(); ++d)
    std::printf(" %zu", backend.memory_stats(d).peak);
  std::printf("\n");
  return acc > 0.9 ? 0 : 1;
}

}  // namespace spiral
