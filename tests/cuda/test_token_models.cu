// Token models on the CUDA backend: a GPT (Embedding, TransformerBlocks with the attention core,
// GELUTanh, LayerNorm, head) on K = 1, 2 and 4 virtual devices, M = 1 and 3, remat never and
// always, against the double-precision unpipelined reference: loss and every gradient, so every
// LayerKernels specialization of gpipe/backend/cuda/layers/ is checked against the host's maths;
// a tied head; packed documents and ignored (-100) targets against the reference too (the
// attention mask, Embedding's restarted positions and the loss's count on the device); predict
// against the host backend's logits, with documents too; the launch records of a step
// (gpipe/backend/cuda/launch_log.cuh). tests/backend/cuda/test_token_models_emulated.cpp runs this
// file on the CPU emulator.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/cuda.cuh"
#include "gpipe/gpipe.hpp"  // the host backend, the reference
#include "support/cuda_factory.cuh"
#include "support/reference_model.hpp"

// Named, so that the CUDA tests also compile as one program (tests/CMakeLists.txt).
namespace cuda_token_models {
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

// Packed documents of the 3 samples: runs ending inside a sample, an id back after another (two
// documents), a run going on across a sample border (a new document all the same).
const std::vector<std::int32_t> documents{0, 0, 1, 1, 1, 2, 1, 1, 2, 2, 2, 3};
// Targets with -100 (ignored): sample 0 whole (micro-batch 0 of M = 3 counts none) and two more.
std::vector<std::int32_t> ignored_targets() {
  std::vector<std::int32_t> y = random_tokens(2);
  for (std::size_t i : {0u, 1u, 2u, 3u, 6u, 9u}) y[i] = -100;
  return y;
}

// packed: with documents and ignored targets.
template <class Model, class Reference = Model>
void check_against_reference(std::size_t m, Remat remat, std::vector<Tie> ties = {},
                             bool packed = false) {
  CAPTURE(Model::num_stages);
  CAPTURE(m);
  CAPTURE(to_string(remat));
  CAPTURE(packed);
  const std::vector<std::int32_t> tokens = random_tokens(1),
                                  targets = packed ? ignored_targets() : random_tokens(2);
  cuda::Backend backend(Model::num_stages);
  Trainer<Model, SoftmaxCrossEntropy, cuda::Backend, OneFOneB> trainer(
      backend, {.micro_batches = m, .remat = remat, .seed = 5, .ties = std::move(ties)});
  const float loss = packed ? trainer.forward_backward(tokens, targets, documents)
                            : trainer.forward_backward(tokens, targets);
  const ReferenceResult ref = reference_step<Reference, SoftmaxCrossEntropy>(
      parameters_of(trainer), std::vector<float>(tokens.begin(), tokens.end()), targets,
      packed ? std::span<const std::int32_t>(documents) : std::span<const std::int32_t>());
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

// The launch records of one GPT step (K virtual devices, M micro-batches, AdamW), by Precision;
// `around(step)` runs the recorded step (and may look at what happens around it).
template <class Model, class Precision = Fp32>
std::vector<cuda::LaunchRecord> recorded_step(
    std::size_t m, const std::function<void(const std::function<void()>&)>& around =
                       [](const std::function<void()>& step) { step(); }) {
  const std::vector<std::int32_t> tokens = random_tokens(1), targets = random_tokens(2);
  cuda::Backend backend(Model::num_stages);
  Trainer<Model, SoftmaxCrossEntropy, cuda::Backend, OneFOneB, Precision> trainer(
      backend, {.micro_batches = m, .seed = 5});
  const optim::AdamW adamw;
  cuda::LaunchRecorder recorder;
  around([&] {
    trainer.zero_grad();
    trainer.forward_backward(tokens, targets);
    trainer.step(adamw);
  });
  return recorder.records();
}

std::size_t count(const std::vector<cuda::LaunchRecord>& records, std::string_view kernel) {
  std::size_t n = 0;
  for (const cuda::LaunchRecord& r : records) n += r.kernel == kernel ? 1 : 0;
  return n;
}

}  // namespace

TEST_SUITE("launch records") {
  TEST_CASE("a GPT step records its GEMMs' FLOPs and every launch's traffic") {
    const std::vector<cuda::LaunchRecord> records = recorded_step<Gpt1>(1);
    REQUIRE(!records.empty());
    double gemm_flops = 0;
    for (const cuda::LaunchRecord& r : records) {
      CAPTURE(r.kernel);
      CHECK(!r.kernel.empty());
      CHECK(r.bytes_read + r.bytes_written > 0);
      CHECK(r.stream != nullptr);
      if (r.kind == cuda::LaunchKind::gemm) {
        CHECK(r.flops == 2.0 * static_cast<double>(r.shape[0] * r.shape[1] * r.shape[2]));
        gemm_flops += r.flops;
      }
    }
    // Every weight of the blocks and the head in one product forward and two backward (dx, dW):
    // 6 FLOPs per weight and token; attention's products are in its own kernels.
    constexpr std::size_t weights =
        2 * (3 * D * D + D * D + 4 * D * D + 4 * D * D) + D * V;  // blocks' Linears, the head
    CHECK(gemm_flops == 6.0 * weights * samples * T);
    CHECK(count(records, "flash_attention_forward_kernel") == 2);
    CHECK(count(records, "adamw_update_ranges_kernel") == 1);  // one device, one launch
    // c_proj's input gradient applies GELU's derivative in its GEMM's epilogue: GELU runs its own
    // kernel forward only (one a block)
    CHECK(count(records, "activation_forward_kernel") == 2);
    CHECK(count(records, "activation_backward_kernel") == 0);
    // every residual add in the LayerNorm after it: forward, ln_2 of each block, ln_1 of the
    // second and ln_f; input gradient, ln_1 and ln_2 of each (the first ln_1 and ln_f alone)
    CHECK(count(records, "residual_layer_norm_forward_kernel") == 4);
    CHECK(count(records, "layer_norm_forward_resident_kernel") == 1);
    CHECK(count(records, "residual_layer_norm_backward_input_kernel") == 4);
    CHECK(count(records, "layer_norm_backward_input_resident_kernel") == 1);
    CHECK(count(records, "add_kernel") == 0);
  }

  TEST_CASE("an elementwise launch records its elements' bytes; recorders do not nest") {
    cuda::Backend backend(1);
    auto a = backend.allocate<float>(0, 1000), b = backend.allocate<float>(0, 1000);
    std::vector<cuda::LaunchRecord> records;
    {
      cuda::LaunchRecorder recorder;
      CHECK_THROWS_AS(cuda::LaunchRecorder{}, Error);
      backend.submit(0, {"add"},
                     [&](cuda::Kernels& k) { k.add(1000, a.data(), b.data(), b.data()); });
      backend.synchronize();
      records = recorder.records();
    }
    REQUIRE(records.size() == 1);
    CHECK(records[0].kernel == "add_kernel");
    CHECK(records[0].shape[0] == 1000);
    CHECK(records[0].flops == 1000);
    CHECK(records[0].bytes_read == 8000);
    CHECK(records[0].bytes_written == 4000);
    CHECK(records[0].kind == cuda::LaunchKind::kernel);
    {
      cuda::LaunchRecorder recorder;  // a new one starts empty
      CHECK(recorder.records().empty());
    }
  }
}

TEST_SUITE("token models on the CUDA backend") {
  TEST_CASE("a GPT step on the CUDA backend equals the unpipelined double reference") {
    for (std::size_t m : {1u, 3u}) {
      for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
        check_against_reference<Gpt1>(m, remat);
        check_against_reference<Gpt2>(m, remat);
        check_against_reference<Gpt4>(m, remat);
      }
    }
  }

  TEST_CASE(
      "a GPT step with documents and ignored targets on the CUDA backend is the reference's") {
    for (std::size_t m : {1u, 3u}) {
      for (Remat remat : {Remat::never, Remat::always}) {
        check_against_reference<Gpt1>(m, remat, {}, true);
        check_against_reference<Gpt2>(m, remat, {}, true);
        check_against_reference<Gpt4>(m, remat, {}, true);
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
    const std::vector<float> packed = trainer.predict(tokens, documents),
                             host_packed = host_trainer.predict(tokens, documents);
    CHECK(relative_error(std::vector<double>(packed.begin(), packed.end()),
                         std::vector<double>(host_packed.begin(), host_packed.end())) < 1e-5);
    CHECK(relative_error(std::vector<double>(packed.begin(), packed.end()),
                         std::vector<double>(want.begin(), want.end())) > 1e-3);
  }
}

}  // namespace cuda_token_models
