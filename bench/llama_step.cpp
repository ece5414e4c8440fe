// One training step of a small Llama (README's shapes) on the host backend, in tokens per
// second, for K = 1 and 2 stages, in Fp32 and MixedBf16 (1F1B).
//   model   V = 32000, T = 256, D = 512, H = 8 heads on KVH = 2 key/value heads, F = 1408, 4
//           LlamaBlocks; batch 8 samples (2048 tokens); TokenEmbedding, 4 blocks, RMSNorm, a
//           bias-free LM head
//   step    zero_grad + forward_backward (no optimizer update)
//   splits  K = 1: everything on one device; K = 2: gpipe::balanced_pipeline_t's cut (the head,
//           about four blocks' worth of GEMM, with the final norm)
// Counters: tokens_per_s, step_ms, gflop_per_s (the step's FLOPs as gpipe::layer_cost counts
// them, per second), speedup (against K = 1, M = 1, Fp32, of this run), bubble.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <gpipe/gpipe.hpp>
#include <type_traits>
#include <vector>

namespace {

constexpr std::size_t V = 32000, T = 256, D = 512, H = 8, KVH = 2, F = 1408, samples = 8;
using Emb = gpipe::TokenEmbedding<V, T, D>;
using Block = gpipe::LlamaBlock<D, H, KVH, F>;
using Norm = gpipe::RMSNorm<D>;
using Head = gpipe::Linear<D, V, false>;

template <std::size_t K>
using Llama = gpipe::balanced_pipeline_t<K, Emb, Block, Block, Block, Block, Norm, Head>;

// FLOPs of one step of the whole batch: every layer's cost per row (gpipe::layer_cost) times the
// rows.
double step_flops() {
  using Bound = gpipe::detail::bind_chain_t<1, T, Emb, Block, Block, Block, Block, Norm, Head>;
  return gpipe::layer_cost<Bound>().total() * static_cast<double>(samples * T);
}

double baseline_ms = 0;

template <std::size_t K, class Precision = gpipe::Fp32>
void BM_LlamaStep(benchmark::State& state) {
  using Model = Llama<K>;
  const auto m = static_cast<std::size_t>(state.range(1));
  gpipe::host::Backend backend(K);
  gpipe::Rng rng(2);
  std::vector<std::int32_t> x(samples * T), y(samples * T);
  for (auto& t : x) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (auto& t : y) t = static_cast<std::int32_t>(rng.next_u64() % V);
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, gpipe::OneFOneB,
                 Precision>
      trainer(backend, {.micro_batches = m, .seed = 1});
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    trainer.zero_grad();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double step_ms = 1e3 * seconds / static_cast<double>(state.iterations());
  if (K == 1 && m == 1 && std::is_same_v<Precision, gpipe::Fp32>) baseline_ms = step_ms;
  state.counters["step_ms"] = step_ms;
  state.counters["tokens_per_s"] = static_cast<double>(samples * T) / (step_ms / 1e3);
  state.counters["gflop_per_s"] = step_flops() / (step_ms / 1e3) / 1e9;
  if (baseline_ms > 0) state.counters["speedup"] = baseline_ms / step_ms;
  state.counters["bubble"] = trainer.last_step().bubble_fraction;
}

void register_all() {
  auto add = [](const char* name, auto bench, std::int64_t k, std::int64_t m) {
    benchmark::RegisterBenchmark(name, bench)
        ->ArgNames({"K", "M"})
        ->Args({k, m})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  add("BM_LlamaStep<1F1B>", BM_LlamaStep<1>, 1, 1);
  add("BM_LlamaStep<1F1B>", BM_LlamaStep<2>, 2, 4);
  add("BM_LlamaStep<1F1B,bf16>", BM_LlamaStep<1, gpipe::MixedBf16>, 1, 1);
  add("BM_LlamaStep<1F1B,bf16>", BM_LlamaStep<2, gpipe::MixedBf16>, 2, 4);
}

[[maybe_unused]] const bool registered = (register_all(), true);

}  // namespace
