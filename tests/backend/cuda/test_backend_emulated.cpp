// The CUDA backend's own tests (tests/cuda/test_backend.cu: event order, the stream-ordered
// allocator, failures, tracing, a failing Trainer step, the multi-GPU cases), compiled by the
// host compiler and run on the emulated CUDA runtime of tests/support/cuda_emulation.hpp
// with two emulated GPUs. The suite "without a GPU" is left out (CTest passes
// --test-suite-exclude); the same check runs here with the emulator's GPUs taken away.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_backend.cu"

TEST_CASE("emulated: a backend on a machine without a GPU is a gpipe::Error that says so") {
  auto& machine = gpipe::test::cuda_emulation::machine();
  const int gpus = std::exchange(machine.gpus, 0);
  const std::string message = error_of([] { Backend backend(1); });
  machine.gpus = gpus;
  CHECK(contains(message, "gpipe: cuda::Backend needs a CUDA GPU"));
  CHECK(contains(message, "cudaErrorNoDevice"));
}

TEST_CASE("emulated: a GPU that runs out of memory is an OutOfMemory that names the device") {
  auto& machine = gpipe::test::cuda_emulation::machine();
  const std::size_t memory = std::exchange(machine.gpu_memory, std::size_t{1} << 20);
  {
    Backend backend(2);
    auto small = backend.allocate<float>(1, 1000);
    const std::string message =
        error_of<gpipe::OutOfMemory>([&] { auto big = backend.allocate<float>(1, 1 << 20); });
    CHECK(contains(message, "out of memory on device 1 (GPU 1)"));
    CHECK(backend.memory_stats(1).current == 1000 * sizeof(float));
  }
  machine.gpu_memory = memory;
}
