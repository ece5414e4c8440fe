// One training step of the MLP that issue-style comparisons with PyTorch use, on the host
// backend: 4 x (Linear(1024, 1024), ReLU), then Linear(1024, 16); batch 256; softmax cross-entropy.
// A step is zero_grad + forward_backward (no optimizer update), as bench/pytorch_mlp_step.py times
// `model.zero_grad(); loss = cross_entropy(model(x), y); loss.backward()` on the same model.
//   K = 1        the unpipelined model on one device (one worker thread); M = 1 is the whole
//                batch at once, M = 8 accumulates gradients over 8 micro-batches one after the
//                other: GEMMs of the pipeline's micro-batch size, without a pipeline
//   K = 1, threads:2  the same with its large kernels (GEMMs above all) split over two threads,
//                the device's worker and one helper (host::BackendOptions::threads_per_device):
//                both cores on one device
//   K = 2        two stages of two hidden layers each (the second also holds the classifier), one
//                device per core, M micro-batches, under GPipe's fill-drain schedule, 1F1B and
//                ZB-H1 (BM_MlpStep<Schedule>)
// --rows=N (default 256) sets the batch: with --rows=2048 and M = 8 each micro-batch has the 256
// rows that K = 1's GEMMs have at the default batch, which separates what the pipeline gains from
// what 32-row GEMMs lose (BENCHMARKS.md). The JSON context records it as mlp_rows.
// Counters:
//   step_ms        wall time per step (the benchmark's time is the same, in its unit)
//   speedup        step time of K = 1, M = 1 in this run / this configuration's
//   bubble         the trainer's measured bubble of the last step
// scripts/bench-vs-pytorch alternates rounds of this program and the PyTorch script and reports
// medians side by side.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gpipe/gpipe.hpp>
#include <string>
#include <vector>

namespace {

constexpr std::size_t width = 1024, classes = 16;
std::size_t rows = 256;  // --rows
using Hidden = gpipe::Linear<width, width>;
using Head = gpipe::Linear<width, classes>;
using ReLU = gpipe::ReLU;

template <std::size_t K>
struct MlpFor;
template <>
struct MlpFor<1> {
  using type =
      gpipe::Pipeline<gpipe::Stage<Hidden, ReLU, Hidden, ReLU, Hidden, ReLU, Hidden, ReLU, Head>>;
};
template <>
struct MlpFor<2> {
  using type = gpipe::Pipeline<gpipe::Stage<Hidden, ReLU, Hidden, ReLU>,
                               gpipe::Stage<Hidden, ReLU, Hidden, ReLU, Head>>;
};

double baseline_ms = 0;  // K = 1, M = 1, which runs first

// threads:T (Threaded) gives the device T threads (host::BackendOptions::threads_per_device).
template <std::size_t K, class Schedule, bool Threaded = false>
void BM_MlpStep(benchmark::State& state) {
  using Model = typename MlpFor<K>::type;
  const auto m = static_cast<std::size_t>(state.range(1));
  const auto threads = Threaded ? static_cast<std::size_t>(state.range(2)) : std::size_t{1};
  gpipe::host::Backend backend(K, {.threads_per_device = threads});
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, Schedule> trainer(
      backend, {.micro_batches = m, .seed = 1});
  gpipe::Rng rng(2);
  std::vector<float> x(rows * width);
  std::vector<std::int32_t> y(rows);
  for (float& v : x) v = rng.uniform(-1, 1);
  for (std::size_t i = 0; i < rows; ++i) y[i] = static_cast<std::int32_t>(rng.next_u64() % classes);
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    trainer.zero_grad();
    try {
      benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    } catch (const gpipe::Error& e) {  // --rows smaller than M, say
      state.SkipWithError(e.what());
      break;
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (state.error_occurred()) return;
  const double step_ms = 1e3 * seconds / static_cast<double>(state.iterations());
  if (K == 1 && m == 1 && threads == 1) baseline_ms = step_ms;
  state.counters["step_ms"] = step_ms;
  if (baseline_ms > 0) state.counters["speedup"] = baseline_ms / step_ms;
  state.counters["bubble"] = trainer.last_step().bubble_fraction;
}

template <class Schedule>
void add_pipelined(const char* name) {
  benchmark::RegisterBenchmark(name, BM_MlpStep<2, Schedule>)
      ->ArgNames({"K", "M"})
      ->ArgsProduct({{2}, {1, 2, 4, 8, 16}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

void register_all() {
  benchmark::RegisterBenchmark("BM_MlpStep<GPipe>", BM_MlpStep<1, gpipe::GPipe>)
      ->ArgNames({"K", "M"})
      ->ArgsProduct({{1}, {1, 8}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_MlpStep<GPipe>", BM_MlpStep<1, gpipe::GPipe, true>)
      ->ArgNames({"K", "M", "threads"})
      ->ArgsProduct({{1}, {1, 8}, {2}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  add_pipelined<gpipe::GPipe>("BM_MlpStep<GPipe>");
  add_pipelined<gpipe::OneFOneB>("BM_MlpStep<1F1B>");
  add_pipelined<gpipe::ZeroBubbleH1>("BM_MlpStep<ZB-H1>");
}

[[maybe_unused]] const bool registered = (register_all(), true);

}  // namespace

// Takes --rows=N (a positive whole number) out of argv before Google Benchmark parses it.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--rows=", 7) == 0) {
      char* end = nullptr;
      const long long n = std::strtoll(argv[i] + 7, &end, 10);
      if (end == argv[i] + 7 || *end != '\0' || n <= 0 || n > 65536) {
        std::fprintf(stderr, "%s: --rows must be a whole number of rows from 1 to 65536\n",
                     argv[0]);
        return 1;
      }
      rows = static_cast<std::size_t>(n);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  benchmark::AddCustomContext("mlp_rows", std::to_string(rows));
  return 0;
}
