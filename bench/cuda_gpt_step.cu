// One training step (forward_backward, then an AdamW step) of a GPT-2-shaped model on the CUDA
// backend: V = 50304, T = 256, D = 768, H = 12, 4 blocks, LM head tied to the token embedding,
// batch 8 samples (2048 tokens); K in {1, 2, 4} stages on K virtual devices of GPU 0, M in {1, 4}
// micro-batches, 1F1B; in Fp32, and at K = 1, 2 in MixedBf16 (rows /bf16). Reported: time per step
// (host clock around it; every step ends in the backend's synchronize), tokens/s and peak memory.
// The attention kernels are the untuned per-row ones of gpipe/backend/cuda/layers/attention.cuh; on
// one GPU K > 1 shows the cost of the pipeline machinery, not a speed-up.
//
//   build/<preset>/bench/bench_cuda_gpt_step --benchmark_min_time=0.05
//
// (On the CUDA emulator, where the tests run it once, the model is tiny: sized()'s second
// arguments.)

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/cuda.cuh"
#include "support/cuda.cuh"

namespace {

using gpipe::bench::sized;
constexpr std::size_t V = sized<std::size_t>(50304, 64), T = sized<std::size_t>(256, 8);
constexpr std::size_t D = sized<std::size_t>(768, 16), H = sized<std::size_t>(12, 2);
constexpr std::size_t samples = sized<std::size_t>(8, 4);

using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Norm = gpipe::LayerNorm<D>;
using Head = gpipe::Linear<D, V, false>;
using Model1 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, Block, Norm, Head>>;
using Model2 =
    gpipe::Pipeline<gpipe::Stage<Emb, Block, Block>, gpipe::Stage<Block, Block, Norm, Head>>;
using Model4 = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block>, gpipe::Stage<Block>,
                               gpipe::Stage<Block, Norm, Head>>;

template <class Model, class Precision = gpipe::Fp32>
void BM_gpt_step(benchmark::State& state) {
  const auto M = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t K = Model::num_stages;
  gpipe::cuda::Backend backend(K, {.gpus = std::vector<int>(K, 0)});
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::cuda::Backend, gpipe::OneFOneB,
                 Precision>
      trainer(backend, {.micro_batches = M,
                        .seed = 1,
                        .ties = {{.parameter = "6.weight", .to = "0.wte.weight"}}});
  gpipe::Rng rng(2);
  std::vector<std::int32_t> x(samples * T), y(samples * T);
  for (auto& t : x) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (auto& t : y) t = static_cast<std::int32_t>(rng.next_u64() % V);
  const gpipe::optim::AdamW adamw({.lr = 1e-4});
  auto step = [&] {
    trainer.zero_grad();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    trainer.step(adamw);
  };
  step();  // warm-up
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
  state.counters["tokens/s"] = static_cast<double>(samples * T) / per_step;
  std::size_t peak = 0;
  for (std::size_t d = 0; d < K; ++d) peak += backend.memory_stats(d).peak;
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
}

void arguments(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {1, 4}) b->Args({m});
  b->ArgNames({"M"});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_gpt_step<Model1>)->Name("gpt_step/K:1")->Apply(arguments);
BENCHMARK(BM_gpt_step<Model2>)->Name("gpt_step/K:2")->Apply(arguments);
BENCHMARK(BM_gpt_step<Model4>)->Name("gpt_step/K:4")->Apply(arguments);
// gpipe::MixedBf16: bf16 activations and cuBLAS bf16 GEMMs (tensor cores), fp32 master weights
BENCHMARK(BM_gpt_step<Model1, gpipe::MixedBf16>)->Name("gpt_step/K:1/bf16")->Apply(arguments);
BENCHMARK(BM_gpt_step<Model2, gpipe::MixedBf16>)->Name("gpt_step/K:2/bf16")->Apply(arguments);

}  // namespace

int main(int argc, char** argv) { return gpipe::bench::cuda_benchmark_main(argc, argv); }
