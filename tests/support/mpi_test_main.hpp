#pragma once
// main's body for the test programs that run under mpirun, once MPI is up: runs the doctest cases
// on every rank, reports from rank 0 alone, and fails on every rank if any rank failed.

#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>

namespace gpipe::test {

inline int run_mpi_tests(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) context.setOption("out", "/dev/null");  // one report, from rank 0
  int failed = context.run() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && !failed)
    std::fprintf(stderr, "rank %d: passed, but another rank failed\n", rank);
  return any_failed;
}

}  // namespace gpipe::test
