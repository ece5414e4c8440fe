// Token models on the CUDA backend (tests/cuda/test_token_models.cu: a GPT against the double
// reference, a tied head, predict against the host), compiled by the host compiler and run on the
// emulated CUDA runtime and cuBLAS of tests/support/cuda_emulation.hpp.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_token_models.cu"

// Named, so that every emulated test compiles into one program (tests/CMakeLists.txt).
namespace emulated_token_models {

using namespace cuda_token_models;  // the .cu file's models and helpers

TEST_CASE("emulated: every kernel launch and GEMM of a GPT step has its launch record") {
  auto& counts = gpipe::test::cuda_emulation::counts();
  std::size_t kernels = 0, gemms = 0;  // what the emulator ran during the step
  auto counted = [&](const std::function<void()>& step) {
    const std::size_t k0 = counts.kernels(), g0 = counts.gemms();
    step();
    kernels = counts.kernels() - k0;
    gemms = counts.gemms() - g0;
  };
  auto check = [&](const std::vector<gpipe::cuda::LaunchRecord>& records) {
    std::size_t recorded_kernels = 0, recorded_gemms = 0;
    for (const gpipe::cuda::LaunchRecord& r : records) {
      recorded_kernels += r.kind == gpipe::cuda::LaunchKind::kernel ? 1 : 0;
      recorded_gemms += r.kind == gpipe::cuda::LaunchKind::gemm ? 1 : 0;
    }
    CHECK(kernels > 0);
    CHECK(recorded_kernels == kernels);
    CHECK(recorded_gemms == gemms);
  };
  check(recorded_step<Gpt1>(1, counted));
  check(recorded_step<Gpt4>(3, counted));
  check(recorded_step<Gpt1, gpipe::MixedBf16>(1, counted));
  check(recorded_step<Gpt4, gpipe::MixedBf16>(3, counted));
}

}  // namespace emulated_token_models
