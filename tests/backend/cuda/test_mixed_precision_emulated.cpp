// gpipe::MixedBf16 on the CUDA backend (tests/cuda/test_mixed_precision.cu: conversions, the bf16
// GEMM, GPT steps against Fp32 and the host, remat, memory, inference, an MLP), compiled by the
// host compiler and run on the emulated CUDA runtime and cuBLAS (cublasGemmEx) of
// tests/support/cuda_emulation.hpp.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_mixed_precision.cu"

// Named, so that every emulated test compiles into one program (tests/CMakeLists.txt).
namespace emulated_mixed_precision {

using namespace cuda_mixed_precision;  // the .cu file's models and helpers

// The launches of a GPT step's optimizer, counted by the emulator: AdamW (Decay::matrices, whose
// groups alternate within every block) is one launch per device and step, in Fp32 and MixedBf16;
// under MixedBf16 the first step rounds each stage's weights to bf16 once, and after an AdamW
// step, which wrote the bf16 copy itself, the next step rounds none.
namespace {

using gpipe::test::cuda_emulation::launches_of;

std::size_t adamw_launches() {
  return launches_of(gpipe::cuda::adamw_update_ranges_kernel<4>) +
         launches_of(gpipe::cuda::adamw_update_ranges_kernel<1>);
}
std::size_t per_range_adamw_launches() {
  return launches_of(gpipe::cuda::adamw_update_kernel<4>) +
         launches_of(gpipe::cuda::adamw_update_kernel<1>);
}
std::size_t rounding_launches() {
  return launches_of(gpipe::cuda::convert_kernel<4, float, gpipe::bf16>) +
         launches_of(gpipe::cuda::convert_kernel<1, float, gpipe::bf16>);
}
// Work labelled `what` in a trace.
std::size_t work_named(const std::vector<gpipe::TraceEvent>& trace, std::string_view what) {
  std::size_t count = 0;
  for (const gpipe::TraceEvent& e : trace) count += e.label.what == what;
  return count;
}

template <class Precision>
void check_launches_per_step() {
  using namespace gpipe;
  constexpr bool mixed = std::is_same_v<Precision, MixedBf16>;
  const Batch b = batch(4, 61);
  cuda::Backend backend(2);
  Trainer<Gpt2, SoftmaxCrossEntropy, cuda::Backend, OneFOneB, Precision> trainer(
      backend,
      {.micro_batches = 2, .seed = 3, .ties = {{.parameter = "4.weight", .to = "0.wte.weight"}}});
  const optim::AdamW adamw({.lr = 1e-3, .weight_decay = 0.1, .decay = optim::Decay::matrices});
  backend.set_tracing(true);
  std::size_t first_roundings = 0;
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    const std::size_t adamw0 = adamw_launches(), per_range0 = per_range_adamw_launches();
    const std::size_t rounding0 = rounding_launches();
    trainer.zero_grad();
    trainer.forward_backward(b.tokens, b.targets);
    const std::size_t forward_roundings = rounding_launches() - rounding0;
    trainer.step(adamw);
    const std::vector<TraceEvent> trace = backend.take_trace();
    CHECK(adamw_launches() - adamw0 == 2);  // one per device
    CHECK(per_range_adamw_launches() == per_range0);
    CHECK(rounding_launches() - rounding0 == forward_roundings);  // none in the update
    CHECK(work_named(trace, "optimizer step") == 2);
    CHECK(work_named(trace, "weights to bf16") == (mixed && step == 1 ? 2u : 0u));
    // other ops convert floats to bf16 too (the same number every step): the first step's
    // are the later steps' and the rounding of each stage's weights
    if (step == 1) first_roundings = forward_roundings;
    if (mixed && step > 1) CHECK(first_roundings - forward_roundings == 2);
  }
}

}  // namespace

TEST_CASE("a GPT's AdamW step is one launch per device, and after it no step rounds weights") {
  check_launches_per_step<gpipe::Fp32>();
  check_launches_per_step<gpipe::MixedBf16>();
}

}  // namespace emulated_mixed_precision
