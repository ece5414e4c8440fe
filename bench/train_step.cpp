// Training throughput of a real model on the host backend versus stages K and micro-batches M:
// the shape of GPipe's Table 2 (speedup rises with M) on a CPU, where each device is a worker
// thread with a one-thread BLAS. The model: 8 residual MLP blocks of width 256 (y = x +
// W2 gelu(W1 x)), split into K stages of 8/K blocks; batch 512, AdamW; a step is forward_backward
// plus the optimizer update.
//   samples_per_s   mini-batch rows per second
//   speedup         samples_per_s / that of K = 1, M = 1 (the unpipelined model) in this run
//   bubble          the trainer's measured bubble of the last step
// On this machine's 2 cores, K > 2 cannot run faster than K = 2: more devices than cores share
// them, which the numbers show.

#include <benchmark/benchmark.h>

#include <chrono>
#include <gpipe/gpipe.hpp>
#include <vector>

#include "support/uniform.hpp"

namespace {

constexpr std::size_t width = 256, rows = 512, blocks = 8;
using Block =
    gpipe::Residual<gpipe::Linear<width, width>, gpipe::GELU, gpipe::Linear<width, width>>;

double baseline = 0;  // samples/s of K = 1, M = 1, which runs first

template <std::size_t K>
void BM_TrainStep(benchmark::State& state) {
  using Model = gpipe::bench::uniform_pipeline_t<K, blocks / K, Block>;
  const auto m = static_cast<std::size_t>(state.range(1));
  gpipe::host::Backend backend(K);
  gpipe::Trainer<Model, gpipe::MSELoss, gpipe::host::Backend> trainer(
      backend, {.micro_batches = m, .seed = 1});
  gpipe::Rng rng(2);
  std::vector<float> x(rows * width), y(rows * width);
  for (float& v : x) v = rng.uniform(-1, 1);
  for (float& v : y) v = rng.uniform(-1, 1);
  const gpipe::optim::AdamW optimizer({.lr = 1e-4});
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    trainer.zero_grad();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    trainer.step(optimizer);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double rate = static_cast<double>(rows * state.iterations()) / seconds;
  if (K == 1 && m == 1) baseline = rate;
  state.counters["samples_per_s"] = rate;
  if (baseline > 0) state.counters["speedup"] = rate / baseline;
  state.counters["bubble"] = trainer.last_step().bubble_fraction;
}

void register_all() {
  auto add = [](auto fn, long k) {
    benchmark::RegisterBenchmark("BM_TrainStep", fn)
        ->ArgNames({"K", "M"})
        ->ArgsProduct({{k}, {1, 2, 4, 8, 16, 32}})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(0.5);
  };
  add(BM_TrainStep<1>, 1);
  add(BM_TrainStep<2>, 2);
  add(BM_TrainStep<4>, 4);
}

[[maybe_unused]] const bool registered = (register_all(), true);

}  // namespace
