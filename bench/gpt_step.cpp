// One training step of a GPT-2-shaped model on the host backend, in tokens per second, for K = 1,
// 2 and 4 stages and several micro-batch counts (1F1B). bench/pytorch_gpt_step.py times the same
// model and step in PyTorch (run the two one after the other; BENCHMARKS.md has both).
//   model   GPT-2's shapes with 4 blocks: V = 50304, T = 256, D = 768, H = 12; batch 8 samples
//           (2048 tokens); token + position embedding, 4 pre-norm blocks, LayerNorm, LM head
//   step    zero_grad + forward_backward (no optimizer update)
//   splits  K = 1: everything on one device. The LM head (D x V) is over half of the step's
//           FLOPs and cannot be split as a whole layer, so the balanced cut is before it:
//           K = 2: [embedding, 4 blocks] [LayerNorm, head]; K = 4: [embedding, block]
//           [2 blocks] [block] [LayerNorm, head] (four device threads on this machine's 2 cores).
//           Rows BM_GptStep<1F1B,cut:...> compare cuts at K = 2 and 4: `balanced` is
//           gpipe::balanced_pipeline_t's (K = 2: [embedding, 4 blocks, LayerNorm] [head]; K = 4:
//           [embedding, block] [2 blocks] [block, LayerNorm] [head]), `even` what counting layers
//           gives (K = 2: [embedding, 2 blocks] [2 blocks, LayerNorm, head]; K = 4: [embedding,
//           block] [block] [block] [block, LayerNorm, head])
//   threads K = 1, threads:2: the one device with its large kernels split over two threads, its
//           worker and one helper (host::BackendOptions::threads_per_device)
// precision: rows named BM_GptStep<1F1B,bf16> train in gpipe::MixedBf16 (bf16 activations and GEMM
//           inputs, fp32 master weights); bench/pytorch_gpt_step.py --autocast is PyTorch's
//           torch.autocast("cpu", dtype=torch.bfloat16) step beside them
// schedules: rows BM_GptStep<ZB-H1> and BM_GptStep<searched> (K = 2, 4, M = 4, the hand cut):
//           searched is gpipe::search_schedule's pick for the op costs gpipe::measure_op_costs
//           times in one ZB-H1 step, with 1F1B's memory (K stashes a device)
// warm-up: --warmup_steps=N (default 1) untimed steps before the timed ones in each run, as
//           bench/pytorch_gpt_step.py does: the first step faults in every page of its
//           activations (a quarter of a bf16 step here); the CTest smoke test passes 0.
// Counters: tokens_per_s, step_ms, speedup (against K = 1, M = 1, one thread, of this run), bubble,
// clip_share (Trainer::clip_grad_norm's time over the step's).

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <gpipe/gpipe.hpp>
#include <gpipe/runtime/measure_costs.hpp>
#include <optional>
#include <type_traits>
#include <vector>

#include "support/warmup_steps.hpp"

namespace {

constexpr std::size_t V = 50304, T = 256, D = 768, H = 12, samples = 8;
using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Norm = gpipe::LayerNorm<D>;
using Head = gpipe::Linear<D, V>;

template <std::size_t K>
struct GptFor;
template <>
struct GptFor<1> {
  using type = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, Block, Norm, Head>>;
};
template <>
struct GptFor<2> {
  using type =
      gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, Block>, gpipe::Stage<Norm, Head>>;
};
template <>
struct GptFor<4> {
  using type = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block, Block>,
                               gpipe::Stage<Block>, gpipe::Stage<Norm, Head>>;
};

// The cuts the cut:balanced and cut:even rows compare (see the top of this file).
enum class Cut { hand, balanced, even };
template <std::size_t K, Cut C>
struct GptCut {
  using type = typename GptFor<K>::type;
};
template <std::size_t K>
struct GptCut<K, Cut::balanced> {
  using type = gpipe::balanced_pipeline_t<K, Emb, Block, Block, Block, Block, Norm, Head>;
};
template <>
struct GptCut<2, Cut::even> {
  using type =
      gpipe::Pipeline<gpipe::Stage<Emb, Block, Block>, gpipe::Stage<Block, Block, Norm, Head>>;
};
template <>
struct GptCut<4, Cut::even> {
  using type = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block>, gpipe::Stage<Block>,
                               gpipe::Stage<Block, Norm, Head>>;
};

double baseline_ms = 0;  // K = 1, M = 1, which runs first
long warmup_steps = 1;   // --warmup_steps

// threads:T (Threaded) gives each device T threads (host::BackendOptions::threads_per_device).
// Kind: the schedule tag; SearchedSchedule runs search_schedule's pick for op costs measured in
// one ZB-H1 step of the same model (gpipe::measure_op_costs) with K stashes a device (1F1B's).
template <std::size_t K, bool Threaded = false, class Precision = gpipe::Fp32, Cut C = Cut::hand,
          class Kind = gpipe::OneFOneB>
void BM_GptStep(benchmark::State& state) {
  using Model = typename GptCut<K, C>::type;
  const auto m = static_cast<std::size_t>(state.range(1));
  const auto threads = Threaded ? static_cast<std::size_t>(state.range(2)) : std::size_t{1};
  gpipe::host::Backend backend(K, {.threads_per_device = threads});
  gpipe::Rng rng(2);
  std::vector<std::int32_t> x(samples * T), y(samples * T);
  for (auto& t : x) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (auto& t : y) t = static_cast<std::int32_t>(rng.next_u64() % V);
  std::optional<gpipe::Schedule> searched;
  if constexpr (std::is_same_v<Kind, gpipe::SearchedSchedule>) {
    gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, gpipe::ZeroBubbleH1,
                   Precision>
        probe(backend, {.micro_batches = m, .seed = 1});
    const std::vector<gpipe::OpCosts> costs = gpipe::measure_op_costs(probe, x, y, 1);
    searched = gpipe::search_schedule(K, m, {.costs = costs, .max_stashes = {K}});
  }
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, Kind, Precision> trainer(
      backend, {.micro_batches = m, .seed = 1, .schedule = searched});
  for (long i = 0; i < warmup_steps; ++i) {
    trainer.zero_grad();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
  }
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    trainer.zero_grad();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double step_ms = 1e3 * seconds / static_cast<double>(state.iterations());
  if (K == 1 && m == 1 && threads == 1 && std::is_same_v<Precision, gpipe::Fp32>)
    baseline_ms = step_ms;
  state.counters["step_ms"] = step_ms;
  state.counters["tokens_per_s"] = static_cast<double>(samples * T) / (step_ms / 1e3);
  if (baseline_ms > 0) state.counters["speedup"] = baseline_ms / step_ms;
  state.counters["bubble"] = trainer.last_step().bubble_fraction;
  // Gradient clipping, as a training run adds it to every step: its time against the step's
  // (timed apart from the step; a max_norm that always clips, so both passes run).
  const auto clip_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) benchmark::DoNotOptimize(trainer.clip_grad_norm(1e-3));
  const double clip_ms =
      1e3 / 3 *
      std::chrono::duration<double>(std::chrono::steady_clock::now() - clip_start).count();
  state.counters["clip_share"] = clip_ms / step_ms;
}

void register_all() {
  auto add = [](auto bench, std::vector<std::int64_t> ks, std::vector<std::int64_t> ms) {
    benchmark::RegisterBenchmark("BM_GptStep<1F1B>", bench)
        ->ArgNames({"K", "M"})
        ->ArgsProduct({ks, ms})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  add(BM_GptStep<1>, {1}, {1});
  benchmark::RegisterBenchmark("BM_GptStep<1F1B>", BM_GptStep<1, true>)
      ->ArgNames({"K", "M", "threads"})
      ->ArgsProduct({{1}, {1}, {2}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  add(BM_GptStep<2>, {2}, {1, 2, 4, 8});
  add(BM_GptStep<4>, {4}, {1, 4, 8});
  // gpipe::MixedBf16 beside Fp32 (speedup against the same fp32 baseline)
  benchmark::RegisterBenchmark("BM_GptStep<1F1B,bf16>", BM_GptStep<1, false, gpipe::MixedBf16>)
      ->ArgNames({"K", "M"})
      ->ArgsProduct({{1}, {1}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_GptStep<1F1B,bf16>", BM_GptStep<1, true, gpipe::MixedBf16>)
      ->ArgNames({"K", "M", "threads"})
      ->ArgsProduct({{1}, {1}, {2}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_GptStep<1F1B,bf16>", BM_GptStep<2, false, gpipe::MixedBf16>)
      ->ArgNames({"K", "M"})
      ->ArgsProduct({{2}, {4}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  // the balanced cut against counting layers (issue 31)
  auto cut = [](const char* name, auto bench, std::int64_t k) {
    benchmark::RegisterBenchmark(name, bench)
        ->ArgNames({"K", "M"})
        ->ArgsProduct({{k}, {4}})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  cut("BM_GptStep<1F1B,cut:balanced>", BM_GptStep<2, false, gpipe::Fp32, Cut::balanced>, 2);
  cut("BM_GptStep<1F1B,cut:even>", BM_GptStep<2, false, gpipe::Fp32, Cut::even>, 2);
  cut("BM_GptStep<1F1B,cut:balanced>", BM_GptStep<4, false, gpipe::Fp32, Cut::balanced>, 4);
  cut("BM_GptStep<1F1B,cut:even>", BM_GptStep<4, false, gpipe::Fp32, Cut::even>, 4);
  // ZB-H1 and the schedule searched from measured op costs, beside the 1F1B rows (issue 31)
  cut("BM_GptStep<ZB-H1>", BM_GptStep<2, false, gpipe::Fp32, Cut::hand, gpipe::ZeroBubbleH1>, 2);
  cut("BM_GptStep<searched>", BM_GptStep<2, false, gpipe::Fp32, Cut::hand, gpipe::SearchedSchedule>,
      2);
  cut("BM_GptStep<ZB-H1>", BM_GptStep<4, false, gpipe::Fp32, Cut::hand, gpipe::ZeroBubbleH1>, 4);
  cut("BM_GptStep<searched>", BM_GptStep<4, false, gpipe::Fp32, Cut::hand, gpipe::SearchedSchedule>,
      4);
}

[[maybe_unused]] const bool registered = (register_all(), true);

}  // namespace

// --warmup_steps=N (support/warmup_steps.hpp).
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  return gpipe::bench::take_warmup_steps(argc, argv, "bench_gpt_step", warmup_steps);
}
