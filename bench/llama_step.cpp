// One training step of a small Llama on the host backend, in tokens per second (1F1B).
// bench/pytorch_llama_step.py is PyTorch's side of the same model and step, and
// `scripts/bench-vs-pytorch --model llama` runs the two in alternating rounds.
//   model   V = 32000, T = 256, D = 384, H = 6 heads on KVH = 2 key/value heads, F = 1024, 6
//           LlamaBlocks; batch 8 samples (2048 tokens); TokenEmbedding, 6 blocks, RMSNorm, a
//           bias-free LM head
//   step    zero_grad + forward_backward (no optimizer update)
//   splits  K = 1: everything on one device; K = 2: gpipe::balanced_pipeline_t's cut (the head,
//           about as many FLOPs as the six blocks, with the final norm)
//   threads K = 1, threads:2: the one device's large kernels split over two threads
//           (host::BackendOptions::threads_per_device)
//   docs    docs:N rows pack N documents into each sample (borders at T j / N, j = 1 .. N - 1:
//           attention masked at the borders, positions restarting), docs:1 rows none; the same
//           step otherwise, so their ratio is packing's cost
// precision: rows named BM_LlamaStep<1F1B,bf16> train in gpipe::MixedBf16
// warm-up: --warmup_steps=N (default 1) untimed steps before the timed ones in each run, as
//           bench/pytorch_llama_step.py does; the CTest smoke test passes 0.
// Counters: tokens_per_s, step_ms, gflop_per_s (the step's FLOPs as gpipe::layer_cost counts
// them, per second), speedup (against K = 1, M = 1, one thread, Fp32, no documents, of this run),
// bubble.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <gpipe/gpipe.hpp>
#include <type_traits>
#include <vector>

#include "support/warmup_steps.hpp"

namespace {

constexpr std::size_t V = 32000, T = 256, D = 384, H = 6, KVH = 2, F = 1024, samples = 8;
using Emb = gpipe::TokenEmbedding<V, T, D>;
using Block = gpipe::LlamaBlock<D, H, KVH, F>;
using Norm = gpipe::RMSNorm<D>;
using Head = gpipe::Linear<D, V, false>;

template <std::size_t K>
using Llama =
    gpipe::balanced_pipeline_t<K, Emb, Block, Block, Block, Block, Block, Block, Norm, Head>;

// FLOPs of one step of the whole batch: every layer's cost per row (gpipe::layer_cost) times the
// rows.
double step_flops() {
  using Bound =
      gpipe::detail::bind_chain_t<1, T, Emb, Block, Block, Block, Block, Block, Block, Norm, Head>;
  return gpipe::layer_cost<Bound>().total() * static_cast<double>(samples * T);
}

// Each token's document for `documents` documents a sample, borders at T j / documents.
std::vector<std::int32_t> document_ids(std::size_t documents) {
  std::vector<std::int32_t> ids(samples * T);
  for (std::size_t r = 0; r < ids.size(); ++r)
    ids[r] = static_cast<std::int32_t>((r / T) * documents + (r % T) * documents / T);
  return ids;
}

double baseline_ms = 0;  // K = 1, M = 1, one thread, Fp32, no documents: registered first
long warmup_steps = 1;   // --warmup_steps

template <std::size_t K, class Precision = gpipe::Fp32>
void BM_LlamaStep(benchmark::State& state) {
  using Model = Llama<K>;
  const auto m = static_cast<std::size_t>(state.range(1));
  const auto threads = static_cast<std::size_t>(state.range(2));
  const auto documents = static_cast<std::size_t>(state.range(3));
  gpipe::host::Backend backend(K, {.threads_per_device = threads});
  gpipe::Rng rng(2);
  std::vector<std::int32_t> x(samples * T), y(samples * T);
  for (auto& t : x) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (auto& t : y) t = static_cast<std::int32_t>(rng.next_u64() % V);
  const std::vector<std::int32_t> ids = document_ids(documents);
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, gpipe::OneFOneB,
                 Precision>
      trainer(backend, {.micro_batches = m, .seed = 1});
  const auto step = [&] {
    trainer.zero_grad();
    return documents > 1 ? trainer.forward_backward(x, y, ids) : trainer.forward_backward(x, y);
  };
  for (long i = 0; i < warmup_steps; ++i) benchmark::DoNotOptimize(step());
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(step());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double step_ms = 1e3 * seconds / static_cast<double>(state.iterations());
  if (K == 1 && m == 1 && threads == 1 && documents == 1 && std::is_same_v<Precision, gpipe::Fp32>)
    baseline_ms = step_ms;
  state.counters["step_ms"] = step_ms;
  state.counters["tokens_per_s"] = static_cast<double>(samples * T) / (step_ms / 1e3);
  state.counters["gflop_per_s"] = step_flops() / (step_ms / 1e3) / 1e9;
  if (baseline_ms > 0) state.counters["speedup"] = baseline_ms / step_ms;
  state.counters["bubble"] = trainer.last_step().bubble_fraction;
}

void register_all() {
  auto add = [](const char* name, auto bench, std::int64_t k, std::int64_t m, std::int64_t threads,
                std::int64_t documents) {
    benchmark::RegisterBenchmark(name, bench)
        ->ArgNames({"K", "M", "threads", "docs"})
        ->Args({k, m, threads, documents})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  add("BM_LlamaStep<1F1B>", BM_LlamaStep<1>, 1, 1, 1, 1);
  add("BM_LlamaStep<1F1B>", BM_LlamaStep<1>, 1, 1, 1, 4);
  add("BM_LlamaStep<1F1B>", BM_LlamaStep<1>, 1, 1, 2, 1);
  add("BM_LlamaStep<1F1B>", BM_LlamaStep<2>, 2, 4, 1, 1);
  add("BM_LlamaStep<1F1B>", BM_LlamaStep<2>, 2, 4, 1, 4);
  add("BM_LlamaStep<1F1B,bf16>", BM_LlamaStep<1, gpipe::MixedBf16>, 1, 1, 1, 1);
  add("BM_LlamaStep<1F1B,bf16>", BM_LlamaStep<2, gpipe::MixedBf16>, 2, 4, 1, 1);
}

[[maybe_unused]] const bool registered = (register_all(), true);

}  // namespace

// --warmup_steps=N (support/warmup_steps.hpp).
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  return gpipe::bench::take_warmup_steps(argc, argv, "bench_llama_step", warmup_steps);
}
