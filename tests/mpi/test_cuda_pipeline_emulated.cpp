// mpi::CudaBackend (a GPU per rank, NCCL between ranks) under mpirun on 2, 3 and 4 ranks
// (tests/CMakeLists.txt), each rank on the CUDA emulator (its own emulated machine of two GPUs;
// NCCL between the processes: tests/support/cuda_emulation/nccl_net.hpp). With one rank per
// device, every schedule gives bit for bit the loss, the gradients of each rank's own stages, the
// predictions, the parameters after an optimizer step and the saved file that one process gives
// on cuda::Backend with as many virtual devices (the same kernels, so the same bits). With
// data-parallel replicas (2 x 2 ranks) two steps without zero_grad match one process on the
// whole batch to float rounding. A throw on rank 1 at micro-batch 2 ends the step on every rank
// with one Error naming rank, stage, micro-batch and the original message (NCCL communicators
// aborted where a stream waits for a peer, and made anew), and the next step is right. With
// GPIPE_MPI_KILL_RANK=1 in the environment, rank 1 kills itself in the middle of a step instead:
// CTest expects mpirun to end the job with a failure, soon.
//
// Each rank runs the one-process reference itself (same seed, same data). CHECK only (no
// REQUIRE): a rank that left a test case early would leave the others waiting in a collective.

#include "support/cuda_emulation.hpp"
// the emulator first: it defines the CUDA, cuBLAS and NCCL functions the backend calls

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpipe/mpi_cuda.cuh"
#include "support/faulty_layer.hpp"
#include "support/models.hpp"
#include "support/relative_error.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

using Model8 = Pipeline<Stage<L0>, Stage<L1>, Stage<L2>, Stage<L3>, Stage<L4>, Stage<L5>, Stage<L6>,
                        Stage<Linear<5, 5>>>;

constexpr std::size_t rows = 16;
constexpr std::uint64_t seed = 7;

std::vector<char> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

template <class Model, class Kind>
void check_against_one_process(mpi::CudaBackend& backend) {
  using Loss = SoftmaxCrossEntropy;
  constexpr std::size_t devices = Model::num_stages / Kind::chunks_per_device;
  CHECK(backend.num_devices() == devices);
  const std::vector<float> x = random_inputs(rows, Model::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 11);
  for (std::size_t m : {1u, 3u, 8u}) {
    for (Remat remat : {Remat::never, Remat::always}) {
      CAPTURE(Kind::name);
      CAPTURE(m);
      CAPTURE(to_string(remat));
      CAPTURE(backend.rank());
      cuda::Backend one_process(devices);
      Trainer<Model, Loss, cuda::Backend, Kind> reference(
          one_process, {.micro_batches = m, .remat = remat, .seed = seed});
      Trainer<Model, Loss, mpi::CudaBackend, Kind> trainer(
          backend, {.micro_batches = m, .remat = remat, .seed = seed});
      // NCCL's rendezvous rule: the same compute order, transfers placed for it
      CHECK(trainer.schedule() == order_for_rendezvous(reference.schedule()));

      CHECK(trainer.forward_backward(x, y) == reference.forward_backward(x, y));
      std::size_t mine = 0;
      for (const ParameterInfo& info : trainer.parameter_info()) {
        if (!backend.is_local(trainer.device_of_stage(info.stage))) continue;
        CAPTURE(info.name);
        CHECK(trainer.gradient(info.name) == reference.gradient(info.name));
        ++mine;
      }
      CHECK(mine > 0);
      CHECK(trainer.predict(x) == reference.predict(x));

      const optim::SGD sgd({.lr = 0.1, .momentum = 0.9});
      trainer.step(sgd);
      reference.step(sgd);
      for (const ParameterInfo& info : trainer.parameter_info())
        if (backend.is_local(trainer.device_of_stage(info.stage)))
          CHECK(trainer.parameter(info.name) == reference.parameter(info.name));

      const std::string name = "saved_" + std::to_string(devices) + ".safetensors";
      trainer.save(name);
      if (backend.rank() == 0) {
        reference.save("reference_" + name);
        CHECK(file_bytes(name) == file_bytes("reference_" + name));
      }
      MPI_Barrier(backend.communicator());
      trainer.load(name);
    }
  }
}

template <class Model, class Kind>
void check_data_parallel(std::size_t replicas) {
  using Loss = SoftmaxCrossEntropy;
  constexpr std::size_t devices = Model::num_stages / Kind::chunks_per_device;
  mpi::CudaBackend backend(MPI_COMM_WORLD, {.data_parallel = replicas});
  CHECK(backend.num_devices() == devices);
  CHECK(backend.replicas() == replicas);
  constexpr std::size_t batch = 23;  // shares differ by one row
  const std::vector<float> x = random_inputs(batch, Model::in_features, 5);
  const std::vector<std::int32_t> y = random_classes(batch, Model::out_features, 13);
  for (std::size_t m : {1u, 3u}) {
    CAPTURE(Kind::name);
    CAPTURE(m);
    CAPTURE(backend.rank());
    cuda::Backend one_process(devices);
    Trainer<Model, Loss, cuda::Backend, Kind> reference(one_process,
                                                        {.micro_batches = m, .seed = seed});
    Trainer<Model, Loss, mpi::CudaBackend, Kind> trainer(backend,
                                                         {.micro_batches = m, .seed = seed});
    for (int step = 0; step < 2; ++step) {
      CAPTURE(step);
      const float loss = trainer.forward_backward(x, y);
      const float expected = reference.forward_backward(x, y);
      CHECK(std::abs(loss - expected) <= 1e-6 * std::abs(expected));
    }
    for (const ParameterInfo& info : trainer.parameter_info()) {
      if (!backend.is_local(trainer.device_of_stage(info.stage))) continue;
      CAPTURE(info.name);
      CHECK(relative_error(trainer.gradient(info.name), reference.gradient(info.name)) < 1e-6);
    }
  }
}

// Identity that kills its process (rank 1's) in the forward of micro-batch 2.
struct KillingIdentity : FaultyIdentity<8> {
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    if (a.rows == faulty_rows) std::raise(SIGKILL);
    ctx.copy(a.rows * 8, a.x, a.y);
  }
};
using KillingModel = Pipeline<Stage<Linear<4, 8>, ReLU>, Stage<Linear<8, 8>, KillingIdentity, ReLU>,
                              Stage<Linear<8, 3>>>;

}  // namespace

TEST_CASE("every schedule over NCCL between ranks gives the one-process step bit for bit") {
  mpi::CudaBackend backend;
  switch (backend.num_devices()) {
    case 2:
      check_against_one_process<Model2, GPipe>(backend);
      check_against_one_process<Model2, OneFOneB>(backend);
      check_against_one_process<Model2, ZeroBubbleH1>(backend);
      check_against_one_process<Model4, Interleaved<2>>(backend);
      break;
    case 3:
      check_against_one_process<Model3, GPipe>(backend);
      check_against_one_process<Model3, OneFOneB>(backend);
      check_against_one_process<Model3, ZeroBubbleH1>(backend);
      break;
    case 4:
      check_against_one_process<Model4, GPipe>(backend);
      check_against_one_process<Model4, OneFOneB>(backend);
      check_against_one_process<Model4, ZeroBubbleH1>(backend);
      check_against_one_process<Model8, Interleaved<2>>(backend);
      break;
    default:
      FAIL("run with 2, 3 or 4 ranks, got " << backend.num_devices());
  }
}

TEST_CASE("data-parallel replicas over NCCL give the one-process step on the whole batch") {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 4) {  // 2 replicas x 2 devices
    check_data_parallel<Model2, OneFOneB>(2);
    check_data_parallel<Model2, GPipe>(2);
  }
  check_data_parallel<Model1, GPipe>(static_cast<std::size_t>(size));  // plain data parallel
}

TEST_CASE("a throw on rank 1 ends the step on every rank with its error; the next step runs") {
  mpi::CudaBackend backend;
  if (backend.num_devices() != 3) return;  // FaultyModel has three stages
  const std::vector<float> x = random_inputs(faulty_batch, 4, 1);
  const std::vector<std::int32_t> y = random_classes(faulty_batch, 3, 2);
  const auto check = [&]<class Kind>(Kind*) {
    for (Fault fault : {Fault::forward, Fault::backward_input}) {
      CAPTURE(Kind::name);
      CAPTURE(backend.rank());
      Trainer<FaultyModel, SoftmaxCrossEntropy, mpi::CudaBackend, Kind> trainer(
          backend, {.micro_batches = faulty_micro_batches, .seed = 1});
      injected_fault = fault;
      const std::string message = error_of([&] { (void)trainer.forward_backward(x, y); });
      injected_fault = Fault::none;
      CAPTURE(message);
      CHECK(message.starts_with("gpipe: rank 1 failed: stage 1 (device 1), micro-batch 2, "));
      CHECK(message.ends_with(fault == Fault::forward ? "injected forward failure"
                                                      : "injected backward failure"));
      cuda::Backend one_process(3);
      Trainer<FaultyModel, SoftmaxCrossEntropy, cuda::Backend, Kind> reference(
          one_process, {.micro_batches = faulty_micro_batches, .seed = 1});
      trainer.zero_grad();
      CHECK(trainer.forward_backward(x, y) == reference.forward_backward(x, y));
    }
  };
  check(static_cast<GPipe*>(nullptr));
  check(static_cast<OneFOneB*>(nullptr));
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
  if (std::getenv("GPIPE_MPI_KILL_RANK") != nullptr) {  // rank 1 dies mid-step: see CMakeLists
    mpi::CudaBackend backend;
    Trainer<KillingModel, SoftmaxCrossEntropy, mpi::CudaBackend, OneFOneB> trainer(
        backend, {.micro_batches = faulty_micro_batches});
    (void)trainer.forward_backward(random_inputs(faulty_batch, 4, 1),
                                   random_classes(faulty_batch, 3, 2));
    std::fprintf(stderr, "rank %zu: the step ended although rank 1 died\n", backend.rank());
    return 0;
  }
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
