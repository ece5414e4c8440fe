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
//   thrown between steps  (GPIPE_MPI_THROW_BETWEEN_STEPS=1, a CTest case of its own) with
//            peer_timeout = 60 s, rank 1's Trainer::step runs out of its device's memory (the
//            optimizer's state) while rank 0's succeeds; rank 0's next step ends within a few
//            seconds, not at the deadline, with an Error naming rank 1, Trainer::step and the
//            failure; then the backends end the job.

#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
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

// With GPIPE_MPI_THROW_BETWEEN_STEPS=1 in the environment, on 2 ranks: see "thrown between steps"
// at the top of this file. Each rank prints "rank r ended after t s ..." to stderr (what the CTest
// case looks for). Returns whether it ran.
template <class Backend>
bool run_throw_between_steps() {
  if (std::getenv("GPIPE_MPI_THROW_BETWEEN_STEPS") == nullptr) return false;
  using Wide = Pipeline<Stage<Linear<4, 64>>, Stage<Linear<64, 64>, Linear<64, 3>>>;
  constexpr std::chrono::milliseconds long_deadline{60'000};
  const std::vector<float> x = random_inputs(4, 4, 1);
  const std::vector<std::int32_t> y = random_classes(4, 3, 2);
  const optim::AdamW adamw(optim::AdamW::Options{.lr = 1e-3});
  // what a step takes on each rank's device, without the optimizer's state
  std::size_t peak = 0;
  {
    Backend backend(MPI_COMM_WORLD, {.peer_timeout = long_deadline});
    Trainer<Wide, SoftmaxCrossEntropy, Backend> trainer(backend, {.micro_batches = 2});
    (void)trainer.forward_backward(x, y);
    peak = backend.memory_stats(backend.device()).peak;
    // AdamW's two moments (of 64 x 64 + 64 x 3 parameters and biases) do not fit in the peak
    const std::size_t current = backend.memory_stats(backend.device()).current;
    if (backend.rank() == 1 && peak - current >= 2 * sizeof(float) * (64 * 64 + 64 * 3))
      std::fprintf(stderr, "rank 1: the optimizer's state would fit: no failure to test\n");
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Backend backend(MPI_COMM_WORLD,
                  {.device_capacity = rank == 1 ? peak : 0, .peer_timeout = long_deadline});
  Trainer<Wide, SoftmaxCrossEntropy, Backend> trainer(backend, {.micro_batches = 2});
  const auto start = std::chrono::steady_clock::now();
  try {
    // rank 0 may learn of rank 1's failure in this step's end already (the loss's broadcast)
    (void)trainer.forward_backward(x, y);
    trainer.step(adamw);  // out of memory on rank 1 alone
    (void)trainer.forward_backward(x, y);
    std::fprintf(stderr, "rank %d: the next step ran although rank 1 failed\n", rank);
  } catch (const Error& e) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(
        stderr, "rank %d ended after %.1f s, %s half the peer_timeout (lost peers: %s): %s\n", rank,
        seconds, seconds < 30 ? "within" : "past", backend.lost_peers() ? "yes" : "no", e.what());
  }
  // rank 1 goes on a while (its own code between steps) before its backend ends the job, so that
  // rank 0 ends on its own first
  if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  return true;
}

}  // namespace gpipe::test::mpi_deadlines
