// One training step (forward_backward, then an AdamW step) of GPT-2-shaped models on the CUDA
// backend, LM head tied to the token embedding, 1F1B, K stages on K virtual devices of GPU 0:
//   gpt_step/...       V 50304, T 256, D 768, H 12, 4 blocks, 8 samples a step (2048 tokens);
//                      K in {1, 2, 4}, M in {1, 4}; Fp32, and MixedBf16 at K = 1, 2 (/bf16)
//   gpt2_124M/...      GPT-2 124M as llm.c's train_gpt2cu -e d12 -b 16 -t 1024 trains it: 12
//                      blocks, T 1024, 16 samples a step (16384 tokens); K 1 (M 1) and K 4 (M 8);
//                      MixedBf16 and Fp32
//   gpt2_124M/block/... one Transformer block's launches and bytes: the launch records of a
//                      1-block and a 2-block GPT-2 124M step (M 1) subtracted
//   gpt2_124M/K:4/bf16/offload/... K 4 (M 8, 16, graphs on) under Remat::offload: each stash to
//                      pinned host memory and back over the copy stream (the step's time against
//                      never's, and its device peak)
// Rows with graphs:1 replay each step from a CUDA graph (BackendOptions::graphs: captured on the
// second step, launched from the third), graphs:0 issue every op: on the dry run their times are
// the host's cost of issuing a step either way.
// Reported: time per step (host clock around it; every step ends in the backend's synchronize),
// tokens/s, MFU (llm.c's FLOPs per token against the GPU's dense bf16 peak: support/mfu.hpp; 0
// where the GPU is not in its table), peak memory (all K virtual devices together), the largest
// device's activation peak (act_MiB) and under offload the pinned host memory (host_MiB). From the
// launch records of one step (gpipe::cuda::LaunchRecorder; support/roofline.hpp): launches, the
// bytes outside GEMMs per token beside the ideal (ideal_B/token), and the step an H200's
// roofline predicts (pred_ms, pred_MFU_%); each row also prints its kernels once. The
// attention kernels are the first, SIMT flash attention ones of
// gpipe/backend/cuda/kernels/attention.cuh (no tensor cores yet); on one GPU K > 1 shows the cost
// of the pipeline machinery, not a speed-up.
//
//   build/<preset>/bench/bench_cuda_gpt_step --benchmark_min_time=0.05
//
// (On the CUDA emulator, where the tests run it once, the models are tiny: sized()'s second
// arguments; bench_cuda_gpt_step_dry_run is this program at full size on the emulator's dry run,
// which records every launch and runs none: the predictions without a GPU.)

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "gpipe/cuda.cuh"
#include "support/cuda.cuh"
#include "support/mfu.hpp"
#include "support/roofline.hpp"

namespace {

using gpipe::bench::sized;
constexpr std::size_t V = sized<std::size_t>(50304, 64), D = sized<std::size_t>(768, 16);
constexpr std::size_t H = sized<std::size_t>(12, 2);

using Block = gpipe::TransformerBlock<D, H>;
using Norm = gpipe::LayerNorm<D>;
using Head = gpipe::Linear<D, V, false>;

// 4 blocks, T 256, 8 samples.
constexpr std::size_t T = sized<std::size_t>(256, 8), samples = sized<std::size_t>(8, 4);
using Emb = gpipe::Embedding<V, T, D>;
using Model1 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, Block, Norm, Head>>;
using Model2 =
    gpipe::Pipeline<gpipe::Stage<Emb, Block, Block>, gpipe::Stage<Block, Block, Norm, Head>>;
using Model4 = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block>, gpipe::Stage<Block>,
                               gpipe::Stage<Block, Norm, Head>>;

// GPT-2 124M: 12 blocks, T 1024, 16 samples.
constexpr std::size_t T124 = sized<std::size_t>(1024, 8), samples124 = sized<std::size_t>(16, 8);
using Emb124 = gpipe::Embedding<V, T124, D>;
using Model124_1 =
    gpipe::Pipeline<gpipe::Stage<Emb124, Block, Block, Block, Block, Block, Block, Block, Block,
                                 Block, Block, Block, Block, Norm, Head>>;
using Model124_4 =
    gpipe::Pipeline<gpipe::Stage<Emb124, Block, Block, Block>, gpipe::Stage<Block, Block, Block>,
                    gpipe::Stage<Block, Block, Block>,
                    gpipe::Stage<Block, Block, Block, Norm, Head>>;

// GPT-2 124M's width with 1 and 2 blocks (one block's launches by difference).
using Model124_b1 = gpipe::Pipeline<gpipe::Stage<Emb124, Block, Norm, Head>>;
using Model124_b2 = gpipe::Pipeline<gpipe::Stage<Emb124, Block, Block, Norm, Head>>;

// A model's step: its token count per sample and per step, blocks (for the FLOP count), the
// name of the head's weight in nn.Sequential (tied to the embedding's).
template <std::size_t Tokens, std::size_t Samples, std::size_t Blocks>
struct Shape {
  static constexpr std::size_t tokens = Tokens, samples = Samples, blocks = Blocks;
  static std::string head_weight() { return std::to_string(Blocks + 2) + ".weight"; }
};
using Small = Shape<T, samples, 4>;
using Gpt2_124M = Shape<T124, samples124, 12>;
using Gpt2_124M_b1 = Shape<T124, samples124, 1>;
using Gpt2_124M_b2 = Shape<T124, samples124, 2>;

// A trainer of Model on K = its stages virtual devices of GPU 0, its head tied to the embedding,
// and a step on random tokens (zero_grad, forward_backward, AdamW).
template <class Model, class S, class Precision, gpipe::Remat R = gpipe::Remat::never>
struct StepRun {
  static constexpr std::size_t K = Model::num_stages;
  gpipe::cuda::Backend backend;
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::cuda::Backend, gpipe::OneFOneB,
                 Precision>
      trainer;
  std::vector<std::int32_t> x = tokens(2), y = tokens(3);
  gpipe::optim::AdamW adamw{{.lr = 1e-4}};

  explicit StepRun(std::size_t M, bool graphs = true)
      : backend(K, {.gpus = std::vector<int>(K, 0), .graphs = graphs}),
        trainer(backend, {.micro_batches = M,
                          .remat = R,
                          .seed = 1,
                          .ties = {{.parameter = S::head_weight(), .to = "0.wte.weight"}}}) {}
  static std::vector<std::int32_t> tokens(std::uint64_t seed) {
    gpipe::Rng rng(seed);
    std::vector<std::int32_t> t(S::samples * S::tokens);
    for (auto& id : t) id = static_cast<std::int32_t>(rng.next_u64() % V);
    return t;
  }
  void step() {
    trainer.zero_grad();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    trainer.step(adamw);
  }
  // The launch records of one step, summed and priced.
  gpipe::bench::StepRecords recorded_step() {
    gpipe::cuda::LaunchRecorder recorder;
    step();
    return gpipe::bench::summarize(recorder.records());
  }
};

// Whether `title` has not printed its kernels yet (Google Benchmark may run a row more than once).
bool first_print(const std::string& title) {
  static std::mutex mutex;
  static std::set<std::string> printed;
  std::lock_guard lock(mutex);
  return printed.insert(title).second;
}

template <class Model, class S = Small, class Precision = gpipe::Fp32,
          gpipe::Remat R = gpipe::Remat::never>
void BM_gpt_step(benchmark::State& state) {
  const auto M = static_cast<std::size_t>(state.range(0));
  const bool graphs = state.range(1) != 0;
  constexpr std::size_t K = Model::num_stages;
  StepRun<Model, S, Precision, R> run(M, graphs);
  run.step();  // warm-up (and with graphs the step before the capture)
  const gpipe::bench::StepRecords records = run.recorded_step();  // with graphs: the capture
  double total_s = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    run.step();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(s);
    total_s += s;
  }
  const double per_step = total_s / static_cast<double>(state.iterations());
  const auto tokens = static_cast<double>(S::samples * S::tokens);
  const double tokens_per_s = tokens / per_step;
  cudaDeviceProp prop{};
  GPIPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double peak_flops = gpipe::bench::bf16_dense_peak_tflops(prop.name) * 1e12;
  // the parameters counted once: all but the tied head's
  constexpr std::size_t N = Model::num_params - Head::num_params;
  const double flops_per_token = gpipe::bench::gpt_flops_per_token(N, S::blocks, D, S::tokens);
  if (!gpipe::bench::dry_run()) {  // (a dry run's time is the host's alone)
    state.counters["tokens/s"] = tokens_per_s;
    state.counters["MFU_%"] =
        peak_flops > 0 ? 100 * tokens_per_s * flops_per_token / peak_flops : 0;
  }
  std::size_t peak = 0;
  std::size_t host = 0, activations = 0;  // the largest device's activation peak
  for (std::size_t d = 0; d < K; ++d) {
    const gpipe::MemoryStats stats = run.backend.memory_stats(d);
    peak += stats.peak;
    activations = std::max(activations, stats.peak_of(gpipe::MemoryKind::activations));
    host += run.backend.host_memory_stats(d).peak;
  }
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
  state.counters["act_MiB"] = static_cast<double>(activations) / (1 << 20);
  if (R == gpipe::Remat::offload)
    state.counters["host_MiB"] = static_cast<double>(host) / (1 << 20);
  state.counters["graph_launches"] = static_cast<double>(run.backend.graph_launches());
  // the launch records' step, beside the ideal and priced on an H200
  state.counters["launches"] = static_cast<double>(records.launches);
  state.counters["other_B/token"] = records.other_bytes / tokens;
  state.counters["ideal_B/token"] =
      gpipe::bench::gpt_ideal_other_bytes_per_token(S::blocks, D, V, N, S::samples * S::tokens);
  state.counters["pred_ms"] = 1e3 * records.predicted_s();
  state.counters["pred_MFU_%"] = 100 * tokens * flops_per_token / records.predicted_s() /
                                 gpipe::bench::Roofline{}.tensor_flops;
  if (graphs && run.backend.graph_launches() == 0)
    state.SetLabel("no graph: " + run.backend.graph_refusal());
  const std::string title = std::to_string(S::blocks) + " blocks, T " + std::to_string(S::tokens) +
                            ", K " + std::to_string(K) + ", M " + std::to_string(M) +
                            (std::is_same_v<Precision, gpipe::MixedBf16> ? ", bf16" : ", fp32");
  if (first_print(title)) gpipe::bench::print_step_records(title, records);
}

// One Transformer block's launches and bytes outside GEMMs per micro-batch of GPT-2 124M: the
// records of a 2-block and a 1-block step (M 1) subtracted; ideal_B/token: the block's share of
// support/roofline.hpp's ideal.
template <class Precision>
void BM_block_records(benchmark::State& state) {
  static_assert(Gpt2_124M_b2::blocks == Gpt2_124M_b1::blocks + 1, "one block apart");
  StepRun<Model124_b1, Gpt2_124M_b1, Precision> one(1);
  StepRun<Model124_b2, Gpt2_124M_b2, Precision> two(1);
  one.step();
  two.step();
  gpipe::bench::StepRecords r1, r2;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    r1 = one.recorded_step();
    r2 = two.recorded_step();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const auto tokens = static_cast<double>(Gpt2_124M::samples * Gpt2_124M::tokens);
  state.counters["launches/block"] = static_cast<double>(r2.launches - r1.launches);
  state.counters["other_B/token/block"] = (r2.other_bytes - r1.other_bytes) / tokens;
  state.counters["ideal_B/token/block"] = 54.0 * D * 2;
  state.counters["pred_ms/block"] = 1e3 * (r2.predicted_s() - r1.predicted_s());
}

void arguments(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {1, 4})
    for (std::int64_t graphs : {0, 1}) b->Args({m, graphs});
  b->ArgNames({"M", "graphs"});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_gpt_step<Model1>)->Name("gpt_step/K:1")->Apply(arguments);
BENCHMARK(BM_gpt_step<Model2>)->Name("gpt_step/K:2")->Apply(arguments);
BENCHMARK(BM_gpt_step<Model4>)->Name("gpt_step/K:4")->Apply(arguments);
// gpipe::MixedBf16: bf16 activations and cuBLAS bf16 GEMMs (tensor cores), fp32 master weights
BENCHMARK(BM_gpt_step<Model1, Small, gpipe::MixedBf16>)
    ->Name("gpt_step/K:1/bf16")
    ->Apply(arguments);
BENCHMARK(BM_gpt_step<Model2, Small, gpipe::MixedBf16>)
    ->Name("gpt_step/K:2/bf16")
    ->Apply(arguments);

// GPT-2 124M beside llm.c (scripts/gpu-check runs both in one call).
void one_micro_batch(benchmark::internal::Benchmark* b) {
  b->Args({1, 1})->ArgNames({"M", "graphs"})->UseManualTime()->Unit(benchmark::kMillisecond);
}
// K 4 with M 8 and 16, graphs off and on (the issue cost of 4x the ops of K 1's step)
void many_micro_batches(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {8, 16})
    for (std::int64_t graphs : {0, 1})
      if (static_cast<std::size_t>(m) <= samples124) b->Args({m, graphs});
  b->ArgNames({"M", "graphs"})->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_gpt_step<Model124_1, Gpt2_124M, gpipe::MixedBf16>)
    ->Name("gpt2_124M/K:1/bf16")
    ->Apply(one_micro_batch);
BENCHMARK(BM_gpt_step<Model124_4, Gpt2_124M, gpipe::MixedBf16>)
    ->Name("gpt2_124M/K:4/bf16")
    ->Apply(many_micro_batches);
// K 4 under Remat::offload, graphs on, beside the rows above (never)
void offload_rows(benchmark::internal::Benchmark* b) {
  for (std::int64_t m : {8, 16})
    if (static_cast<std::size_t>(m) <= samples124) b->Args({m, 1});
  b->ArgNames({"M", "graphs"})->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_gpt_step<Model124_4, Gpt2_124M, gpipe::MixedBf16, gpipe::Remat::offload>)
    ->Name("gpt2_124M/K:4/bf16/offload")
    ->Apply(offload_rows);
BENCHMARK(BM_block_records<gpipe::MixedBf16>)
    ->Name("gpt2_124M/block/bf16")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK(BM_gpt_step<Model124_1, Gpt2_124M>)->Name("gpt2_124M/K:1")->Apply(one_micro_batch);
BENCHMARK(BM_gpt_step<Model124_4, Gpt2_124M>)->Name("gpt2_124M/K:4")->Apply(many_micro_batches);

}  // namespace

int main(int argc, char** argv) { return gpipe::bench::cuda_benchmark_main(argc, argv); }
