// A training run's step of bench_gpt_step's GPT on 2 MPI ranks (K = 2: [embedding, 4 blocks]
// [LayerNorm, head], 1F1B, a rank per stage): zero_grad, forward_backward, clip_grad_norm (a
// max_norm that always clips), AdamW; the GPT with GPT-2's tie (bias-free head tied to the token
// embedding, across the two ranks) and without it. Then a checkpoint of the tied model with its
// AdamW state: seconds and bytes that each rank writes.
// With --replicas=R (world 2R) the pipeline runs as R data-parallel replicas, each on 8 samples,
// and --shard_optimizer shards AdamW's state over them (ZeRO-1); counters then add state_MB (rank
// 0's optimizer state) and, from the last step's merged trace, sums_ms (the gradient sums over
// the replicas, mean per rank) and sums_hidden (their share that ran before the pipeline's last
// compute op ended: overlapped with the other stages' backward).
// Usage: mpirun -n 2R bench_mpi_gpt_step [--steps=3] [--checkpoint_dir=DIR] [--replicas=R]
//          [--shard_optimizer] [Google Benchmark flags]
// Counters: step_ms (Trainer::last_step_seconds: the step over both ranks, from the first
// forward_backward to the last rank's end of step()), tokens_per_s, clip_share (clip_grad_norm's
// time over the step's; with ties the step includes their gradient exchange, so the tied row
// against the untied one gives the tie's share); checkpoint: save_s, rank0_MB and rank1_MB (each
// rank's shard), index_KB.

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <gpipe/gpipe.hpp>
#include <gpipe/mpi.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/mpi_flags.hpp"

namespace {

constexpr std::size_t V = 50304, T = 256, D = 768, H = 12, samples_per_replica = 8;
using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Norm = gpipe::LayerNorm<D>;
template <bool Tied>
using Gpt = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, Block>,
                            gpipe::Stage<Norm, gpipe::Linear<D, V, !Tied>>>;
template <bool Tied>
using Trainer =
    gpipe::Trainer<Gpt<Tied>, gpipe::SoftmaxCrossEntropy, gpipe::mpi::Backend, gpipe::OneFOneB>;

std::unique_ptr<gpipe::mpi::Session> session;  // finalizes MPI after main returns
long steps = 3;
std::size_t replicas = 1;
bool shard_optimizer = false;
std::filesystem::path checkpoint_dir = std::filesystem::temp_directory_path() / "gpipe_bench_ckpt";

template <bool Tied>
typename Trainer<Tied>::Options options(std::size_t m) {
  typename Trainer<Tied>::Options o{.micro_batches = m, .seed = 1};
  if (Tied) o.ties = {{.parameter = "6.weight", .to = "0.wte.weight"}};
  return o;
}

std::size_t samples() { return samples_per_replica * replicas; }

gpipe::mpi::BackendOptions backend_options() {
  return {.data_parallel = replicas, .shard_optimizer = shard_optimizer};
}

std::vector<std::int32_t> random_tokens(std::uint64_t seed) {
  gpipe::Rng rng(seed);
  std::vector<std::int32_t> out(samples() * T);
  for (auto& t : out) t = static_cast<std::int32_t>(rng.next_u64() % V);
  return out;
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// From a merged trace of one step: the gradient sums' time per rank (ms, mean) and the share of it
// before the pipeline's last compute op ended.
std::pair<double, double> gradient_sums(const std::vector<gpipe::TraceEvent>& events) {
  double compute_end = 0, total = 0, hidden = 0;
  std::size_t sums = 0;
  for (const gpipe::TraceEvent& e : events)
    if (e.label.compute) compute_end = std::max(compute_end, e.end_us);
  for (const gpipe::TraceEvent& e : events) {
    if (!e.label.background) continue;
    ++sums;
    total += e.end_us - e.start_us;
    hidden += std::max(0.0, std::min(e.end_us, compute_end) - e.start_us);
  }
  if (sums == 0) return {0, 0};
  return {total / 1e3 / static_cast<double>(sums), total > 0 ? hidden / total : 0};
}

template <bool Tied>
void BM_GptTrainingStep(benchmark::State& state) {
  gpipe::mpi::Backend backend(MPI_COMM_WORLD, backend_options());
  Trainer<Tied> trainer(backend, options<Tied>(static_cast<std::size_t>(state.range(0))));
  const gpipe::optim::AdamW adamw(
      {.lr = 6e-4, .beta2 = 0.95, .weight_decay = 0.1, .decay = gpipe::optim::Decay::matrices});
  const std::vector<std::int32_t> x = random_tokens(2), y = random_tokens(3);
  double seconds = 0, clip_seconds = 0;
  std::vector<gpipe::TraceEvent> trace;
  long left = steps;
  for (auto _ : state) {
    trainer.zero_grad();
    if (replicas > 1 && --left == 0) backend.set_tracing(true);  // the last step
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    backend.set_tracing(false);
    const auto clip_start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.clip_grad_norm(1e-3));
    clip_seconds += since(clip_start);
    trainer.step(adamw);
    seconds += trainer.last_step_seconds();  // over both ranks: no barriers around the step
  }
  const double step_ms = 1e3 * seconds / static_cast<double>(state.iterations());
  state.counters["step_ms"] = step_ms;
  state.counters["tokens_per_s"] = static_cast<double>(samples() * T) / (step_ms / 1e3);
  if (replicas > 1) {
    const auto [sums_ms, hidden] = gradient_sums(backend.take_trace());
    state.counters["sums_ms"] = sums_ms;
    state.counters["sums_hidden"] = hidden;
    state.counters["state_MB"] =
        static_cast<double>(
            backend.memory_stats(backend.device()).current_of(gpipe::MemoryKind::optimizer_state)) /
        (1 << 20);
  }
  state.counters["clip_share"] = clip_seconds / seconds;
  state.counters["bubble"] = trainer.last_step().bubble_fraction;
}

void BM_GptCheckpoint(benchmark::State& state) {
  gpipe::mpi::Backend backend(MPI_COMM_WORLD, backend_options());
  Trainer<true> trainer(backend, options<true>(4));
  trainer.forward_backward(random_tokens(2), random_tokens(3));
  trainer.step(gpipe::optim::AdamW({.lr = 6e-4}));  // so that the state is saved too
  double seconds = 0;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    trainer.save_checkpoint(checkpoint_dir, {{"step", "1"}});
    seconds += since(start);
  }
  state.counters["save_s"] = seconds / static_cast<double>(state.iterations());
  const std::filesystem::path version = std::filesystem::canonical(checkpoint_dir);
  for (std::size_t d = 0; d < 2; ++d) {
    char shard[64];
    std::snprintf(shard, sizeof shard, "model-%05zu-of-00002.safetensors", d + 1);
    state.counters["rank" + std::to_string(d) + "_MB"] =
        static_cast<double>(std::filesystem::file_size(version / shard)) / (1 << 20);
  }
  state.counters["index_KB"] =
      static_cast<double>(std::filesystem::file_size(version / "model.safetensors.index.json")) /
      1024;
  MPI_Barrier(MPI_COMM_WORLD);
  if (backend.rank() == 0) {  // 1.3 GB per version: leave no copy behind
    std::filesystem::remove_all(version.parent_path() /
                                (checkpoint_dir.filename().string() + ".a"));
    std::filesystem::remove_all(version.parent_path() /
                                (checkpoint_dir.filename().string() + ".b"));
    std::filesystem::remove(checkpoint_dir);
  }
}

// Takes --steps=N, --checkpoint_dir=DIR, --replicas=R and --shard_optimizer out of argv.
bool take_flags(int* argc, char** argv) {
  steps = gpipe::bench::take_count(argc, argv, "steps", steps);
  replicas = static_cast<std::size_t>(gpipe::bench::take_count(argc, argv, "replicas", 1));
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--checkpoint_dir=")) {
      checkpoint_dir = std::string(arg.substr(17));
    } else if (arg == "--shard_optimizer") {
      shard_optimizer = true;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return steps > 0 && replicas > 0;
}

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags: MPI, this
// program's flags, and its benchmarks (every rank runs each for --steps iterations: the ranks
// must agree on the count).
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  session = std::make_unique<gpipe::mpi::Session>(*argc, argv);
  if (!take_flags(argc, argv)) {
    std::fprintf(stderr, "%s: --steps and --replicas must be positive numbers\n", argv[0]);
    return 1;
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (static_cast<std::size_t>(size) != 2 * replicas) {
    std::fprintf(stderr, "%s: run it on 2 x replicas = %zu ranks (mpirun -n %zu), not %d\n",
                 argv[0], 2 * replicas, 2 * replicas, size);
    return 1;
  }
  if (rank != 0) gpipe::bench::quiet(argc, argv);  // rank 0 prints and writes --benchmark_out
  for (const bool tied : {false, true})
    benchmark::RegisterBenchmark(tied ? "BM_GptTrainingStep<tied>" : "BM_GptTrainingStep<untied>",
                                 tied ? BM_GptTrainingStep<true> : BM_GptTrainingStep<false>)
        ->ArgName("M")
        ->Arg(4)
        ->Arg(8)
        ->Iterations(steps)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  benchmark::RegisterBenchmark("BM_GptCheckpoint", BM_GptCheckpoint)
      ->Iterations(std::min(steps, 2L))
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  return 0;
}
