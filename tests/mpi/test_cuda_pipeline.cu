// mpi::CudaBackend (a GPU per rank, NCCL between ranks) under mpirun, one program built twice
// (tests/CMakeLists.txt):
//   test_mpi_cuda_pipeline_emulated  on the CUDA emulator, 1 to 4 ranks: each rank is a
//       machine of its own with two emulated GPUs, NCCL runs between the processes
//       (tests/support/cuda_emulation/nccl_net.hpp). Runs wherever CUDA's headers are.
//   test_mpi_cuda_pipeline           with nvcc, on the GPUs there are (1 and 2 ranks in CTest;
//       1 to 4 by hand: `mpirun -n 4 build/.../test_mpi_cuda_pipeline` on four GPUs; one rank
//       runs its device alone, without NCCL). NCCL needs
//       a GPU per rank: where a machine has fewer GPUs than ranks, what runs is the check that
//       mpi::CudaBackend refuses that with a clear error on every rank, and the program says it
//       skipped the rest; without a GPU it says skipped.
// What every MPI backend gives (support/mpi_conformance.hpp), against one process on
// cuda::Backend with as many virtual devices (the same kernels, so the same bits), with the
// schedule ordered for NCCL's rendezvous sends; a failed step aborts the NCCL communicators where
// a stream waits for a peer and makes new ones. With GPIPE_MPI_KILL_RANK=1 in the environment,
// rank 1 kills itself in the middle of a step instead: CTest expects mpirun to end the job with
// a failure, soon. A rank that stops sending, for a while or for good (GPIPE_MPI_STUCK_RANK=1):
// support/mpi_deadlines.hpp. A rank whose GPU work does not end (GPIPE_MPI_STUCK_GPU=1):
// run_stuck_gpu_step below.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpipe/mpi_cuda.cuh"
#include "support/faulty_layer.hpp"
#include "support/models.hpp"
#include "support/mpi_conformance.hpp"
#include "support/mpi_deadlines.hpp"
#include "support/stuck_gpu.cuh"

namespace {

using namespace gpipe;
using namespace gpipe::test;
using namespace gpipe::test::mpi_conformance;

// This rank's place among the ranks of its host (what picks its default GPU), and how many they
// are (MPI_COMM_TYPE_SHARED).
struct HostRanks {
  int rank = 0, size = 0;
};
HostRanks host_ranks() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  HostRanks out;
  MPI_Comm_rank(node, &out.rank);
  MPI_Comm_size(node, &out.size);
  MPI_Comm_free(&node);
  return out;
}

// How many ranks share this rank's GPUs. On the emulator every process is a machine of its own
// (its GPUs are its own), whatever host the processes share.
int ranks_on_this_machine() {
#ifdef GPIPE_CUDA_EMULATION
  return 1;
#else
  return host_ranks().size;
#endif
}

bool on_every_rank(bool own) {
  int all = own ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all != 0;
}

// What mpi::CudaBackend says, on this rank, when constructed with `options` ("" if it is not
// refused).
std::string refusal(mpi::CudaBackendOptions options = {}) {
  return error_of([&] { mpi::CudaBackend backend(MPI_COMM_WORLD, options); });
}

// With GPIPE_MPI_STUCK_GPU=1 in the environment, on 2 ranks with peer_timeout = 1 s: rank 0's
// forward of micro-batch 2 holds its GPU's compute stream for good (support/stuck_gpu.cuh), its
// host thread free. Rank 1, waiting in NCCL for that activation, fails at the deadline; rank 0's
// wait for its streams gives up at about the same time, its communicators aborted, on work of its
// own: every rank ends the step within a generous bound with rank 0's Error, which names its op,
// stage and micro-batch; the ranks stay together (the agreement completes), and the backends go
// without waiting for the held work, which is left running until the process ends. Each rank
// prints "rank r ended after t s ...: <its Error>" to stderr; the ranks then agree (MPI) whether
// every check held: exit status 0, else 1. Returns -1 when not asked for.
int run_stuck_gpu_step() {
  if (std::getenv("GPIPE_MPI_STUCK_GPU") == nullptr) return -1;
  using Model = Pipeline<Stage<Linear<4, 8>, stuck::HoldingIdentity<8>, ReLU>, Stage<Linear<8, 3>>>;
  constexpr std::chrono::milliseconds deadline{1000};
  constexpr std::chrono::seconds generous{20};  // a wait without a deadline would hang instead
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string message;
  bool lost = true;
  double seconds = 0;
  {
    mpi::CudaBackend backend(MPI_COMM_WORLD, {.peer_timeout = deadline});
    Trainer<Model, SoftmaxCrossEntropy, mpi::CudaBackend, OneFOneB> trainer(
        backend, {.micro_batches = faulty_micro_batches});
    stuck::armed = rank == 0;
    const auto start = std::chrono::steady_clock::now();
    message = error_of([&] {
      (void)trainer.forward_backward(random_inputs(faulty_batch, 4, 1),
                                     random_classes(faulty_batch, 3, 2));
    });
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lost = backend.lost_peers();
  }  // neither the trainer nor the backend waits for the held work (the CTest's timeout)
  std::fprintf(stderr, "rank %d ended after %.1f s (lost peers: %s): %s\n", rank, seconds,
               lost ? "yes" : "no", message.c_str());
  const auto has = [&](const char* part) {
    if (message.find(part) != std::string::npos) return true;
    std::fprintf(stderr, "rank %d: its Error does not say \"%s\"\n", rank, part);
    return false;
  };
  bool ok = has("gpipe: rank 0 failed: ") && has("within 1000 ms") &&
            has("stage 0 (device 0), micro-batch 2, forward has started and not finished");
  if (!message.starts_with("gpipe: rank 0 failed: ")) {
    std::fprintf(stderr, "rank %d: its Error is not rank 0's\n", rank);
    ok = false;
  }
  if (lost || seconds >= generous.count()) {
    std::fprintf(stderr, "rank %d: lost its peers, or ended past %lld s\n", rank,
                 static_cast<long long>(generous.count()));
    ok = false;
  }
  if (rank == 0 && (!stuck::held || stuck::released)) {
    std::fprintf(stderr, "rank 0: its GPU work was not held throughout\n");
    ok = false;
  }
  ok = on_every_rank(ok);
  if (rank == 0) std::fprintf(stderr, "stuck GPU: %s\n", ok ? "every check held" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

TEST_CASE("every schedule over NCCL between ranks gives the one-process step bit for bit") {
  mpi::CudaBackend backend;
  check_every_schedule<mpi::CudaBackend, cuda::Backend>(backend);
}

TEST_CASE("data-parallel replicas over NCCL give the one-process step on the whole batch") {
  check_replicas<mpi::CudaBackend, cuda::Backend>();
}

TEST_CASE("a tie between the first and the last rank's stages: one tensor, both gradients") {
  mpi::CudaBackend backend;
  check_ties_across_ranks<mpi::CudaBackend, cuda::Backend>(backend);
}

TEST_CASE("a tie across ranks with data-parallel replicas: one process's gradients and step") {
  check_tie_with_replicas<mpi::CudaBackend, cuda::Backend>();
}

TEST_CASE("a checkpoint saved by the ranks loads into one process and back, bit for bit") {
  mpi::CudaBackend backend;
  check_checkpoints_on_ranks<mpi::CudaBackend, cuda::Backend>(backend);
}

TEST_CASE("a throw on rank 1 ends the step on every rank with its error; the next step runs") {
  mpi::CudaBackend backend;
  if (backend.num_devices() != 3) return;  // FaultyModel has three stages
  check_fault_ends_the_step_everywhere<GPipe, mpi::CudaBackend, cuda::Backend>(backend);
  check_fault_ends_the_step_everywhere<OneFOneB, mpi::CudaBackend, cuda::Backend>(backend);
}

TEST_CASE(
    "a rank that stops sending mid-step past peer_timeout: every rank ends the step with an "
    "Error naming what waited and the silent rank, and the next step runs") {
  mpi_deadlines::check_stalled_rank<mpi::CudaBackend, cuda::Backend, OneFOneB>();
}

TEST_CASE("a training step's wall time over all ranks, from the trainer") {
  mpi::CudaBackend backend;
  check_step_wall_times(backend);
}

TEST_CASE("bad input on one rank alone ends the step on every rank with its error") {
  mpi::CudaBackend backend;
  check_inputs_refused_on_one_rank<mpi::CudaBackend, cuda::Backend>(backend);
}

TEST_CASE("bad input on one rank of one replica: the replicas' gradient sums stay in step") {
  check_input_refused_in_one_replica<mpi::CudaBackend, cuda::Backend>();
}

TEST_CASE("the world, a replica count that does not fit, another rank's device") {
  mpi::CudaBackend backend;
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CHECK(backend.world_size() == static_cast<std::size_t>(size));
  CHECK(backend.rank() == static_cast<std::size_t>(rank));
  // the rank's place among the ranks of its machine, modulo the GPUs there
  CHECK(backend.gpu() == host_ranks().rank % cuda::device_count());
  CHECK_THROWS_WITH_AS(
      mpi::CudaBackend(MPI_COMM_WORLD, {.data_parallel = backend.world_size() + 1}),
      doctest::Contains("which is not data_parallel"), Error);
  // out of memory names the rank's pipeline device, not the local cuda::Backend's 0
  {
    mpi::CudaBackend small(MPI_COMM_WORLD, {.device_capacity = 1024});
    const std::string expected =
        "out of memory on device " + std::to_string(small.device()) + ": allocating 4096 bytes";
    CHECK_THROWS_WITH_AS((void)small.allocate<float>(small.device(), 1024),
                         doctest::Contains(expected.c_str()), OutOfMemory);
  }
  if (backend.num_devices() == 1) return;  // no other rank's device
  const std::size_t other = (backend.rank() + 1) % backend.num_devices();
  CHECK_THROWS_WITH_AS((void)backend.allocate<float>(other, 4),
                       doctest::Contains("belongs to rank"), Error);
}

TEST_CASE("messages a receiver posts in another order than their sender fail the step") {
  // NCCL has no tags: a pair's messages match in the order they are posted, so two same-sized
  // messages received crossed would swap silently. The step's end (the transport's finish_step,
  // whose agreement is mpi::CudaBackend::agree) compares what each rank sent to each peer with
  // what the peer received, in order, and fails the step on every rank.
  mpi::CudaBackend backend;
  if (backend.num_devices() != 2) return;
  constexpr std::size_t count = 16;
  const WorkLabel label{.what = "crossed messages"};
  for (const bool crossed : {true, false}) {
    CAPTURE(crossed);
    cuda::Buffer<float> first, second;
    if (backend.device() == 0) {
      first = backend.allocate<float>(0, count);
      second = backend.allocate<float>(0, count);
      backend.send(0, label, 1, 0, first);
      backend.send(0, label, 1, 2, second);
    } else {
      backend.receive(1, label, 0, crossed ? 2 : 0, first, count, MemoryKind::activations);
      backend.receive(1, label, 0, crossed ? 0 : 2, second, count, MemoryKind::activations);
    }
    const std::string message =
        error_of([&] { transport::Transport<mpi::CudaBackend>(backend).finish_step(); });
    CAPTURE(message);
    if (crossed) {
      CHECK(message.find("the NCCL activations from device 0 to device 1 were posted in another "
                         "order") != std::string::npos);
    } else {
      CHECK(message.empty());
    }
  }
}

TEST_CASE("ranks of one communicator on one GPU: every rank refuses, naming both, before NCCL") {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) return;  // nobody to share a GPU with
#ifdef GPIPE_CUDA_EMULATION
  // every process claims the same machine, so GPU 0 is one device for all of them
  auto& machine = gpipe::test::cuda_emulation::machine();
  const std::uint64_t own_machine = machine.id;
  machine.id = 1;
#else
  if (!on_every_rank(ranks_on_this_machine() == size)) return;  // ranks on several machines
#endif
  const std::string message = refusal({.gpu = 0});
  CAPTURE(message);
  CHECK(message.starts_with("gpipe: mpi::CudaBackend: ranks 0 and 1 both run on GPU 0 of "));
  CHECK(message.find("NCCL needs a GPU of its own for each rank") != std::string::npos);
  // replicas of one stage share a communicator too: two replicas of a one-device pipeline
  CHECK(refusal({.data_parallel = static_cast<std::size_t>(size), .gpu = 0})
            .starts_with("gpipe: mpi::CudaBackend: ranks 0 and 1 both run on GPU 0 of "));
#ifdef GPIPE_CUDA_EMULATION
  machine.id = own_machine;
  CHECK(refusal({.gpu = 0}).empty());  // machines of their own: GPU 0 is a GPU per rank
#endif
}

int main(int argc, char** argv) {
  mpi::Session session(argc, argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int gpus = cuda::device_count();
  if (!on_every_rank(gpus > 0)) {
    if (rank == 0) std::printf("skipped: a rank's machine has no usable GPU\n");
    return 0;
  }
  const int here = ranks_on_this_machine();  // collective: on every rank, once
  if (!on_every_rank(here <= gpus)) {
    // More ranks than the GPUs each sees: NCCL cannot run unless the ranks see different GPUs
    // (CUDA_VISIBLE_DEVICES per rank). What runs is the default layout (a rank per GPU, modulo):
    // refused on every rank, or built on every rank (distinct GPUs: the tests run below).
    const std::string message = refusal();
    const bool refused = on_every_rank(message.find("both run on GPU") != std::string::npos);
    const bool built = on_every_rank(message.empty());
    if (!built) {
      if (rank == 0) {
        if (refused)
          std::printf(
              "skipped: %d ranks on a machine of %d GPU(s), and NCCL needs a GPU per rank: no "
              "pipeline ran across GPUs. Ran: mpi::CudaBackend refuses the shared GPU on every "
              "rank with\n  %s\n",
              here, gpus, message.c_str());
        else
          std::printf(
              "FAILED: %d ranks on %d GPU(s) were neither refused nor built on every "
              "rank; rank 0: %s\n",
              here, gpus, message.empty() ? "(built)" : message.c_str());
      }
      return refused ? 0 : 1;
    }
  }
  if (run_killed_rank_step<mpi::CudaBackend>()) return 0;  // see the top of this file
  if (mpi_deadlines::run_stuck_rank_step<mpi::CudaBackend>()) return 0;
  if (const int status = run_stuck_gpu_step(); status >= 0) return status;
  return run_mpi_tests(argc, argv);
}
