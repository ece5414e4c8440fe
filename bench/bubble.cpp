// Bubble overhead versus micro-batch count, measured the way the GPipe paper reasons about it.
//
// Each stage is one user-defined layer whose forward, backward_input and backward_weight take a
// fixed wall-clock duration (they sleep, so that K = 8 devices run on a 2-core machine), which
// isolates the schedule and the executor from the arithmetic. For K stages and M micro-batches:
//   bubble_measured      1 - busy / (K makespan) from the trainer's per-step timing
//   bubble_theory        (K - 1) / (M + K - 1), the fill-drain bubble for equal op costs
//   overhead_us_per_op   (wall time of the step - the ideal makespan (M + K - 1)(F + B + W) with
//                        the op durations measured in the same step) / (3 (M + K - 1)): what
//                        the executor adds to each op slot of the critical path
// Usage: bench_bubble [--op_us=1000] [Google Benchmark flags]

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <gpipe/gpipe.hpp>

namespace {

std::atomic<long> op_us{1000};  // duration of every F, B and W

// Sleeps until now + op_us. The first call on a thread asks Linux for a 1 ns timer slack, so a
// sleep overshoots by microseconds instead of the default 50.
void hold() {
#if defined(__linux__)
  thread_local const bool slack_set = prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0;
  (void)slack_set;
#endif
  std::this_thread::sleep_until(std::chrono::steady_clock::now() +
                                std::chrono::microseconds(op_us.load()));
}

// A layer of width N that passes its input through and takes op_us in each of its three ops.
template <std::size_t N>
struct FixedDuration {
  static constexpr std::size_t in_features = N, out_features = N;
  static constexpr std::size_t num_params = 0, stash_per_row = 0, grad_stash_per_row = 0;
  static constexpr std::array<gpipe::ParamSpec, 0> param_specs() { return {}; }
  static void init(std::span<float>, gpipe::Rng&) {}

  template <class Ctx>
  static void forward(Ctx& k, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.x, a.y);
    hold();
  }
  template <class Ctx>
  static void backward_input(Ctx& k, const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.dy, a.dx);
    hold();
  }
  template <class Ctx>
  static void backward_weight(Ctx&, const gpipe::BackwardWeightArgs<typename Ctx::value_type>&) {
    hold();
  }
};
static_assert(gpipe::layer<FixedDuration<4>>);

template <std::size_t K, class Seq = std::make_index_sequence<K>>
struct Fixed;
template <std::size_t K, std::size_t... S>
struct Fixed<K, std::index_sequence<S...>> {
  template <std::size_t>
  using stage = gpipe::Stage<FixedDuration<4>>;
  using type = gpipe::Pipeline<stage<S>...>;
};

template <std::size_t K, class Schedule>
void BM_Bubble(benchmark::State& state) {
  using Model = typename Fixed<K>::type;
  const auto m = static_cast<std::size_t>(state.range(1));
  gpipe::host::Backend backend(K / Schedule::chunks_per_device);
  gpipe::Trainer<Model, gpipe::MSELoss, gpipe::host::Backend, Schedule> trainer(
      backend, {.micro_batches = m});
  const std::vector<float> x(m * 4, 1.0f), y(m * 4, 0.0f);

  double bubble = 0, overhead = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    const double wall =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count();
    const auto& step = trainer.last_step();
    const double slots = static_cast<double>(m) + static_cast<double>(K) - 1;
    const double mean_op = step.busy_us / (3.0 * static_cast<double>(m) * static_cast<double>(K));
    bubble += step.bubble_fraction;
    overhead += (wall - slots * 3 * mean_op) / (3 * slots);
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["bubble_measured"] = bubble / n;
  state.counters["bubble_theory"] =
      (static_cast<double>(K) - 1) / (static_cast<double>(m) + static_cast<double>(K) - 1);
  state.counters["bubble_simulated"] = gpipe::simulate(trainer.schedule()).bubble_fraction;
  state.counters["overhead_us_per_op"] = overhead / n;
  state.SetLabel(std::string(Schedule::name));
}

void register_all() {
  auto add = [](const char* name, auto fn, int k) {
    benchmark::RegisterBenchmark(name, fn)
        ->ArgNames({"K", "M"})
        ->ArgsProduct({{k}, {1, 2, 4, 8, 16, 32, 64}})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(0.3);
  };
  add("BM_Bubble<gpipe>", BM_Bubble<1, gpipe::GPipe>, 1);
  add("BM_Bubble<gpipe>", BM_Bubble<2, gpipe::GPipe>, 2);
  add("BM_Bubble<gpipe>", BM_Bubble<4, gpipe::GPipe>, 4);
  add("BM_Bubble<gpipe>", BM_Bubble<8, gpipe::GPipe>, 8);
}

// Registered before main runs.
[[maybe_unused]] const bool registered = (register_all(), true);

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags (it rejects flags
// it does not know): takes --op_us=N, the op duration in microseconds, out of the command line.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--op_us=", 8) == 0) {
      op_us = std::atol(argv[i] + 8);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return 0;
}
