// A Llama (TokenEmbedding, LlamaBlocks with grouped-query attention, RoPE and SwiGLU, RMSNorm, a
// bias-free head) on the CUDA backend: K = 1, 2 and 4 virtual devices, M = 1 and 3, remat never
// and always, against the double-precision unpipelined reference (loss and every gradient, so
// the CUDA kernels of RMSNorm, RoPE, SwiGLU and the grouped attention are checked against the
// host's maths); MixedBf16 against Fp32 within bf16's bound; peak activations as predict_memory
// predicts them; predict against the host backend.
// tests/backend/cuda/test_llama_models_emulated.cpp runs this file on the CPU emulator.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/cuda.cuh"
#include "gpipe/gpipe.hpp"  // the host backend, the reference
#include "gpipe/runtime/memory_model.hpp"
#include "support/cuda_factory.cuh"
#include "support/reference_model.hpp"

// Named, so that the CUDA tests also compile as one program (tests/CMakeLists.txt).
namespace cuda_llama_models {
namespace {

using namespace gpipe;
using namespace gpipe::test;

constexpr std::size_t V = 11, T = 8, D = 16, H = 4, KVH = 2, F = 24, samples = 3;
using Emb = TokenEmbedding<V, T, D>;
using Block = LlamaBlock<D, H, KVH, F>;
using Head = Linear<D, V, false>;
using Llama1 = Pipeline<Stage<Emb, Block, Block, RMSNorm<D>, Head>>;
using Llama2 = Pipeline<Stage<Emb, Block>, Stage<Block, RMSNorm<D>, Head>>;
using Llama4 = Pipeline<Stage<Emb>, Stage<Block>, Stage<Block>, Stage<RMSNorm<D>, Head>>;

std::vector<std::int32_t> llama_tokens(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> out(samples * T);
  for (std::int32_t& t : out) t = static_cast<std::int32_t>(rng.next_u64() % V);
  return out;
}

template <class Model>
void check_llama_against_reference(std::size_t m, Remat remat) {
  CAPTURE(Model::num_stages);
  CAPTURE(m);
  CAPTURE(to_string(remat));
  const std::vector<std::int32_t> tokens = llama_tokens(1), targets = llama_tokens(2);
  cuda::Backend backend(Model::num_stages);
  Trainer<Model, SoftmaxCrossEntropy, cuda::Backend, OneFOneB> trainer(
      backend, {.micro_batches = m, .remat = remat, .seed = 5});
  const float loss = trainer.forward_backward(tokens, targets);
  const ReferenceResult ref = reference_step<Model, SoftmaxCrossEntropy>(
      parameters_of(trainer), std::vector<float>(tokens.begin(), tokens.end()), targets);
  CHECK(loss == doctest::Approx(ref.loss).epsilon(CudaTolerances::loss_tolerance));
  for (const auto& [name, grad] : gradients_of(trainer)) {
    CAPTURE(name);
    CHECK(relative_error(grad, ref.gradients.at(name)) < CudaTolerances::gradient_tolerance);
  }
}

}  // namespace

TEST_SUITE("llama models on the CUDA backend") {
  TEST_CASE("a Llama step on the CUDA backend equals the unpipelined double reference") {
    for (std::size_t m : {1u, 3u}) {
      for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
        check_llama_against_reference<Llama1>(m, remat);
        check_llama_against_reference<Llama2>(m, remat);
        check_llama_against_reference<Llama4>(m, remat);
      }
    }
  }

  TEST_CASE("a Llama step on packed documents on the CUDA backend equals the double reference") {
    std::vector<std::int32_t> documents(samples * T);
    for (std::size_t r = 0; r < documents.size(); ++r)
      documents[r] = static_cast<std::int32_t>(r / 3 % 4);
    const std::vector<std::int32_t> tokens = llama_tokens(1), targets = llama_tokens(2);
    cuda::Backend backend(Llama4::num_stages);
    for (Remat remat : {Remat::never, Remat::always}) {
      CAPTURE(to_string(remat));
      Trainer<Llama4, SoftmaxCrossEntropy, cuda::Backend, OneFOneB> trainer(
          backend, {.micro_batches = 3, .remat = remat, .seed = 5});
      const float loss = trainer.forward_backward(tokens, targets, documents);
      const ReferenceResult ref = reference_step<Llama4, SoftmaxCrossEntropy>(
          parameters_of(trainer), std::vector<float>(tokens.begin(), tokens.end()), targets,
          documents);
      CHECK(loss == doctest::Approx(ref.loss).epsilon(CudaTolerances::loss_tolerance));
      for (const auto& [name, grad] : gradients_of(trainer)) {
        CAPTURE(name);
        CHECK(relative_error(grad, ref.gradients.at(name)) < CudaTolerances::gradient_tolerance);
      }
    }
  }

  TEST_CASE("MixedBf16: a Llama step on the CUDA backend is Fp32's within bf16's bound") {
    // the bound of tests/runtime/test_llama_models.cpp: (2 n_ops + n_gemm) u for gradients
    constexpr double u = 1.0 / 256;
    constexpr std::size_t n_ops = 1 + 2 * 11 + 2, n_gemm = 2 * 4 + 1;
    const std::vector<std::int32_t> tokens = llama_tokens(3), targets = llama_tokens(4);
    cuda::Backend backend(2);
    Trainer<Llama2, SoftmaxCrossEntropy, cuda::Backend, OneFOneB, Fp32> fp32(
        backend, {.micro_batches = 3, .seed = 5});
    Trainer<Llama2, SoftmaxCrossEntropy, cuda::Backend, OneFOneB, MixedBf16> bf16(
        backend, {.micro_batches = 3, .seed = 5});
    const float want = fp32.forward_backward(tokens, targets);
    const float got = bf16.forward_backward(tokens, targets);
    CHECK(std::abs(got - want) <= (n_ops + n_gemm) * u * std::abs(want));
    for (const ParameterInfo& info : fp32.parameter_info()) {
      CAPTURE(info.name);
      const std::vector<float> a = bf16.gradient(info.name), b = fp32.gradient(info.name);
      CHECK(relative_error(std::vector<double>(a.begin(), a.end()),
                           std::vector<double>(b.begin(), b.end())) <= (2 * n_ops + n_gemm) * u);
    }
  }

  TEST_CASE("a Llama's peak activations on the CUDA backend are predict_memory's") {
    const std::vector<std::int32_t> tokens = llama_tokens(6), targets = llama_tokens(7);
    for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
      CAPTURE(to_string(remat));
      auto measure = [&]<class Precision>() {
        cuda::Backend backend(2);
        Trainer<Llama2, SoftmaxCrossEntropy, cuda::Backend, OneFOneB, Precision> trainer(
            backend, {.micro_batches = 3, .remat = remat});
        const auto predicted =
            predict_memory<Llama2, Precision>(trainer.schedule(), tokens.size(), remat);
        backend.reset_peak();
        trainer.forward_backward(tokens, targets);
        for (std::size_t d = 0; d < 2; ++d) {
          CAPTURE(d);
          const MemoryStats stats = backend.memory_stats(d);
          CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
          CHECK(stats.current_of(MemoryKind::parameters) == predicted[d].parameters);
          CHECK(stats.peak <= predicted[d].total_bound());
        }
      };
      measure.operator()<Fp32>();
      measure.operator()<MixedBf16>();
    }
  }

  TEST_CASE("predict on the CUDA backend gives the host backend's Llama logits") {
    const std::vector<std::int32_t> tokens = llama_tokens(5);
    cuda::Backend backend(4);
    Trainer<Llama4, SoftmaxCrossEntropy, cuda::Backend> trainer(backend, {.micro_batches = 2});
    host::Backend host_backend(4);
    Trainer<Llama4, SoftmaxCrossEntropy, host::Backend> host_trainer(host_backend,
                                                                     {.micro_batches = 2});
    const std::vector<float> got = trainer.predict(tokens), want = host_trainer.predict(tokens);
    CHECK(relative_error(std::vector<double>(got.begin(), got.end()),
                         std::vector<double>(want.begin(), want.end())) < 1e-5);
  }
}

}  // namespace cuda_llama_models
