// Bubble overhead versus micro-batch count, per schedule, measured the way the GPipe paper
// reasons about it.
//
// Each stage is one user-defined layer whose forward, backward_input and backward_weight take a
// fixed wall-clock duration (they sleep, so that K = 8 devices run on a 2-core machine), which
// isolates the schedule and the executor from the arithmetic. Every device does 3 op_us of work
// per micro-batch under every schedule (an interleaved chunk's ops take op_us / V). For K
// devices and M micro-batches:
//   bubble_measured      1 - busy / (K makespan) from the trainer's per-step timing
//   bubble_simulated     the schedule simulator's bubble for equal op costs
//   bubble_theory        the published closed form: (K-1)/(M+K-1) for GPipe and 1F1B,
//                        ((K-1)/V)/(M+(K-1)/V) for interleaved (M >= K); 0 where none applies
//   overhead_us_per_op   (wall time of the step - the simulated makespan with the op durations
//                        measured in the same step) / (op slots on the critical path, that
//                        makespan / the mean op duration): what the executor adds to each op
//                        of the critical path, hand-overs between devices included
//   peak_activations_KiB the most activation bytes any device held (each micro-batch keeps
//                        4 KiB per stage from its forward to its backward_weight)
// Usage: bench_bubble [--op_us=1000] [--trace_dir=DIR] [Google Benchmark flags]
//   --trace_dir writes DIR/timeline_<schedule>_k4_m8.svg and .json: one traced K = 4, M = 8 step.

#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <gpipe/gpipe.hpp>

#include "support/bubble.hpp"

namespace {

gpipe::bench::BubbleFlags flags{.op_us = 1000, .trace_dir = ""};

// Holds the thread for `us` microseconds: sleeps until 50 us before the deadline (after asking
// Linux once per thread for a 1 ns timer slack), then polls the clock. The sleep lets 8 devices
// share 2 cores; the short poll makes every op last the same, so that the measurement shows the
// schedule and the executor rather than the scheduler's wake-up jitter.
void hold(long us) {
#if defined(__linux__)
  thread_local const bool slack_set = prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0;
  (void)slack_set;
#endif
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  std::this_thread::sleep_until(deadline - std::chrono::microseconds(50));
  while (std::chrono::steady_clock::now() < deadline) {
  }
}

// A layer of width N that passes its input through, stashes 1024 floats per row (so that live
// activations show in the memory counters) and takes op_us / Split in each of its three ops.
template <std::size_t N, std::size_t Split>
struct FixedDuration {
  static constexpr std::size_t in_features = N, out_features = N;
  static constexpr std::size_t num_params = 0, stash_per_row = 1024, grad_stash_per_row = 0;
  static constexpr std::array<gpipe::ParamSpec, 0> param_specs() { return {}; }
  static void init(std::span<float>, gpipe::Rng&) {}

  template <class Ctx>
  static void forward(Ctx& k, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.x, a.y);
    hold(flags.op_us / static_cast<long>(Split));
  }
  template <class Ctx>
  static void backward_input(Ctx& k, const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.dy, a.dx);
    hold(flags.op_us / static_cast<long>(Split));
  }
  template <class Ctx>
  static void backward_weight(Ctx&, const gpipe::BackwardWeightArgs<typename Ctx::value_type>&) {
    hold(flags.op_us / static_cast<long>(Split));
  }
};
static_assert(gpipe::layer<FixedDuration<4, 1>>);

template <std::size_t Split>
using Layer = FixedDuration<4, Split>;

[[maybe_unused]] const bool registered = [] {
  gpipe::bench::register_bubble_benchmarks<Layer>(
      [](std::size_t k) { return std::make_unique<gpipe::host::Backend>(k); },
      {.flags = &flags, .trace_stem = "timeline_", .where = "the host backend", .min_time = 0.3});
  return true;
}();

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  return gpipe::bench::take_bubble_flags(argc, argv, flags) ? 0 : 1;
}
