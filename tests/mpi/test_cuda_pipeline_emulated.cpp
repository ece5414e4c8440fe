// mpi::CudaBackend (a GPU per rank, NCCL between ranks) under mpirun on 2, 3 and 4 ranks
// (tests/CMakeLists.txt), each rank on the CUDA emulator (its own emulated machine of two GPUs;
// NCCL between the processes: tests/support/cuda_emulation/nccl_net.hpp): what every MPI backend
// gives (support/mpi_conformance.hpp), against one process on cuda::Backend with as many virtual
// devices (the same kernels, so the same bits), with the schedule ordered for NCCL's rendezvous
// sends; a failed step aborts the NCCL communicators where a stream waits for a peer and makes
// new ones. With GPIPE_MPI_KILL_RANK=1 in the environment, rank 1 kills itself in the middle of a
// step instead: CTest expects mpirun to end the job with a failure, soon.

#include "support/cuda_emulation.hpp"
// the emulator first: it defines the CUDA, cuBLAS and NCCL functions the backend calls

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpipe/mpi_cuda.cuh"
#include "support/faulty_layer.hpp"
#include "support/models.hpp"
#include "support/mpi_conformance.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;
using namespace gpipe::test::mpi_conformance;

}  // namespace

TEST_CASE("every schedule over NCCL between ranks gives the one-process step bit for bit") {
  mpi::CudaBackend backend;
  check_every_schedule<mpi::CudaBackend, cuda::Backend>(backend);
}

TEST_CASE("data-parallel replicas over NCCL give the one-process step on the whole batch") {
  check_replicas<mpi::CudaBackend, cuda::Backend>();
}

TEST_CASE("a throw on rank 1 ends the step on every rank with its error; the next step runs") {
  mpi::CudaBackend backend;
  if (backend.num_devices() != 3) return;  // FaultyModel has three stages
  check_fault_ends_the_step_everywhere<GPipe, mpi::CudaBackend, cuda::Backend>(backend);
  check_fault_ends_the_step_everywhere<OneFOneB, mpi::CudaBackend, cuda::Backend>(backend);
}

TEST_CASE("the world, a replica count that does not fit, another rank's device") {
  mpi::CudaBackend backend;
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CHECK(backend.world_size() == static_cast<std::size_t>(size));
  CHECK(backend.rank() == static_cast<std::size_t>(rank));
  CHECK(backend.gpu() == rank % 2);  // the rank's place on its machine, modulo its two GPUs
  CHECK_THROWS_WITH_AS(
      mpi::CudaBackend(MPI_COMM_WORLD, {.data_parallel = backend.world_size() + 1}),
      doctest::Contains("which is not data_parallel"), Error);
  const std::size_t other = (backend.rank() + 1) % backend.num_devices();
  CHECK_THROWS_WITH_AS((void)backend.allocate<float>(other, 4),
                       doctest::Contains("belongs to rank"), Error);
}

int main(int argc, char** argv) {
  mpi::Session session(argc, argv);
  if (run_killed_rank_step<mpi::CudaBackend>()) return 0;  // see the top of this file
  return run_mpi_tests(argc, argv);
}
