// A Llama on the CUDA backend (tests/cuda/test_llama_models.cu: against the double reference, in
// MixedBf16 against Fp32, predict against the host), compiled by the host compiler and run on the
// emulated CUDA runtime and cuBLAS of tests/support/cuda_emulation.hpp; and the launch records of
// a Llama step (gpipe/backend/cuda/launch_log.cuh) against what the emulator ran.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_llama_models.cu"

// Named, so that every emulated test compiles into one program (tests/CMakeLists.txt).
namespace emulated_llama_models {

using namespace cuda_llama_models;  // the .cu file's models and helpers

TEST_CASE("emulated: every kernel launch and GEMM of a Llama step has its launch record") {
  using namespace gpipe;
  auto& counts = test::cuda_emulation::counts();
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    const std::vector<std::int32_t> tokens = llama_tokens(6), targets = llama_tokens(7);
    cuda::Backend backend(Llama4::num_stages);
    auto step = [&]<class Precision>() {
      Trainer<Llama4, SoftmaxCrossEntropy, cuda::Backend, OneFOneB, Precision> trainer(
          backend, {.micro_batches = 3, .seed = 5});
      cuda::LaunchRecorder recorder;
      const std::size_t k0 = counts.kernels(), g0 = counts.gemms();
      trainer.zero_grad();
      trainer.forward_backward(tokens, targets);
      trainer.step(optim::AdamW{});
      backend.synchronize();
      std::size_t kernels = 0, gemms = 0;
      for (const cuda::LaunchRecord& r : recorder.records()) {
        kernels += r.kind == cuda::LaunchKind::kernel ? 1 : 0;
        gemms += r.kind == cuda::LaunchKind::gemm ? 1 : 0;
      }
      CHECK(kernels > 0);
      CHECK(kernels == counts.kernels() - k0);
      CHECK(gemms == counts.gemms() - g0);
    };
    if (bf16)
      step.operator()<MixedBf16>();
    else
      step.operator()<Fp32>();
  }
}

}  // namespace emulated_llama_models
