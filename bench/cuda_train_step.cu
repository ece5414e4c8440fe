// One training step (forward_backward, then an AdamW step) of a real model on the CUDA backend,
// split into K in {1, 2, 4} stages on K virtual devices of GPU 0, with M in {1, 4, 16}
// micro-batches, GPipe schedule; and K = 4, M = 16 with remat always. The model is an MLP
// trunk of the transformer kind, 68M parameters:
//   Linear<512, 1024>, 8 x Residual<LayerNorm<1024>, Linear<1024, 4096>, GELU,
//   Linear<4096, 1024>>, LayerNorm<1024>, Linear<1024, 1000>; softmax cross-entropy
// on a batch of 2048 rows. Reported: time per step (host clock around it; every step ends in the
// backend's synchronize, so this is the GPUs' time plus what the host adds), samples/s, and the
// model's FLOP rate next to the SGEMM ceiling measured in the same run. On one GPU the stages share
// its SMs, so K > 1 shows the cost of the pipeline machinery (smaller GEMMs per micro-batch,
// transfers, events), not a speed-up.
//
//   build/<preset>/bench/bench_cuda_train_step --benchmark_min_time=0.05
//
// (On the CUDA emulator, where the tests run it once, every width and the batch are much smaller:
// sized()'s second arguments.)

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/cuda.cuh"
#include "support/cuda.cuh"

namespace {

using gpipe::bench::sized;
constexpr std::size_t D = sized<std::size_t>(1024, 64), hidden = sized<std::size_t>(4096, 128);
constexpr std::size_t in_features = sized<std::size_t>(512, 32);
constexpr std::size_t classes = sized<std::size_t>(1000, 50);
constexpr std::size_t batch = sized<std::size_t>(2048, 64);

using In = gpipe::Linear<in_features, D>;
using Block = gpipe::Residual<gpipe::LayerNorm<D>, gpipe::Linear<D, hidden>, gpipe::GELU,
                              gpipe::Linear<hidden, D>>;
using Head = gpipe::Linear<D, classes>;
using Norm = gpipe::LayerNorm<D>;

using Model1 = gpipe::Pipeline<
    gpipe::Stage<In, Block, Block, Block, Block, Block, Block, Block, Block, Norm, Head>>;
using Model2 = gpipe::Pipeline<gpipe::Stage<In, Block, Block, Block, Block>,
                               gpipe::Stage<Block, Block, Block, Block, Norm, Head>>;
using Model4 = gpipe::Pipeline<gpipe::Stage<In, Block, Block>, gpipe::Stage<Block, Block>,
                               gpipe::Stage<Block, Block>, gpipe::Stage<Block, Block, Norm, Head>>;

// Multiply-adds of the Linear layers per row, times 2 (FLOP), times 3 (forward, and the two
// GEMMs of backward).
constexpr double flops_per_row =
    3.0 * 2.0 * (in_features * D + 8.0 * (2.0 * D * hidden) + D * classes);

template <class Model>
void BM_train_step(benchmark::State& state) {
  const auto M = static_cast<std::size_t>(state.range(0));
  const auto remat = state.range(1) != 0 ? gpipe::Remat::always : gpipe::Remat::never;
  constexpr std::size_t K = Model::num_stages;
  gpipe::cuda::Backend backend(K, {.gpus = std::vector<int>(K, 0)});
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::cuda::Backend> trainer(
      backend, {.micro_batches = M, .remat = remat, .seed = 1});
  gpipe::Rng rng(2);
  std::vector<float> x(batch * in_features);
  for (float& v : x) v = rng.uniform(-1, 1);
  std::vector<std::int32_t> y(batch);
  for (auto& c : y) c = static_cast<std::int32_t>(rng.next_u64() % classes);
  const gpipe::optim::AdamW adamw({.lr = 1e-4});

  auto step = [&] {
    trainer.zero_grad();
    const float loss = trainer.forward_backward(x, y);
    trainer.step(adamw);
    benchmark::DoNotOptimize(loss);
  };
  step();  // warm-up: pools, cuBLAS heuristics, staging buffers
  // Each step ends with the backend's synchronize: a host clock around it is the step's time.
  double total_s = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    step();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(s);
    total_s += s;
  }
  const double per_step = total_s / static_cast<double>(state.iterations());
  state.counters["samples/s"] = static_cast<double>(batch) / per_step;
  gpipe::bench::report_flops(state, flops_per_row * batch, per_step);
  std::size_t peak = 0;
  for (std::size_t d = 0; d < K; ++d) peak += backend.memory_stats(d).peak;
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
}

void arguments(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {1, 4, 16}) b->Args({m, 0});
  b->ArgNames({"M", "remat"});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_train_step<Model1>)->Name("train_step/K:1")->Apply(arguments);
BENCHMARK(BM_train_step<Model2>)->Name("train_step/K:2")->Apply(arguments);
BENCHMARK(BM_train_step<Model4>)->Name("train_step/K:4")->Apply(arguments)->Args({16, 1});

}  // namespace

int main(int argc, char** argv) { return gpipe::bench::cuda_benchmark_main(argc, argv); }
