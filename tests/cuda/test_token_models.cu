// Token models on the CUDA backend: a GPT (Embedding, TransformerBlocks with the attention core,
// GELUTanh, LayerNorm, head) on K = 1, 2 and 4 virtual devices, M = 1 and 3, remat never and
// always, against the double-precision unpipelined reference: loss and every gradient, so every
// LayerKernels specialization of gpipe/backend/cuda/layers/ is checked against the host's maths;
// a tied head; predict against the host backend's logits. tests/backend/cuda/
// test_token_models_emulated.cpp runs this file on the CPU emulator.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/cuda.cuh"
#include "gpipe/gpipe.hpp"  // the host backend, the reference
#include "support/cuda_factory.cuh"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

constexpr std::size_t V = 7, T = 4, D = 8, H = 2, samples = 3;
using Emb = Embedding<V, T, D>;
using Block = TransformerBlock<D, H>;
using Gpt1 = Pipeline<Stage<Emb, Block, Block, LayerNorm<D>, Linear<D, V>>>;
using Gpt2 = Pipeline<Stage<Emb, Block>, Stage<Block, LayerNorm<D>, Linear<D, V>>>;
using Gpt4 = Pipeline<Stage<Emb>, Stage<Block>, Stage<Block>, Stage<LayerNorm<D>, Linear<D, V>>>;
using TiedGpt4 =
    Pipeline<Stage<Emb>, Stage<Block>, Stage<Block>, Stage<LayerNorm<D>, Linear<D, V, false>>>;
using TiedGpt1 = Pipeline<Stage<Emb, Block, Block, LayerNorm<D>, Linear<D, V, false>>>;

std::vector<std::int32_t> random_tokens(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> out(samples * T);
  for (std::int32_t& t : out) t = static_cast<std::int32_t>(rng.next_u64() % V);
  return out;
}

template <class Model, class Reference = Model>
void check_against_reference(std::size_t m, Remat remat, std::vector<Tie> ties = {}) {
  CAPTURE(Model::num_stages);
  CAPTURE(m);
  CAPTURE(to_string(remat));
  const std::vector<std::int32_t> tokens = random_tokens(1), targets = random_tokens(2);
  cuda::Backend backend(Model::num_stages);
  Trainer<Model, SoftmaxCrossEntropy, cuda::Backend, OneFOneB> trainer(
      backend, {.micro_batches = m, .remat = remat, .seed = 5, .ties = std::move(ties)});
  const float loss = trainer.forward_backward(tokens, targets);
  const ReferenceResult ref = reference_step<Reference, SoftmaxCrossEntropy>(
      parameters_of(trainer), std::vector<float>(tokens.begin(), tokens.end()), targets);
  CHECK(loss == doctest::Approx(ref.loss).epsilon(CudaTolerances::loss_tolerance));
  NamedTensors grads = gradients_of(trainer);
  if constexpr (!std::is_same_v<Model, Reference>) {  // tied: both hold the sum
    const auto& shared = ref.gradients.at("0.wte.weight");
    const auto& head = ref.gradients.at("4.weight");
    std::vector<double> sum(shared.size());
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = shared[i] + head[i];
    CHECK(relative_error(grads.at("0.wte.weight"), sum) < CudaTolerances::gradient_tolerance);
    CHECK(grads.at("4.weight") == grads.at("0.wte.weight"));
    grads.erase("0.wte.weight");
    grads.erase("4.weight");
  }
  for (const auto& entry : grads) {
    const std::string& name = entry.first;
    CAPTURE(name);
    CHECK(relative_error(entry.second, ref.gradients.at(name)) <
          CudaTolerances::gradient_tolerance);
  }
}

}  // namespace

TEST_SUITE("token models on the CUDA backend") {
  TEST_CASE("a GPT step on the CUDA backend equals the unpipelined double reference") {
    for (std::size_t m : {1u, 3u}) {
      for (Remat remat : {Remat::never, Remat::always}) {
        check_against_reference<Gpt1>(m, remat);
        check_against_reference<Gpt2>(m, remat);
        check_against_reference<Gpt4>(m, remat);
      }
    }
  }

  TEST_CASE("a tied LM head on the CUDA backend holds the sum of both gradients") {
    check_against_reference<TiedGpt4, TiedGpt1>(3, Remat::never,
                                                {{.parameter = "4.weight", .to = "0.wte.weight"}});
  }

  TEST_CASE("predict on the CUDA backend gives the host backend's logits") {
    const std::vector<std::int32_t> tokens = random_tokens(3);
    cuda::Backend backend(4);
    Trainer<Gpt4, SoftmaxCrossEntropy, cuda::Backend> trainer(backend, {.micro_batches = 2});
    host::Backend host_backend(4);
    Trainer<Gpt4, SoftmaxCrossEntropy, host::Backend> host_trainer(host_backend,
                                                                   {.micro_batches = 2});
    const std::vector<float> got = trainer.predict(tokens), want = host_trainer.predict(tokens);
    CHECK(relative_error(std::vector<double>(got.begin(), got.end()),
                         std::vector<double>(want.begin(), want.end())) < 1e-5);
  }
}
