#pragma once
// The measurement shared by bench_bubble (host) and bench_cuda_bubble (CUDA): a pipeline of S
// stages of one fixed-duration layer each, and the loop that runs a trainer's steps and reports
// bubble_measured, bubble_simulated, bubble_theory, overhead_us_per_op and peak_activations_KiB
// (see bench/bubble.cpp for their definitions), plus an optional traced K = 4, M = 8 step; the
// benchmarks' names and arguments; the programs' own flags (--op_us, --trace_dir).

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
#include <gpipe/schedule.hpp>
#include <gpipe/schedule/simulator.hpp>
#include <string>
#include <string_view>
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
  if (schedule.starts_with("interleaved") && m >= k) return ((k - 1) / v) / (m + (k - 1) / v);
  return 0;
}

// Runs trainer.forward_backward on an (m, 4) batch for every benchmark iteration and sets the
// counters. With a trace_prefix and K = 4, M = 8, also writes <trace_prefix>.svg and .json.
template <class Trainer, class Backend>
void measure_bubble(benchmark::State& state, Trainer& trainer, Backend& backend,
                    std::size_t devices, std::size_t m, const std::string& trace_prefix,
                    const std::string& title) {
  using Schedule = typename Trainer::schedule_type;
  const double ops_per_device = 3.0 * static_cast<double>(m * Schedule::chunks_per_device);
  const std::vector<float> x(m * 4, 1.0f), y(m * 4, 0.0f);
  double bubble = 0, overhead = 0;
  backend.reset_peak();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    const double wall =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    const auto& step = trainer.last_step();
    const double mean_op = step.busy_us / (ops_per_device * static_cast<double>(devices));
    const double ideal = simulate(trainer.schedule(), {mean_op, mean_op, mean_op}).makespan;
    bubble += step.bubble_fraction;
    overhead += (wall - ideal) / (ideal / mean_op);
  }
  std::size_t peak = 0;
  for (std::size_t d = 0; d < devices; ++d)
    peak = std::max(peak, backend.memory_stats(d).peak_of(MemoryKind::activations));

  const auto n = static_cast<double>(state.iterations());
  state.counters["bubble_measured"] = bubble / n;
  state.counters["bubble_simulated"] = simulate(trainer.schedule()).bubble_fraction;
  state.counters["bubble_theory"] =
      bubble_theory(Schedule::name, static_cast<double>(devices), static_cast<double>(m),
                    static_cast<double>(Schedule::chunks_per_device));
  state.counters["overhead_us_per_op"] = overhead / n;
  state.counters["peak_activations_KiB"] = static_cast<double>(peak) / 1024;
  state.SetLabel(std::string(Schedule::name));

  if (!trace_prefix.empty() && devices == 4 && m == 8) {
    backend.set_tracing(true);
    trainer.forward_backward(x, y);
    backend.set_tracing(false);
    const auto events = backend.take_trace();
    io::write_svg_timeline(trace_prefix + ".svg", events, {.title = title, .num_devices = devices});
    io::write_chrome_trace(trace_prefix + ".json", events, {.title = title});
  }
}

// Registers BM_Bubble<Schedule>/K:k/M:m for GPipe, 1F1B, interleaved (V = 2) and ZB-H1, K in
// {1, 2, 4, 8}, M in {1, 2, 4, ..., 64}; each runs bench.template operator()<Schedule, K>(state).
// min_time 0 leaves it to --benchmark_min_time.
template <class Bench>
void register_bubble_benchmarks(Bench bench, double min_time = 0) {
  auto one_schedule = [&]<class Schedule>(const char* name) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            auto* b = benchmark::RegisterBenchmark(name, [bench](benchmark::State& state) {
              bench.template operator()<Schedule, K>(state);
            });
            b->ArgNames({"K", "M"})
                ->ArgsProduct({{static_cast<long>(K)}, {1, 2, 4, 8, 16, 32, 64}})
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
            if (min_time > 0) b->MinTime(min_time);
          }(),
          ...);
    }(std::index_sequence<1, 2, 4, 8>{});
  };
  one_schedule.template operator()<GPipe>("BM_Bubble<GPipe>");
  one_schedule.template operator()<OneFOneB>("BM_Bubble<OneFOneB>");
  one_schedule.template operator()<Interleaved<2>>("BM_Bubble<Interleaved<2>>");
  one_schedule.template operator()<ZeroBubbleH1>("BM_Bubble<ZeroBubbleH1>");
}

// The bubble programs' own flags, taken out of argv before Google Benchmark (which rejects flags
// it does not know) parses it.
struct BubbleFlags {
  long op_us;             // --op_us=N: duration of every F, B and W of a whole stage
  std::string trace_dir;  // --trace_dir=DIR: where to write K = 4, M = 8 timelines ("": nowhere)
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

}  // namespace gpipe::bench
