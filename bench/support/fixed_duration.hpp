#pragma once
// The layer of the bubble programs on the host (bench_bubble, bench_mpi_bubble): every op holds
// its thread for a fixed wall-clock time, so that what is measured is the schedule and the
// executor, not the arithmetic.

#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <thread>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <gpipe/model.hpp>

#include "support/bubble.hpp"

namespace gpipe::bench {

// Holds the thread for `us` microseconds: sleeps until 150 us before the deadline (after asking
// Linux once per thread for a 1 ns timer slack), then polls the clock, yielding the core. The
// sleep lets 8 devices share 2 cores; the poll makes every op last the same even when the
// scheduler wakes the thread late (on 2 busy cores, often by more than 50 us), so that the
// measurement shows the schedule and the executor rather than the wake-up jitter.
inline void hold(long us) {
#if defined(__linux__)
  thread_local const bool slack_set = prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0;
  (void)slack_set;
#endif
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  std::this_thread::sleep_until(deadline - std::chrono::microseconds(150));
  while (std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
}

// A layer of width N that passes its input through, stashes 1024 floats per row (so that live
// activations show in the memory counters) and takes flags->op_us / Split in each of its three
// ops; `flags` is the program's (set before any benchmark runs).
inline const BubbleFlags* fixed_duration_flags = nullptr;

template <std::size_t N, std::size_t Split>
struct FixedDuration {
  static constexpr std::size_t in_features = N, out_features = N;
  // A float of grad stash per row: without one, the first stage would skip its backward_input
  // (no one reads the model's input gradient; model/detail/chain.hpp), and here every device
  // must do the same work.
  static constexpr std::size_t num_params = 0, stash_per_row = 1024, grad_stash_per_row = 1;
  static constexpr std::array<ParamSpec, 0> param_specs() { return {}; }
  static void init(std::span<float>, Rng&) {}

  template <class Ctx>
  static void forward(Ctx& k, const ForwardArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.x, a.y);
    hold(op_us());
  }
  template <class Ctx>
  static void backward_input(Ctx& k, const BackwardInputArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.dy, a.dx);
    hold(op_us());
  }
  template <class Ctx>
  static void backward_weight(Ctx&, const BackwardWeightArgs<typename Ctx::value_type>&) {
    hold(op_us());
  }

 private:
  static long op_us() { return fixed_duration_flags->op_us / static_cast<long>(Split); }
};
static_assert(layer<FixedDuration<4, 1>>);

template <std::size_t Split>
using FixedDurationLayer = FixedDuration<4, Split>;

}  // namespace gpipe::bench
