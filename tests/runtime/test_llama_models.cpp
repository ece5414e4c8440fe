// A Llama on the pipeline (host backend), shaped as the README's (TokenEmbedding, LlamaBlocks,
// RMSNorm, a bias-free head): for K in {1, 2, 4} stages, several schedules, M in {1, 3} and remat
// never / always / selective, the loss and every gradient equal the unpipelined double-precision
// model; MixedBf16 within bf16's bound of Fp32 and the same bits for every split; a team of threads
// per device gives the one-thread step; the memory model predicts the activation and document-id
// peaks; Hugging Face's names save and load, skip rotary buffers and refuse a tensor of another
// shape; a head tied to the embedding.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/runtime/memory_model.hpp"
#include "support/errors.hpp"
#include "support/reference_model.hpp"
#include "support/temp_path.hpp"
#include "support/token_models.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

constexpr std::size_t V = 11, T = 8, D = 16, H = 4, KVH = 2, F = 24;
constexpr std::size_t samples = 5;  // M = 3 does not divide it
using Emb = TokenEmbedding<V, T, D>;
using Block = LlamaBlock<D, H, KVH, F>;
using Head = Linear<D, V, false>;

// One layer sequence, split three ways: the same names and, from one seed, the same parameters.
using Llama1 = Pipeline<Stage<Emb, Block, Block, RMSNorm<D>, Head>>;
using Llama2 = Pipeline<Stage<Emb, Block>, Stage<Block, RMSNorm<D>, Head>>;  // the README's
using Llama4 = Pipeline<Stage<Emb>, Stage<Block>, Stage<Block>, Stage<RMSNorm<D>, Head>>;

static_assert(Llama2::is_token_model && Llama2::tokens_per_sample == T && Llama2::vocab_size == V);
static_assert(Llama2::in_features == 1 && Llama2::out_features == V);

const std::vector<std::int32_t> tokens = random_tokens(samples * T, V, 1);
const std::vector<std::int32_t> targets = random_tokens(samples * T, V, 2);
// Packed documents: runs ending inside samples, an id that comes back after another, a run across
// a border.
const std::vector<std::int32_t> documents = [] {
  std::vector<std::int32_t> out(samples * T);
  for (std::size_t r = 0; r < out.size(); ++r) out[r] = static_cast<std::int32_t>(r / 3 % 4);
  return out;
}();

constexpr double gradient_tolerance = token_gradient_tolerance;
constexpr double loss_tolerance = token_loss_tolerance;

template <class Model, class Schedule>
void check_against_reference(std::size_t m, Remat remat) {
  check_token_step<Model, Schedule>(m, remat, tokens, targets);
}

template <class Schedule>
void check_schedule() {
  for (std::size_t m : {1u, 3u}) {
    for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
      if constexpr (Schedule::chunks_per_device == 1) {
        check_against_reference<Llama1, Schedule>(m, remat);
        check_against_reference<Llama2, Schedule>(m, remat);
      }
      check_against_reference<Llama4, Schedule>(m, remat);
    }
  }
}

double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_SUITE("llama models") {
  TEST_CASE("every split of a Llama into stages has the same parameters from one seed") {
    host::Backend backend(4);
    Trainer<Llama1, SoftmaxCrossEntropy, host::Backend> one(backend, {.seed = 3});
    Trainer<Llama4, SoftmaxCrossEntropy, host::Backend> four(backend, {.seed = 3});
    CHECK(parameters_of(one) == parameters_of(four));
    const auto infos = Llama2::parameters();
    CHECK(infos.front().name == "0.weight");
    CHECK(infos[1].name == "1.input_layernorm.weight");
    CHECK(infos[2].name == "1.self_attn.q_proj.weight");
    CHECK(infos.back().name == "4.weight");
  }

  TEST_CASE("a pipelined Llama step equals the unpipelined model: GPipe") {
    check_schedule<GPipe>();
  }
  TEST_CASE("a pipelined Llama step equals the unpipelined model: 1F1B") {
    check_schedule<OneFOneB>();
  }
  TEST_CASE("a pipelined Llama step equals the unpipelined model: ZB-H1") {
    check_schedule<ZeroBubbleH1>();
  }
  TEST_CASE("a pipelined Llama step equals the unpipelined model: interleaved, 2 stages a device") {
    check_schedule<Interleaved<2>>();
  }

  TEST_CASE("a pipelined Llama step on packed documents equals the unpipelined model") {
    // the documents change the step
    host::Backend one(1);
    const NamedTensors params =
        parameters_of(Trainer<Llama1, SoftmaxCrossEntropy, host::Backend>(one, {.seed = 3}));
    const std::vector<float> rows(tokens.begin(), tokens.end());
    const double packed =
        reference_step<Llama1, SoftmaxCrossEntropy>(params, rows, targets, documents).loss;
    CHECK(std::abs(packed -
                   reference_step<Llama1, SoftmaxCrossEntropy>(params, rows, targets).loss) > 1e-4);
    for (std::size_t m : {1u, 3u})
      for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
        check_token_step<Llama1, OneFOneB>(m, remat, tokens, targets, documents);
        check_token_step<Llama2, ZeroBubbleH1>(m, remat, tokens, targets, documents);
        check_token_step<Llama4, Interleaved<2>>(m, remat, tokens, targets, documents);
      }
  }

  TEST_CASE("MixedBf16: a Llama step's loss and gradients are Fp32's within bf16's bound") {
    // The bound of test_mixed_precision.cpp: u = 2^-8 per stored activation, input gradient and
    // rounded GEMM weight. Leaf ops: the embedding; per block 2 RMSNorms, 4 GEMMs, RoPE, the
    // attention core, SwiGLU and 2 residual sums; the final RMSNorm and the head. GEMMs with
    // weights: 4 per block and the head.
    constexpr double u = 1.0 / 256;
    constexpr std::size_t n_ops = 1 + 2 * 11 + 2, n_gemm = 2 * 4 + 1;
    auto run = [&]<class Precision>() {
      host::Backend backend(2);
      Trainer<Llama2, SoftmaxCrossEntropy, host::Backend, OneFOneB, Precision> trainer(
          backend, {.micro_batches = 3, .seed = 3});
      std::pair<float, std::vector<std::vector<float>>> out;
      out.first = trainer.forward_backward(tokens, targets);
      for (const ParameterInfo& info : trainer.parameter_info())
        out.second.push_back(trainer.gradient(info.name));
      return out;
    };
    const auto fp32 = run.operator()<Fp32>();
    const auto bf16 = run.operator()<MixedBf16>();
    CHECK(std::abs(bf16.first - fp32.first) <= (n_ops + n_gemm) * u * std::abs(fp32.first));
    const auto infos = Llama2::parameters();
    for (std::size_t i = 0; i < fp32.second.size(); ++i) {
      CAPTURE(infos[i].name);
      const double e = relative_difference(bf16.second[i], fp32.second[i]);
      CHECK(e <= (2 * n_ops + n_gemm) * u);
      CHECK(e > 0);  // bf16 really rounds: the step is not fp32's
    }
  }

  TEST_CASE("MixedBf16: an odd MLP width and odd rows ask no alignment of RMSNorm's stash") {
    // F = 25 puts the MLP's RMSNorm stash at an odd element offset per row, and 3 samples of 7
    // tokens make the rows odd: a float kept in two bf16 halves needs no 4-byte alignment.
    constexpr std::size_t To = 7, Fo = 25;
    using Odd = Pipeline<Stage<TokenEmbedding<V, To, D>, LlamaBlock<D, H, KVH, Fo>>,
                         Stage<RMSNorm<D>, Linear<D, V, false>>>;
    const std::vector<std::int32_t> x = random_tokens(3 * To, V, 7),
                                    y = random_tokens(3 * To, V, 8);
    host::Backend backend(2);
    Trainer<Odd, SoftmaxCrossEntropy, host::Backend, OneFOneB, Fp32> fp32(backend, {.seed = 3});
    Trainer<Odd, SoftmaxCrossEntropy, host::Backend, OneFOneB, MixedBf16> bf16(backend,
                                                                               {.seed = 3});
    // within the bound of the Llama step's test below, for one block
    constexpr double u = 1.0 / 256;
    constexpr std::size_t n_ops = 1 + 11 + 2, n_gemm = 4 + 1;
    const float want = fp32.forward_backward(x, y);
    CHECK(std::abs(bf16.forward_backward(x, y) - want) <= (n_ops + n_gemm) * u * std::abs(want));
    for (const ParameterInfo& info : fp32.parameter_info()) {
      CAPTURE(info.name);
      CHECK(relative_difference(bf16.gradient(info.name), fp32.gradient(info.name)) <=
            (2 * n_ops + n_gemm) * u);
    }
  }

  TEST_CASE("MixedBf16: a Llama step has the same bits for every split and remat policy") {
    // one order of micro-batch backward passes (GPipe) makes the same computation whatever the
    // split into stages and the remat policy (see test_mixed_precision.cpp)
    auto run = [&]<class Model>(Remat remat) {
      host::Backend backend(Model::num_stages);
      Trainer<Model, SoftmaxCrossEntropy, host::Backend, GPipe, MixedBf16> trainer(
          backend, {.micro_batches = 3, .remat = remat, .seed = 3});
      std::pair<float, std::vector<std::vector<float>>> out;
      out.first = trainer.forward_backward(tokens, targets);
      for (const ParameterInfo& info : trainer.parameter_info())
        out.second.push_back(trainer.gradient(info.name));
      return out;
    };
    const auto want = run.operator()<Llama1>(Remat::never);
    CHECK(run.operator()<Llama2>(Remat::never) == want);
    CHECK(run.operator()<Llama4>(Remat::always) == want);
  }

  TEST_CASE("a Llama whose devices have a team of threads gives the one-thread step") {
    // Large enough that a team of two splits the RMSNorms and SwiGLU (2^17 elements a
    // micro-batch), RoPE (four samples a micro-batch), the attention core and the GEMMs.
    constexpr std::size_t Vt = 256, Tt = 128, Dt = 256, Ht = 4, KVHt = 2, Ft = 512, n = 8;
    using Llama = Pipeline<Stage<TokenEmbedding<Vt, Tt, Dt>, LlamaBlock<Dt, Ht, KVHt, Ft>>,
                           Stage<LlamaBlock<Dt, Ht, KVHt, Ft>, RMSNorm<Dt>, Linear<Dt, Vt, false>>>;
    host::Team pair(2);
    REQUIRE(host::Kernels<float>(0, &pair).split(4 * Tt, Dt).parts == 2);
    REQUIRE(host::Kernels<float>(0, &pair).split(4, Tt * (Ht + KVHt) * (Dt / Ht)).parts == 2);
    check_team_gives_one_thread_step<Llama>(random_tokens(n * Tt, Vt, 4),
                                            random_tokens(n * Tt, Vt, 5));
  }

  TEST_CASE("the memory model predicts a Llama's activation and document-id peaks exactly") {
    // document ids live per (stage, micro-batch) from F to W (ZB-H1 runs W long after B), in
    // predict's inference program for its F
    auto check = [&]<class Schedule>(std::size_t m, Remat remat, bool packed) {
      CAPTURE(m);
      CAPTURE(to_string(remat));
      CAPTURE(packed);
      host::Backend backend(4);
      Trainer<Llama4, SoftmaxCrossEntropy, host::Backend, Schedule> trainer(
          backend, {.micro_batches = m, .remat = remat});
      const auto predicted =
          predict_memory<Llama4>(trainer.schedule(), samples * T, remat, 0, 4, true, packed);
      backend.reset_peak();
      if (packed)
        trainer.forward_backward(tokens, targets, documents);
      else
        trainer.forward_backward(tokens, targets);
      for (std::size_t d = 0; d < 4; ++d) {
        CAPTURE(d);
        const MemoryStats stats = backend.memory_stats(d);
        CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
        CHECK(stats.peak_of(MemoryKind::other) == predicted[d].documents_peak);
        CHECK(stats.current_of(MemoryKind::other) == 0);
        CHECK(stats.peak <= predicted[d].total_bound());
        // each device holds at least one micro-batch's ids, and at most all of them
        CHECK((predicted[d].documents_peak > 0) == packed);
        CHECK(predicted[d].documents_peak <= samples * T * sizeof(std::int32_t));
      }
      // predict's inference program frees each micro-batch's ids at the end of its forward
      const auto inference = predict_memory<Llama4>(inference_schedule_for(trainer.schedule(), m),
                                                    samples * T, Remat::never, 0, 4, true, packed);
      backend.reset_peak();
      if (packed)
        (void)trainer.predict(tokens, documents);
      else
        (void)trainer.predict(tokens);
      for (std::size_t d = 0; d < 4; ++d) {
        CAPTURE(d);
        const MemoryStats stats = backend.memory_stats(d);
        CHECK(stats.peak_of(MemoryKind::activations) == inference[d].activations_peak);
        CHECK(stats.peak_of(MemoryKind::other) == inference[d].documents_peak);
        CHECK(stats.current_of(MemoryKind::other) == 0);
      }
    };
    for (bool packed : {false, true})
      for (std::size_t m : {1u, 3u})
        for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
          check.template operator()<OneFOneB>(m, remat, packed);
          check.template operator()<ZeroBubbleH1>(m, remat, packed);
        }
  }

  TEST_CASE("Hugging Face's names: save writes them, load reads them and skips rotary buffers") {
    host::Backend backend(2);
    const NameMap names = hf_llama_names<Llama2>();
    CHECK(names.file_name("0.weight") == "model.embed_tokens.weight");
    CHECK(names.file_name("1.input_layernorm.weight") == "model.layers.0.input_layernorm.weight");
    CHECK(names.file_name("1.self_attn.k_proj.weight") == "model.layers.0.self_attn.k_proj.weight");
    CHECK(names.file_name("2.mlp.down_proj.weight") == "model.layers.1.mlp.down_proj.weight");
    CHECK(names.file_name("3.weight") == "model.norm.weight");
    CHECK(names.file_name("4.weight") == "lm_head.weight");
    CHECK(hf_llama_names<Llama4>().file_name("2.self_attn.o_proj.weight") ==
          "model.layers.1.self_attn.o_proj.weight");
    using Llama = Trainer<Llama2, SoftmaxCrossEntropy, host::Backend>;
    Llama trainer(backend, {.seed = 3});
    const TempPath saved("hf_llama"), state_dict("hf_state_dict"), bad_shape("hf_bad_shape");
    trainer.save(saved.path(), names);
    auto file = io::load_safetensors(saved.path());
    CHECK(file.size() == parameters_of(trainer).size());
    CHECK(file.at("model.layers.1.self_attn.q_proj.weight").shape ==
          std::vector<std::size_t>{H * (D / H), D});
    CHECK(file.at("model.layers.1.self_attn.v_proj.weight").shape ==
          std::vector<std::size_t>{KVH * (D / H), D});
    CHECK(file.at("model.layers.0.mlp.down_proj.weight").shape == std::vector<std::size_t>{D, F});

    // A state dict with the rotary buffers that older checkpoints keep per layer.
    std::vector<io::TensorView> state;
    for (const auto& [name, tensor] : file) state.push_back({name, tensor.shape, tensor.data});
    const std::vector<float> inv_freq(D / H / 2, 1.0f);
    for (int block = 0; block < 2; ++block)
      state.push_back({"model.layers." + std::to_string(block) + ".self_attn.rotary_emb.inv_freq",
                       {D / H / 2},
                       inv_freq});
    io::save_safetensors(state_dict.path(), state);
    Llama other(backend, {.seed = 4});
    REQUIRE(parameters_of(other) != parameters_of(trainer));
    other.load(state_dict.path(), names);
    CHECK(parameters_of(other) == parameters_of(trainer));
    // and they compute the same step
    CHECK(other.forward_backward(tokens, targets) == trainer.forward_backward(tokens, targets));

    // A k_proj stored with another shape of as many elements: refused, naming the tensor, and
    // nothing loaded.
    for (io::TensorView& t : state)
      if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {D / 2 * 2, D / 2};
    io::save_safetensors(bad_shape.path(), state);
    Llama third(backend, {.seed = 5});
    const auto before = parameters_of(third);
    check_error([&] { third.load(bad_shape.path(), names); },
                "model.layers.0.self_attn.k_proj.weight");
    CHECK(parameters_of(third) == before);
  }

  TEST_CASE("tied word embeddings (tie_word_embeddings, Llama 3.2's): lm_head is embed_tokens") {
    // The head of Llama2 is "4.weight" (V, D), the embedding "0.weight" (V, D).
    host::Backend backend(2);
    const std::vector<Tie> ties{{.parameter = "4.weight", .to = "0.weight"}};
    using Llama = Trainer<Llama2, SoftmaxCrossEntropy, host::Backend>;
    Llama trainer(backend, {.micro_batches = 3, .seed = 3, .ties = ties});
    const NamedTensors params = parameters_of(trainer);
    REQUIRE(params.at("4.weight") == params.at("0.weight"));
    const ReferenceResult ref = reference_step<Llama1, SoftmaxCrossEntropy>(
        params, std::vector<float>(tokens.begin(), tokens.end()), targets);
    CHECK(trainer.forward_backward(tokens, targets) ==
          doctest::Approx(ref.loss).epsilon(loss_tolerance));
    std::vector<double> shared = ref.gradients.at("0.weight");
    for (std::size_t i = 0; i < shared.size(); ++i) shared[i] += ref.gradients.at("4.weight")[i];
    CHECK(relative_error(gradients_of(trainer).at("0.weight"), shared) < gradient_tolerance);

    // Saved under Hugging Face's names once, as the embedding; a file with both names loads too.
    const TempPath saved("hf_tied"), both("hf_tied_both");
    trainer.save(saved.path(), hf_llama_names<Llama2>());
    auto file = io::load_safetensors(saved.path());
    CHECK(file.count("model.embed_tokens.weight") == 1);
    CHECK(file.count("lm_head.weight") == 0);
    std::vector<io::TensorView> state;
    for (const auto& [name, tensor] : file) state.push_back({name, tensor.shape, tensor.data});
    state.push_back({"lm_head.weight", file.at("model.embed_tokens.weight").shape,
                     file.at("model.embed_tokens.weight").data});
    io::save_safetensors(both.path(), state);
    Llama other(backend, {.seed = 4, .ties = ties});
    other.load(both.path(), hf_llama_names<Llama2>());
    CHECK(parameters_of(other) == params);
  }

  TEST_CASE("hf_llama_names refuses a model of another shape, naming the parameter") {
    check_error([] { (void)hf_llama_names<Pipeline<Stage<Emb, Block, Head>>>(); },
                "parameter \"1.input_layernorm.weight\" is not the final RMSNorm's");
    check_error(
        [] {
          (void)hf_llama_names<Pipeline<Stage<Linear<3, 4>, RMSNorm<4>, Linear<4, V, false>>>>();
        },
        "parameter \"0.bias\" is not a TokenEmbedding's");
    check_error(
        [] { (void)hf_llama_names<Pipeline<Stage<Emb, Block, RMSNorm<D>, Linear<D, V>>>>(); },
        "parameter \"3.bias\" is not a bias-free Linear head's");
  }
}
