// bench_bubble's measurement (bench/bubble.cpp: the same layer, counters and benchmark names)
// with one MPI rank per device: run it under `mpirun -n K` and it measures the K-device
// pipelines, activations and gradients crossing between processes as MPI messages
// (gpipe::mpi::Backend). Compare with bench_bubble's rows of the same K in one process
// (BENCHMARKS.md, "Across processes"). Every rank runs every benchmark for the same number of
// steps (--steps, not a time: the ranks must agree); rank 0 prints and writes the results.
// Usage: mpirun -n K bench_mpi_bubble [--op_us=1000] [--steps=20] [--trace_dir=DIR]
//          [Google Benchmark flags]
//   --trace_dir writes DIR/timeline_mpi_<schedule>_k<K>_m8.svg and .json: one traced M = 8 step,
//   the work of every rank in one timeline.

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <gpipe/gpipe.hpp>
#include <gpipe/mpi.hpp>
#include <memory>
#include <string_view>

#include "support/bubble.hpp"
#include "support/fixed_duration.hpp"
#include "support/mpi_flags.hpp"

namespace {

gpipe::bench::BubbleFlags flags{.op_us = 1000, .trace_dir = ""};
std::unique_ptr<gpipe::mpi::Session> session;  // finalizes MPI after main returns

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags: MPI, this
// program's flags, and the benchmarks of K = the world size.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  session = std::make_unique<gpipe::mpi::Session>(*argc, argv);
  const long steps = gpipe::bench::take_count(argc, argv, "steps", 20);
  if (!gpipe::bench::take_bubble_flags(argc, argv, flags)) return 1;
  if (steps == 0) {
    std::fprintf(stderr, "%s: --steps must be a positive number\n", argv[0]);
    return 1;
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != 0) gpipe::bench::quiet(argc, argv);
  const auto k = static_cast<std::size_t>(size);
  if (k != 1 && k != 2 && k != 4 && k != 8) {
    std::fprintf(stderr, "%s: run it with 1, 2, 4 or 8 ranks (mpirun -n K), not %zu\n", argv[0], k);
    return 1;
  }
  gpipe::bench::fixed_duration_flags = &flags;
  gpipe::bench::register_bubble_benchmarks<gpipe::bench::FixedDurationLayer>(
      [](std::size_t) { return std::make_unique<gpipe::mpi::Backend>(); },
      {.flags = &flags,
       .trace_stem = "timeline_mpi_",
       .where = "MPI, a rank per device",
       .iterations = steps,
       .only_k = k,
       .trace_k = k});
  return 0;
}
