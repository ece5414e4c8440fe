// Bubble overhead versus micro-batch count, per schedule, measured the way the GPipe paper
// reasons about it.
//
// Each stage is one user-defined layer whose forward, backward_input and backward_weight take a
// fixed wall-clock duration (they sleep, so that K = 8 devices run on a 2-core machine;
// support/fixed_duration.hpp), which isolates the schedule and the executor from the
// arithmetic. Every device does 3 op_us of work per micro-batch under every schedule (an
// interleaved chunk's ops take op_us / V). For K devices and M micro-batches:
//   bubble_measured      1 - busy / (K makespan) from the trainer's per-step timing
//   bubble_simulated     the schedule simulator's bubble for equal op costs
//   bubble_theory        the closed form: (K-1)/(M+K-1) for GPipe and 1F1B,
//                        ((K-1)/V)/(M+(K-1)/V) for interleaved and looped BFS (M >= K),
//                        (K-1)/(3M+K-1) for ZB-H1 and ZB-H2 (M >= K), ((K-1)/2)/(3M+(K-1)/2)
//                        for ZB-V (M >= 2K-1) and DualPipeV (M >= 2K); 0 where none applies
//   overhead_us_per_op   (wall time of the step - the simulated makespan with the op durations
//                        measured in the same step) / (op slots on the critical path, that
//                        makespan / the mean op duration): what the executor adds to each op
//                        of the critical path, hand-overs between devices included
//   peak_activations_KiB the most activation bytes any device held (each micro-batch keeps
//                        4 KiB per stage from its forward to its backward_weight)
// The devices wait for each other's hand-overs by polling (host::WaitPolicy::spin), whatever K:
// the ops sleep so that K devices can pretend to have a core each on fewer cores, and a device
// with a core of its own polls (WaitPolicy::automatic's choice there), which costs the sleeping
// ops nothing here. --wait=automatic or --wait=block measures the other policies.
// Usage: bench_bubble [--op_us=1000] [--trace_dir=DIR] [--wait=spin|automatic|block]
//                     [Google Benchmark flags]
//   --trace_dir writes DIR/timeline_<schedule>_k4_m8.svg and .json: one traced K = 4, M = 8 step.
// bench_mpi_bubble measures the same with a rank per device.

#include "support/bubble.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <gpipe/gpipe.hpp>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "support/fixed_duration.hpp"

namespace {

gpipe::bench::BubbleFlags flags{.op_us = 1000, .trace_dir = ""};
gpipe::host::WaitPolicy wait = gpipe::host::WaitPolicy::spin;  // --wait

[[maybe_unused]] const bool registered = [] {
  gpipe::bench::fixed_duration_flags = &flags;
  gpipe::bench::register_bubble_benchmarks<gpipe::bench::FixedDurationLayer>(
      [](std::size_t k) {
        return std::make_unique<gpipe::host::Backend>(k, gpipe::host::BackendOptions{.wait = wait});
      },
      {.flags = &flags, .trace_stem = "timeline_", .where = "the host backend"});
  return true;
}();

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  using gpipe::host::WaitPolicy;
  constexpr std::pair<std::string_view, WaitPolicy> policies[] = {
      {"spin", WaitPolicy::spin},
      {"automatic", WaitPolicy::automatic},
      {"block", WaitPolicy::block}};
  std::string_view wait_name = "spin";
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = argv[i];
    if (!arg.starts_with("--wait=")) {
      argv[out++] = argv[i];
      continue;
    }
    const auto* found = std::find_if(std::begin(policies), std::end(policies),
                                     [&](const auto& p) { return arg.substr(7) == p.first; });
    if (found == std::end(policies)) {
      std::fprintf(stderr, "%s: --wait must be spin, automatic or block\n", argv[0]);
      return 1;
    }
    wait_name = found->first;
    wait = found->second;
  }
  *argc = out;
  if (!gpipe::bench::take_bubble_flags(argc, argv, flags)) return 1;
  benchmark::AddCustomContext("gpipe_op_us", std::to_string(flags.op_us));
  benchmark::AddCustomContext("gpipe_wait", std::string(wait_name));
  return 0;
}
