#pragma once
// What bench_bubble (host), bench_mpi_bubble (a rank per device) and bench_cuda_bubble (CUDA)
// share, all but their fixed-duration layer and their backend: the programs' flags (--op_us,
// --trace_dir); the benchmarks' names and arguments; a pipeline of S stages of one such layer each;
// and the loop that runs a trainer's steps and reports bubble_measured, bubble_simulated,
// bubble_theory, overhead_us_per_op and peak_activations_KiB (see bench/bubble.cpp for their
// definitions), plus an optional traced K = 4, M = 8 step.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <gpipe/backend/common.hpp>
#include <gpipe/io/chrome_trace.hpp>
#include <gpipe/io/svg_timeline.hpp>
#include <gpipe/model.hpp>
#include <gpipe/runtime/trainer.hpp>
#include <gpipe/schedule.hpp>
#include <gpipe/schedule/simulator.hpp>
#include <gpipe/transport/transport.hpp>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpipe::bench {

// fixed_pipeline_t<Layer, S> = Pipeline of S stages of one Layer (width 4) each.
template <class Layer, std::size_t S, class Seq = std::make_index_sequence<S>>
struct FixedPipeline;
template <class Layer, std::size_t S, std::size_t... I>
struct FixedPipeline<Layer, S, std::index_sequence<I...>> {
  template <std::size_t>
  using stage = Stage<Layer>;
  using type = Pipeline<stage<I>...>;
};
template <class Layer, std::size_t S>
using fixed_pipeline_t = typename FixedPipeline<Layer, S>::type;

// The published closed form of a schedule's bubble for equal op costs, 0 where none applies.
inline double bubble_theory(std::string_view schedule, double k, double m, double v) {
  if (schedule == "gpipe" || schedule == "1f1b") return (k - 1) / (m + k - 1);
  if ((schedule.starts_with("interleaved") || schedule.starts_with("looped-bfs")) && m >= k)
    return ((k - 1) / v) / (m + (k - 1) / v);
  // ZB-H1 and ZB-H2 (equal F, B, W): (M+K-1)(F+B) + (M-K+1) W = 3M + K-1 for M >= K
  if ((schedule == "zb-h1" || schedule == "zb-h2") && m >= k) return (k - 1) / (3 * m + k - 1);
  // ZB-V and DualPipeV: half-stage chunks, the least a synchronous step takes, (K-1)/2 + 3M,
  // for M >= 2K-1 (ZB-V) and M >= 2K (DualPipeV, which needs it)
  if ((schedule == "zb-v" && m + 1 >= 2 * k) || (schedule == "dualpipe-v" && m >= 2 * k))
    return ((k - 1) / 2) / (3 * m + (k - 1) / 2);
  return 0;
}

// The bubble programs' own flags, taken out of argv before Google Benchmark (which rejects flags
// it does not know) parses it.
struct BubbleFlags {
  long op_us;             // --op_us=N: duration of every F, B and W of a whole stage
  std::string trace_dir;  // --trace_dir=DIR: where to write M = 8 timelines ("": nowhere)
};
// Parses and removes --op_us and --trace_dir (creating DIR); false, after a message on stderr,
// when --op_us is not a positive number of microseconds.
inline bool take_bubble_flags(int* argc, char** argv, BubbleFlags& flags) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--op_us=", 8) == 0) {
      char* end = nullptr;
      flags.op_us = std::strtol(argv[i] + 8, &end, 10);
      if (end == argv[i] + 8 || *end != '\0') flags.op_us = 0;
    } else if (std::strncmp(argv[i], "--trace_dir=", 12) == 0) {
      flags.trace_dir = argv[i] + 12;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  if (flags.op_us <= 0) {
    std::fprintf(stderr, "%s: --op_us must be a positive number of microseconds\n", argv[0]);
    return false;
  }
  if (!flags.trace_dir.empty()) std::filesystem::create_directories(flags.trace_dir);
  return true;
}

// What differs between the programs besides the backend.
struct BubbleSetup {
  const BubbleFlags* flags;  // read when the benchmarks run, after the program parsed them
  std::string trace_stem;    // DIR/<trace_stem><schedule>_k<trace_k>_m8.svg and .json
  std::string where;         // "the host backend": ends the timeline's title
  double min_time = 0;       // seconds per benchmark; 0 leaves it to --benchmark_min_time
  // Steps per benchmark, fixed (0: Google Benchmark decides from the time). Processes that run
  // one pipeline together must run the same number of steps.
  long iterations = 0;
  std::size_t only_k = 0;   // register only this K (0: K in {1, 2, 4, 8})
  std::size_t trace_k = 4;  // the K of the traced step (with M = 8)
};

// One benchmark: a Trainer of K·V stages of Layer<V> each (V: the schedule's chunks per device,
// so Layer<V> takes op_us / V per op) on K devices from make_backend(K), an (M, 4) batch; one
// warm-up step (thread start-up, memory pools, module loading), then a step per iteration, and
// the counters. For K = setup.trace_k, M = 8 with a trace directory it also writes one traced
// step (with several processes: every rank's work, written by rank 0).
template <class Schedule, std::size_t K, template <std::size_t> class Layer, class MakeBackend>
void run_bubble_benchmark(benchmark::State& state, const MakeBackend& make_backend,
                          const BubbleSetup& setup) {
  constexpr std::size_t V = Schedule::chunks_per_device;
  using Model = fixed_pipeline_t<Layer<V>, K * V>;
  const auto m = static_cast<std::size_t>(state.range(1));
  const auto backend_owner = make_backend(K);
  auto& backend = *backend_owner;
  Trainer<Model, MSELoss, std::remove_cvref_t<decltype(backend)>, Schedule> trainer(
      backend, {.micro_batches = m});
  const double ops_per_device = 3.0 * static_cast<double>(m * V);
  const std::vector<float> x(m * 4, 1.0f), y(m * 4, 0.0f);
  trainer.forward_backward(x, y);  // warm-up
  double bubble = 0, overhead = 0;
  backend.reset_peak();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    const double wall =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    const auto& step = trainer.last_step();
    const double mean_op = step.busy_us / (ops_per_device * static_cast<double>(K));
    const double ideal = simulate(trainer.schedule(), {mean_op, mean_op, mean_op}).makespan;
    bubble += step.bubble_fraction;
    overhead += (wall - ideal) / (ideal / mean_op);
  }
  // the devices of this process; with several processes, every process gets the largest
  transport::Transport<std::remove_cvref_t<decltype(backend)>> transport(backend);
  float peak = 0;
  for (std::size_t d = 0; d < K; ++d)
    if (transport.is_local(d))
      peak = std::max(peak,
                      static_cast<float>(backend.memory_stats(d).peak_of(MemoryKind::activations)));
  for (std::size_t d = 0; d < K; ++d) {
    float of_d = peak;
    transport.broadcast(d, std::span<float>(&of_d, 1));
    peak = std::max(peak, of_d);
  }

  const auto n = static_cast<double>(state.iterations());
  state.counters["bubble_measured"] = bubble / n;
  state.counters["bubble_simulated"] = simulate(trainer.schedule()).bubble_fraction;
  state.counters["bubble_theory"] = bubble_theory(Schedule::name, static_cast<double>(K),
                                                  static_cast<double>(m), static_cast<double>(V));
  state.counters["overhead_us_per_op"] = overhead / n;
  state.counters["peak_activations_KiB"] = static_cast<double>(peak) / 1024;
  state.SetLabel(std::string(Schedule::name));

  const std::string& dir = setup.flags->trace_dir;
  if (!dir.empty() && K == setup.trace_k && m == 8) {
    backend.set_tracing(true);
    trainer.forward_backward(x, y);
    backend.set_tracing(false);
    const auto events = backend.take_trace();  // with several processes: all of them, each
    if (!transport.writes_files()) return;
    const std::string name(Schedule::name), k = std::to_string(K);
    const std::string path = dir + "/" + setup.trace_stem + name + "_k" + k + "_m8";
    const std::string title = name + ", K = " + k + ", M = 8, measured on " + setup.where;
    io::write_svg_timeline(path + ".svg", events, {.title = title, .num_devices = K});
    io::write_chrome_trace(path + ".json", events, {.title = title});
  }
}

// Registers BM_Bubble<Schedule>/K:k/M:m for GPipe, 1F1B, interleaved (V = 2), ZB-H1, looped BFS
// (V = 2), ZB-H2, ZB-V and DualPipeV, K in {1, 2, 4, 8}, M in {1, 2, 4, ..., 64} (DualPipeV: M >=
// 2K): run_bubble_benchmark with Layer and make_backend
// (std::size_t K -> a pointer that owns a backend of K devices).
template <template <std::size_t> class Layer, class MakeBackend>
void register_bubble_benchmarks(MakeBackend make_backend, BubbleSetup setup) {
  auto one_schedule = [&]<class Schedule>(const char* name) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            if (setup.only_k != 0 && setup.only_k != K) return;
            auto* b =
                benchmark::RegisterBenchmark(name, [make_backend, setup](benchmark::State& state) {
                  run_bubble_benchmark<Schedule, K, Layer>(state, make_backend, setup);
                });
            // DualPipeV runs M >= 2K only
            std::vector<long> ms;
            for (long m : {1, 2, 4, 8, 16, 32, 64})
              if (!std::is_same_v<Schedule, DualPipeV> || m >= 2 * static_cast<long>(K))
                ms.push_back(m);
            b->ArgNames({"K", "M"})
                ->ArgsProduct({{static_cast<long>(K)}, ms})
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
            if (setup.min_time > 0) b->MinTime(setup.min_time);
            if (setup.iterations > 0) b->Iterations(setup.iterations);
          }(),
          ...);
    }
    (std::index_sequence<1, 2, 4, 8>{});
  };
  one_schedule.template operator()<GPipe>("BM_Bubble<GPipe>");
  one_schedule.template operator()<OneFOneB>("BM_Bubble<OneFOneB>");
  one_schedule.template operator()<Interleaved<2>>("BM_Bubble<Interleaved<2>>");
  one_schedule.template operator()<ZeroBubbleH1>("BM_Bubble<ZeroBubbleH1>");
  one_schedule.template operator()<LoopedBFS<2>>("BM_Bubble<LoopedBFS<2>>");
  one_schedule.template operator()<ZeroBubbleH2>("BM_Bubble<ZeroBubbleH2>");
  one_schedule.template operator()<ZeroBubbleV>("BM_Bubble<ZeroBubbleV>");
  one_schedule.template operator()<DualPipeV>("BM_Bubble<DualPipeV>");
}

}  // namespace gpipe::bench
