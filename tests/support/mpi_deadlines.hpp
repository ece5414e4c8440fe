#pragma once
// What every MPI backend does with a rank that stops sending without failing (its layer holds its
// device in the middle of a step), written once for mpi::Backend and mpi::CudaBackend. On 2 ranks,
// with Options::peer_timeout = 1 s:
//   stalled  rank 0 holds micro-batch 2's forward for 1.5 s: rank 1, waiting for that activation,
//            fails the step at 1 s and tells rank 0, which stops once its forward returns; every
//            rank throws rank 1's Error, naming the op, stage and micro-batch that waited and the
//            rank that did not send; the next step is the one-process step.
//   stuck    (GPIPE_MPI_STUCK_RANK=1 in the environment, a CTest case of its own) rank 0 holds it
//            for a minute: rank 1 ends with that Error within twice the deadline, and then its
//            backend ends the job (MPI_Abort), so that the stuck rank does not outlive it.

#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/faulty_layer.hpp"
#include "support/models.hpp"

namespace gpipe::test::mpi_deadlines {

using StallingModel = Pipeline<Stage<Linear<4, 8>, ReLU, FaultyIdentity<8>>, Stage<Linear<8, 3>>>;
inline constexpr std::chrono::milliseconds deadline{1000};

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// The Error that rank 1 names: the op, stage and micro-batch that waited, and the silent rank.
inline void check_names_the_silent_rank(const std::string& message) {
  CAPTURE(message);
  CHECK(message.starts_with("gpipe: rank 1 failed: "));
  CHECK(message.find("waited 1000 ms for ") != std::string::npos);
  // on NCCL, with the transfers posted with it in one group
  CHECK(message.find("stage 0's activation of micro-batch 2 from rank 0") != std::string::npos);
  CHECK(message.find("recv_activation") != std::string::npos);
  CHECK(message.find("Options::peer_timeout") != std::string::npos);
}

template <class Backend, class OneProcess, class Kind>
void check_stalled_rank() {
  if (world_size() != 2) return;
  Backend backend(MPI_COMM_WORLD, {.peer_timeout = deadline});
  CHECK(backend.peer_timeout() == deadline);
  const std::vector<float> x = random_inputs(faulty_batch, 4, 1);
  const std::vector<std::int32_t> y = random_classes(faulty_batch, 3, 2);
  Trainer<StallingModel, SoftmaxCrossEntropy, Backend, Kind> trainer(
      backend, {.micro_batches = faulty_micro_batches, .seed = 1});
  stall_ms = 1500;
  injected_fault = backend.rank() == 0 ? Fault::stall_forward : Fault::none;
  std::string message;
  try {
    (void)trainer.forward_backward(x, y);
  } catch (const Error& e) {
    message = e.what();
  }
  injected_fault = Fault::none;
  check_names_the_silent_rank(message);
  CHECK_FALSE(backend.lost_peers());
  // the trainer goes on: the next step is the one-process step
  OneProcess one_process(2);
  Trainer<StallingModel, SoftmaxCrossEntropy, OneProcess, Kind> reference(
      one_process, {.micro_batches = faulty_micro_batches, .seed = 1});
  trainer.zero_grad();
  CHECK(trainer.forward_backward(x, y) == reference.forward_backward(x, y));
}

// With GPIPE_MPI_STUCK_RANK=1 in the environment, on 2 ranks: see "stuck" at the top of this
// file. Rank 1 prints "rank 1 ended: <its Error>" to stderr (what the CTest case looks for);
// then its backend ends the job. Returns whether it ran.
template <class Backend>
bool run_stuck_rank_step() {
  if (std::getenv("GPIPE_MPI_STUCK_RANK") == nullptr) return false;
  Backend backend(MPI_COMM_WORLD, {.peer_timeout = deadline});
  Trainer<StallingModel, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
      backend, {.micro_batches = faulty_micro_batches});
  stall_ms = 60'000;
  injected_fault = backend.rank() == 0 ? Fault::stall_forward : Fault::none;
  try {
    (void)trainer.forward_backward(random_inputs(faulty_batch, 4, 1),
                                   random_classes(faulty_batch, 3, 2));
    std::fprintf(stderr, "rank %zu: the step ended although rank 0 was stuck\n", backend.rank());
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %zu ended (lost peers: %s): %s\n", backend.rank(),
                 backend.lost_peers() ? "yes" : "no", e.what());
  }
  return true;
}

}  // namespace gpipe::test::mpi_deadlines
