// gpipe::MixedBf16 on the host backend: a GPT step's loss and gradients against the same step in
// Fp32 within a bound derived from bf16's precision; the same bits for every split into stages
// and remat policy; measured peak activations equal predict_memory's and half of Fp32's;
// inference against Fp32; ReLU/MSE models too; checkpoints in Fp32's format; packed documents
// and ignored targets within the same bound and with the same bits for every split.
//
// The bound. bf16 keeps 8 significant bits: rounding to nearest has relative error at most
// u = 2^-8. Every bf16 kernel computes in float from exactly widened inputs and rounds its
// result once, and a GEMM rounds its float weight operand once (products of two bf16 are exact in
// float, accumulation is float: K 2^-24 relative to the sum of magnitudes, negligible here). To
// first order, a perturbation of relative size u at every stored activation (n_ops of them in
// forward: one per leaf op), at every input gradient (n_ops in backward) and at every GEMM's
// weights (n_gemm) moves a gradient by at most (2 n_ops + n_gemm) u relative to its size, when
// each op's condition number is about 1 and the errors all align; the loss, forward only, by
// (n_ops + n_gemm) u. Measured errors sit more than ten times below (rounding errors of random
// sign grow like a square root, not a sum).

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/memory_model.hpp"
#include "support/models.hpp"
#include "support/temp_path.hpp"

namespace {

using namespace gpipe;

constexpr std::size_t V = 300, T = 32, D = 64, H = 4;
using Emb = Embedding<V, T, D>;
using Block = TransformerBlock<D, H>;
using Head = Linear<D, V, false>;
using Gpt1 = Pipeline<Stage<Emb, Block, Block, LayerNorm<D>, Head>>;
using Gpt2 = Pipeline<Stage<Emb, Block>, Stage<Block, LayerNorm<D>, Head>>;
using Gpt4 = Pipeline<Stage<Emb>, Stage<Block>, Stage<Block>, Stage<LayerNorm<D>, Head>>;

// Leaf ops of the GPT: the embedding; per block 2 LayerNorms, 4 Linears, the attention core,
// GELU and 2 residual sums; the final LayerNorm and the head. GEMMs with weights: 4 per block and
// the head.
constexpr double u = 1.0 / 256;
constexpr std::size_t n_ops = 1 + 2 * 10 + 2, n_gemm = 2 * 4 + 1;

struct Batch {
  std::vector<std::int32_t> tokens, targets;
  std::vector<std::int32_t> documents = {};  // empty: one document per sample
};
Batch batch(std::size_t samples, std::uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (std::size_t i = 0; i < samples * T; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(rng.next_u64() % V));
    b.targets.push_back(static_cast<std::int32_t>(rng.next_u64() % V));
  }
  return b;
}

double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// One step of Model in Precision: the loss and every gradient, by name.
template <class Model, class Schedule, class Precision>
struct StepResult {
  float loss = 0;
  std::vector<std::vector<float>> gradients;
  std::vector<std::string> names;
};
template <class Model, class Schedule = OneFOneB, class Precision = MixedBf16>
StepResult<Model, Schedule, Precision> run_step(const Batch& b, std::size_t m,
                                                Remat remat = Remat::never) {
  host::Backend backend(Model::num_stages / Schedule::chunks_per_device);
  Trainer<Model, SoftmaxCrossEntropy, host::Backend, Schedule, Precision> trainer(
      backend, {.micro_batches = m, .remat = remat, .seed = 3});
  StepResult<Model, Schedule, Precision> out;
  out.loss = b.documents.empty() ? trainer.forward_backward(b.tokens, b.targets)
                                 : trainer.forward_backward(b.tokens, b.targets, b.documents);
  for (const ParameterInfo& info : trainer.parameter_info()) {
    out.names.push_back(info.name);
    out.gradients.push_back(trainer.gradient(info.name));
  }
  return out;
}

}  // namespace

TEST_CASE("MixedBf16: a GPT step's loss and gradients are Fp32's within bf16's bound") {
  const Batch b = batch(4, 11);
  const auto fp32 = run_step<Gpt2, OneFOneB, Fp32>(b, 2);
  const auto bf16 = run_step<Gpt2, OneFOneB, MixedBf16>(b, 2);
  CHECK(std::abs(bf16.loss - fp32.loss) <= (n_ops + n_gemm) * u * std::abs(fp32.loss));
  double worst = 0;
  for (std::size_t i = 0; i < fp32.names.size(); ++i) {
    CAPTURE(fp32.names[i]);
    const double e = relative_difference(bf16.gradients[i], fp32.gradients[i]);
    CHECK(e <= (2 * n_ops + n_gemm) * u);
    CHECK(e > 0);  // bf16 really rounds: the step is not fp32's
    worst = std::max(worst, e);
  }
  MESSAGE("loss fp32 " << fp32.loss << ", bf16 " << bf16.loss << "; worst gradient difference "
                       << worst << " (bound " << (2 * n_ops + n_gemm) * u << ")");
}

// b with packed documents (runs of 1 to 12 tokens, ids 0 to 2, so that an id comes back) and a
// fifth of its targets ignored (-100).
Batch packed(Batch b, std::uint64_t seed) {
  Rng rng(seed);
  std::int32_t id = 0;
  for (std::size_t i = 0; i < b.tokens.size(); ++i) {
    if (rng.next_u64() % 6 == 0) id = static_cast<std::int32_t>(rng.next_u64() % 3);
    b.documents.push_back(id);
    if (rng.next_u64() % 5 == 0) b.targets[i] = -100;
  }
  return b;
}

TEST_CASE("MixedBf16 with documents and ignored targets: Fp32's step within bf16's bound") {
  const Batch b = packed(batch(4, 13), 14);
  const auto fp32 = run_step<Gpt2, OneFOneB, Fp32>(b, 2);
  const auto bf16 = run_step<Gpt2, OneFOneB, MixedBf16>(b, 2);
  CHECK(std::abs(bf16.loss - fp32.loss) <= (n_ops + n_gemm) * u * std::abs(fp32.loss));
  for (std::size_t i = 0; i < fp32.names.size(); ++i) {
    CAPTURE(fp32.names[i]);
    const double e = relative_difference(bf16.gradients[i], fp32.gradients[i]);
    CHECK(e <= (2 * n_ops + n_gemm) * u);
    CHECK(e > 0);
  }
  // the documents and ignored targets change the step (in bf16 too)
  Batch plain = b;
  plain.documents.clear();
  CHECK(run_step<Gpt2, OneFOneB, MixedBf16>(plain, 2).loss != bf16.loss);
}

TEST_CASE("MixedBf16 with documents and ignored targets: the same bits for every split and remat") {
  const Batch b = packed(batch(4, 15), 16);
  auto same = [](std::string what, const auto& got, const auto& want) {
    CAPTURE(what);
    CHECK(got.loss == want.loss);
    REQUIRE(got.names == want.names);
    for (std::size_t i = 0; i < want.names.size(); ++i) {
      CAPTURE(want.names[i]);
      CHECK(got.gradients[i] == want.gradients[i]);
    }
  };
  const auto one_f_one_b = run_step<Gpt1, OneFOneB>(b, 2);
  same("K = 2, 1F1B", run_step<Gpt2, OneFOneB>(b, 2), one_f_one_b);
  same("K = 4, 1F1B, remat always", run_step<Gpt4, OneFOneB>(b, 2, Remat::always), one_f_one_b);
  same("K = 4, 1F1B, remat selective", run_step<Gpt4, OneFOneB>(b, 2, Remat::selective),
       one_f_one_b);
  const auto gpipe = run_step<Gpt1, GPipe>(b, 2);
  same("K = 4, GPipe, remat always", run_step<Gpt4, GPipe>(b, 2, Remat::always), gpipe);
}

TEST_CASE("MixedBf16: the same bits for every split into stages and remat policy") {
  // Gradients accumulate micro-batch by micro-batch, so two schedules that run the backward
  // passes of the micro-batches in another order round their sums differently (as in Fp32);
  // for one order the step is the same computation whatever the split and the remat policy.
  const Batch b = batch(4, 12);
  auto same = [](std::string what, const auto& got, const auto& want) {
    CAPTURE(what);
    CHECK(got.loss == want.loss);
    REQUIRE(got.names == want.names);
    for (std::size_t i = 0; i < want.names.size(); ++i) {
      CAPTURE(want.names[i]);
      CHECK(got.gradients[i] == want.gradients[i]);
    }
  };
  const auto gpipe = run_step<Gpt1, GPipe>(b, 2);
  same("K = 2, GPipe", run_step<Gpt2, GPipe>(b, 2), gpipe);
  same("K = 4, GPipe, remat always", run_step<Gpt4, GPipe>(b, 2, Remat::always), gpipe);
  const auto one_f_one_b = run_step<Gpt1, OneFOneB>(b, 2);
  same("K = 2, 1F1B", run_step<Gpt2, OneFOneB>(b, 2), one_f_one_b);
  same("K = 4, 1F1B, remat always", run_step<Gpt4, OneFOneB>(b, 2, Remat::always), one_f_one_b);
  same("K = 4, 1F1B, remat except_last", run_step<Gpt4, OneFOneB>(b, 2, Remat::except_last),
       one_f_one_b);
  same("K = 2, 1F1B, remat selective", run_step<Gpt2, OneFOneB>(b, 2, Remat::selective),
       one_f_one_b);
  same("K = 4, GPipe, remat selective", run_step<Gpt4, GPipe>(b, 2, Remat::selective), gpipe);
}

TEST_CASE("MixedBf16: peak activations are predict_memory's and half of Fp32's") {
  const Batch b = batch(8, 13);
  for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
    CAPTURE(to_string(remat));
    std::size_t peaks[2][2] = {};
    auto measure = [&]<class Precision>(int which) {
      host::Backend backend(2);
      Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, OneFOneB, Precision> trainer(
          backend, {.micro_batches = 4, .remat = remat});
      const auto predicted =
          predict_memory<Gpt2, Precision>(trainer.schedule(), b.tokens.size(), remat);
      backend.reset_peak();
      trainer.forward_backward(b.tokens, b.targets);
      for (std::size_t d = 0; d < 2; ++d) {
        CAPTURE(d);
        const MemoryStats stats = backend.memory_stats(d);
        CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
        CHECK(stats.current_of(MemoryKind::parameters) == predicted[d].parameters);
        CHECK(stats.current_of(MemoryKind::workspace) == 0);
        CHECK(stats.peak <= predicted[d].total_bound());
        peaks[which][d] = stats.peak_of(MemoryKind::activations);
      }
    };
    measure.operator()<Fp32>(0);
    measure.operator()<MixedBf16>(1);
    for (std::size_t d = 0; d < 2; ++d) CHECK(2 * peaks[1][d] == peaks[0][d]);
  }
}

TEST_CASE("MixedBf16: inference and an MLP with MSE against Fp32") {
  const Batch b = batch(4, 14);
  host::Backend backend(2);
  Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, GPipe, Fp32> fp32(backend,
                                                                      {.micro_batches = 2});
  Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, GPipe, MixedBf16> bf16(backend,
                                                                           {.micro_batches = 2});
  CHECK(relative_difference(bf16.predict(b.tokens), fp32.predict(b.tokens)) <=
        (n_ops + n_gemm) * u);

  // Model2 of the tests' models: Linear, ReLU, GELU, LayerNorm, a residual; MSE needs 5 outputs.
  using Mlp = gpipe::test::Model2;
  const std::vector<float> x = gpipe::test::random_inputs(12, Mlp::in_features, 1);
  const std::vector<float> y = gpipe::test::random_inputs(12, Mlp::out_features, 2);
  Trainer<Mlp, MSELoss, host::Backend, OneFOneB, Fp32> mlp32(backend, {.micro_batches = 3});
  Trainer<Mlp, MSELoss, host::Backend, OneFOneB, MixedBf16> mlp16(backend, {.micro_batches = 3});
  const float l32 = mlp32.forward_backward(x, y), l16 = mlp16.forward_backward(x, y);
  // 11 roundings of activations (x itself; Linear, ReLU, Linear, GELU, LayerNorm, the residual's
  // Linear, GELU, Linear and sum, Linear) and 5 GEMMs
  CHECK(std::abs(l16 - l32) <= (11 + 5) * u * std::abs(l32));
  for (const ParameterInfo& info : mlp32.parameter_info()) {
    CAPTURE(info.name);
    CHECK(relative_difference(mlp16.gradient(info.name), mlp32.gradient(info.name)) <=
          (2 * 11 + 5) * u);
  }
}

TEST_CASE("MixedBf16: checkpoints are Fp32's: resumed bit for bit, and readable by an Fp32 run") {
  gpipe::test::TempPath root("gpipe_test_bf16_ckpt", "");
  const std::filesystem::path dir = root.path() / "run";
  std::filesystem::create_directories(root.path());
  const Batch b = batch(4, 15);
  const optim::AdamW adamw({.lr = 1e-3});
  host::Backend backend(2);
  using Bf16Trainer = Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, OneFOneB, MixedBf16>;
  auto step = [&](auto& trainer) {
    const float loss = trainer.forward_backward(b.tokens, b.targets);
    trainer.step(adamw);
    trainer.zero_grad();
    return loss;
  };
  Bf16Trainer trainer(backend, {.micro_batches = 2, .seed = 1});
  step(trainer);
  trainer.save_checkpoint(dir);
  const float next = step(trainer);  // the run as if never interrupted

  Bf16Trainer resumed(backend, {.micro_batches = 2, .seed = 9});
  resumed.load_checkpoint(dir);
  CHECK(step(resumed) == next);
  for (const ParameterInfo& info : trainer.parameter_info()) {
    CAPTURE(info.name);
    CHECK(resumed.parameter(info.name) == trainer.parameter(info.name));
  }
  // the same files: an Fp32 trainer reads the bf16 run's checkpoint (master weights and AdamW's
  // moments are float in both)
  Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, OneFOneB, Fp32> fp32(backend,
                                                                         {.micro_batches = 2});
  fp32.load_checkpoint(dir);
  Bf16Trainer reloaded(backend, {.micro_batches = 2, .seed = 5});
  reloaded.load_checkpoint(dir);
  for (const ParameterInfo& info : trainer.parameter_info())
    CHECK(fp32.parameter(info.name) == reloaded.parameter(info.name));
}
