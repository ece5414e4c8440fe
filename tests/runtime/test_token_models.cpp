// A GPT on the pipeline (host backend): for K in {1, 2, 4} stages, every schedule, M in {1, 2, 3}
// and remat never / always, the loss and every gradient equal the unpipelined double-precision
// model; predict returns its logits; micro-batches split between samples; the memory model
// predicts the measured activation peak; bad token input is a clear gpipe::Error; devices with a
// team of threads give the one-thread step. With packed documents and ignored (-100) targets: the
// same against the reference for K 1, 2, 4, several schedules and remat never / always; each
// document's logits are those it has alone; bad document ids and targets are errors that leave
// the trainer as it was.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/runtime/memory_model.hpp"
#include "support/errors.hpp"
#include "support/reference_model.hpp"
#include "support/token_models.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

constexpr std::size_t V = 7, T = 4, D = 8, H = 2;
constexpr std::size_t samples = 5;  // M = 2, 3 do not divide it
using Emb = Embedding<V, T, D>;
using Block = TransformerBlock<D, H>;
using Head = Linear<D, V>;

// One layer sequence, split three ways: the same names and, from one seed, the same parameters.
using Gpt1 = Pipeline<Stage<Emb, Block, Block, Block, LayerNorm<D>, Head>>;
using Gpt2 = Pipeline<Stage<Emb, Block, Block>, Stage<Block, LayerNorm<D>, Head>>;
using Gpt4 = Pipeline<Stage<Emb, Block>, Stage<Block>, Stage<Block>, Stage<LayerNorm<D>, Head>>;

static_assert(Gpt4::is_token_model && Gpt4::tokens_per_sample == T && Gpt4::vocab_size == V);
static_assert(Gpt4::in_features == 1 && Gpt4::out_features == V);
static_assert(!Pipeline<Stage<Linear<3, 4>>>::is_token_model);

std::vector<float> as_rows(const std::vector<std::int32_t>& tokens) {
  return {tokens.begin(), tokens.end()};
}

const std::vector<std::int32_t> tokens = random_tokens(samples * T, V, 1);
const std::vector<std::int32_t> targets = random_tokens(samples * T, V, 2);

constexpr double gradient_tolerance = token_gradient_tolerance;
constexpr double loss_tolerance = token_loss_tolerance;

template <class Model, class Schedule>
void check_against_reference(std::size_t m, Remat remat) {
  check_token_step<Model, Schedule>(m, remat, tokens, targets);
}

// Packed documents, one row a sample: runs that end inside a sample, an id that comes back after
// another (two documents), runs that go on across a sample border (new documents all the same).
const std::vector<std::int32_t> documents{0, 0, 1, 1,  //
                                          1, 2, 1, 1,  //
                                          2, 2, 2, 2,  //
                                          2, 0, 0, 3,  //
                                          3, 3, 3, 0};
// Targets with -100 (ignored) on the first two samples whole (micro-batch 0 of M = 3 has no
// target counted) and on about a quarter of the others' tokens.
std::vector<std::int32_t> with_ignored(std::vector<std::int32_t> y, std::uint64_t seed) {
  Rng rng(seed);
  for (std::size_t i = 0; i < y.size(); ++i)
    if (i < 2 * T || rng.next_u64() % 4 == 0) y[i] = -100;
  return y;
}

const std::vector<std::int32_t> ignored_targets = with_ignored(targets, 5);

template <class Model, class Schedule>
void check_packed_against_reference(std::size_t m, Remat remat) {
  check_token_step<Model, Schedule>(m, remat, tokens, ignored_targets, documents);
}

template <class Schedule>
void check_packed_schedule() {
  for (std::size_t m : {1u, 2u, 3u}) {
    for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
      if constexpr (Schedule::chunks_per_device == 1) {
        check_packed_against_reference<Gpt1, Schedule>(m, remat);
        check_packed_against_reference<Gpt2, Schedule>(m, remat);
      }
      check_packed_against_reference<Gpt4, Schedule>(m, remat);
    }
  }
}

template <class Schedule>
void check_schedule() {
  for (std::size_t m : {1u, 2u, 3u}) {
    for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
      if constexpr (Schedule::chunks_per_device == 1) {
        check_against_reference<Gpt1, Schedule>(m, remat);
        check_against_reference<Gpt2, Schedule>(m, remat);
      }
      check_against_reference<Gpt4, Schedule>(m, remat);
    }
  }
}

}  // namespace

TEST_SUITE("token models") {
  TEST_CASE("every split of a GPT into stages has the same parameters from one seed") {
    host::Backend backend(4);
    Trainer<Gpt1, SoftmaxCrossEntropy, host::Backend> one(backend, {.seed = 3});
    Trainer<Gpt4, SoftmaxCrossEntropy, host::Backend> four(backend, {.seed = 3});
    CHECK(parameters_of(one) == parameters_of(four));
    CHECK(Gpt4::parameters().front().name == "0.wte.weight");
    CHECK(Gpt4::parameters()[1].name == "0.wpe.weight");
    CHECK(Gpt4::parameters()[2].name == "1.ln_1.weight");
    CHECK(Gpt4::parameters().back().name == "5.bias");
  }

  TEST_CASE("a pipelined GPT step equals the unpipelined model: GPipe") { check_schedule<GPipe>(); }
  TEST_CASE("a pipelined GPT step equals the unpipelined model: 1F1B") {
    check_schedule<OneFOneB>();
  }
  TEST_CASE("a pipelined GPT step equals the unpipelined model: ZB-H1") {
    check_schedule<ZeroBubbleH1>();
  }
  TEST_CASE("a pipelined GPT step equals the unpipelined model: interleaved, 2 stages a device") {
    check_schedule<Interleaved<2>>();
  }
  TEST_CASE("a pipelined GPT step equals the unpipelined model: looped BFS, 2 stages a device") {
    check_schedule<LoopedBFS<2>>();
  }

  TEST_CASE("a GPT whose devices have a team of threads gives the one-thread step") {
    // Large enough that a team of two splits the attention core (a micro-batch's 8 (sample, head)
    // pairs of 2 causal products of T T d / 2 = 2^18 multiply-adds: four a block), the loss (256
    // rows of 512 classes) and the GEMMs; the kernel tests check each split bit for bit, this that
    // the pipeline hands the team to them, remat's recomputation included.
    constexpr std::size_t Vt = 512, Tt = 128, Dt = 128, Ht = 4, n = 4;
    using Gpt = Pipeline<Stage<Embedding<Vt, Tt, Dt>, TransformerBlock<Dt, Ht>>,
                         Stage<TransformerBlock<Dt, Ht>, LayerNorm<Dt>, Linear<Dt, Vt>>>;
    host::Team pair(2);
    REQUIRE(detail::attention_split(2, AttentionGeometry::packed(2, Tt, Ht, Dt / Ht), 2 * Ht, 2)
                .parts == 2);
    REQUIRE(host::Kernels<float>(0, &pair).split(2 * Tt, Vt).parts == 2);
    check_team_gives_one_thread_step<Gpt>(random_tokens(n * Tt, Vt, 4),
                                          random_tokens(n * Tt, Vt, 5));
  }

  TEST_CASE("predict returns the unpipelined model's logits for every token") {
    host::Backend backend(4);
    Trainer<Gpt4, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = 3});
    const std::vector<float> logits = trainer.predict(tokens);
    REQUIRE(logits.size() == samples * T * V);
    Trainer<Gpt1, SoftmaxCrossEntropy, host::Backend> single(backend, {.micro_batches = 1});
    const std::vector<float> single_logits = single.predict(tokens);
    CHECK(relative_error(std::vector<double>(logits.begin(), logits.end()),
                         std::vector<double>(single_logits.begin(), single_logits.end())) < 1e-6);
    // A sample's logits do not depend on the other samples in its batch.
    const std::vector<std::int32_t> first(tokens.begin(), tokens.begin() + T);
    const std::vector<float> alone = trainer.predict(first);
    CHECK(relative_error(std::vector<double>(alone.begin(), alone.end()),
                         std::vector<double>(logits.begin(), logits.begin() + T * V)) < 1e-6);
  }

  TEST_CASE("the memory model predicts a GPT's activation peak exactly") {
    for (std::size_t m : {1u, 2u, 3u}) {
      for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
        CAPTURE(m);
        CAPTURE(to_string(remat));
        host::Backend backend(4);
        Trainer<Gpt4, SoftmaxCrossEntropy, host::Backend, OneFOneB> trainer(
            backend, {.micro_batches = m, .remat = remat});
        const auto predicted = predict_memory<Gpt4>(trainer.schedule(), samples * T, remat);
        backend.reset_peak();
        trainer.forward_backward(tokens, targets);
        for (std::size_t d = 0; d < 4; ++d) {
          CAPTURE(d);
          const MemoryStats stats = backend.memory_stats(d);
          CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
          CHECK(stats.peak <= predicted[d].total_bound());
        }
      }
    }
  }

  TEST_CASE("bad token input is a gpipe::Error that says what was expected") {
    host::Backend backend(2);
    Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = 2});
    std::vector<std::int32_t> bad = tokens;
    bad[6] = static_cast<std::int32_t>(V);
    check_error([&] { trainer.forward_backward(bad, targets); },
                "token 6 (sample 1, position 2) is 7, expected an id in [0, 7)");
    bad[6] = -1;
    check_error([&] { trainer.predict(bad); }, "is -1, expected an id in [0, 7)");
    const std::vector<std::int32_t> partial(tokens.begin(), tokens.begin() + T + 1);
    check_error([&] { trainer.forward_backward(partial, targets); },
                "5 tokens, which is not a positive number of whole samples of T = 4");
    const std::vector<std::int32_t> one_sample(tokens.begin(), tokens.begin() + T);
    const std::vector<std::int32_t> one_target(targets.begin(), targets.begin() + T);
    check_error([&] { trainer.forward_backward(one_sample, one_target); },
                "1 samples, fewer than micro_batches = 2");
    check_error([&] { trainer.forward_backward(tokens, one_target); },
                "y has 4 targets, expected 20 (20 tokens x 1)");
    std::vector<std::int32_t> bad_target = targets;
    bad_target[3] = 9;
    check_error([&] { trainer.forward_backward(tokens, bad_target); },
                "target 3 is 9, expected a class id in [0, 7)");
    check_error([&] { trainer.predict(std::vector<std::int32_t>{}); },
                "0 tokens, which is not a positive number of whole samples");
    // Nothing was left behind: a good step still works and matches a fresh trainer.
    CHECK(std::isfinite(trainer.forward_backward(tokens, targets)));
  }
}

TEST_SUITE("token models: packed documents and ignored targets") {
  TEST_CASE("the packed batch has what the tests need") {
    // runs that end inside a sample, an id in two runs of one sample, a sample with one run
    bool inside = false, repeated = false;
    for (std::size_t b = 0; b < samples; ++b)
      for (std::size_t t = 1; t < T; ++t) {
        const std::size_t r = b * T + t;
        inside = inside || documents[r] != documents[r - 1];
        for (std::size_t u = b * T; u + 1 < r; ++u)
          repeated = repeated || (documents[u] == documents[r] && documents[u + 1] != documents[r]);
      }
    CHECK(inside);
    CHECK(repeated);
    CHECK(std::count(ignored_targets.begin(), ignored_targets.end(), -100) > 2 * T);
  }

  TEST_CASE("a pipelined GPT step with documents and ignored targets equals the reference: GPipe") {
    check_packed_schedule<GPipe>();
  }
  TEST_CASE("a pipelined GPT step with documents and ignored targets equals the reference: 1F1B") {
    check_packed_schedule<OneFOneB>();
  }
  TEST_CASE("a pipelined GPT step with documents and ignored targets equals the reference: ZB-H1") {
    check_packed_schedule<ZeroBubbleH1>();
  }
  TEST_CASE(
      "a pipelined GPT step with documents and ignored targets equals the reference: "
      "interleaved, 2 stages a device") {
    check_packed_schedule<Interleaved<2>>();
  }
  TEST_CASE("a pipelined GPT step with documents and ignored targets equals the reference: ZB-V") {
    for (Remat remat : {Remat::never, Remat::always, Remat::except_last, Remat::selective})
      check_packed_against_reference<Gpt4, ZeroBubbleV>(3, remat);
  }

  TEST_CASE("Checkpoint hands the document ids to the layers it recomputes") {
    // the same names and parameters as Gpt2 (Checkpoint is transparent), so Gpt2's reference
    using Checkpointed = Pipeline<Stage<Emb, Checkpoint<Block, Block>>,
                                  Stage<Checkpoint<Block>, LayerNorm<D>, Head>>;
    host::Backend backend(2);
    Trainer<Checkpointed, SoftmaxCrossEntropy, host::Backend, OneFOneB> trainer(
        backend, {.micro_batches = 2, .seed = 3});
    const float loss = trainer.forward_backward(tokens, ignored_targets, documents);
    const ReferenceResult ref = reference_step<Gpt2, SoftmaxCrossEntropy>(
        parameters_of(trainer), as_rows(tokens), ignored_targets, documents);
    CHECK(loss == doctest::Approx(ref.loss).epsilon(loss_tolerance));
    for (const auto& [name, g] : gradients_of(trainer)) {
      CAPTURE(name);
      CHECK(relative_error(g, ref.gradients.at(name)) < gradient_tolerance);
    }
  }

  TEST_CASE("each packed document gets the logits it has alone at the start of a sample") {
    host::Backend backend(2);
    Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend> trainer(backend,
                                                              {.micro_batches = 2, .seed = 3});
    // sample 0: document a (1 token) then b (3 tokens); sample 1: c (2), then a again (2)
    const std::vector<std::int32_t> packed{3, 1, 4, 1, 5, 2, 6, 5};
    const std::vector<std::int32_t> ids{7, 8, 8, 8, 9, 9, 7, 7};
    const std::vector<float> logits = trainer.predict(packed, ids);
    // each document alone, first in a sample of its own, then tokens it must not see
    const std::vector<std::int32_t> alone{3, 0, 0, 0, 1, 4, 1, 0, 5, 2, 0, 0, 6, 5, 0, 0};
    const std::vector<float> want = trainer.predict(alone);
    const std::vector<std::pair<std::size_t, std::size_t>> rows{{0, 0}, {1, 4}, {2, 5},  {3, 6},
                                                                {4, 8}, {5, 9}, {6, 12}, {7, 13}};
    for (const auto& [packed_row, alone_row] : rows) {
      CAPTURE(packed_row);
      const auto row = [](const std::vector<float>& l, std::size_t r) {
        return std::vector<double>(l.begin() + static_cast<std::ptrdiff_t>(r * V),
                                   l.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
      };
      CHECK(relative_error(row(logits, packed_row), row(want, alone_row)) < 1e-6);
    }
    // without the ids the same tokens are one document per sample: other logits
    CHECK(relative_error(std::vector<double>(logits.begin(), logits.end()), [&] {
            const std::vector<float> l = trainer.predict(packed);
            return std::vector<double>(l.begin(), l.end());
          }()) > 1e-3);
  }

  TEST_CASE("one id per sample is one document per sample, the step without ids") {
    host::Backend backend(2);
    std::vector<std::int32_t> same_id(tokens.size(), 0);  // runs end at sample borders
    Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, OneFOneB> with(
        backend, {.micro_batches = 2, .seed = 3}),
        without(backend, {.micro_batches = 2, .seed = 3});
    CHECK(with.forward_backward(tokens, targets, same_id) ==
          doctest::Approx(without.forward_backward(tokens, targets)).epsilon(1e-6));
    for (const auto& [name, g] : gradients_of(without)) {
      CAPTURE(name);
      CHECK(relative_error(gradients_of(with).at(name), g) < 1e-6);
    }
  }

  TEST_CASE("the loss with ignored targets is the mean over the targets counted in the batch") {
    // M = 3 micro-batches of 2, 2 and 1 samples count 0, some and some targets: the mean is over
    // the whole batch's count, so the loss does not depend on M
    host::Backend backend(2);
    Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend> one(backend, {.micro_batches = 1, .seed = 3}),
        three(backend, {.micro_batches = 3, .seed = 3});
    const float loss = one.forward_backward(tokens, ignored_targets);
    CHECK(three.forward_backward(tokens, ignored_targets) == doctest::Approx(loss).epsilon(1e-6));
    // samples 0 and 1 count no target: the batch's loss is that of samples 2 to 4 alone
    Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend> rest(backend,
                                                           {.micro_batches = 3, .seed = 3});
    const std::span<const std::int32_t> x(tokens), y(ignored_targets);
    CHECK(rest.forward_backward(x.subspan(2 * T), y.subspan(2 * T)) ==
          doctest::Approx(loss).epsilon(1e-6));
    for (const auto& [name, g] : gradients_of(one)) {
      CAPTURE(name);
      CHECK(relative_error(gradients_of(rest).at(name), g) < 1e-6);
    }
  }

  TEST_CASE("bad document ids and targets are gpipe::Errors that leave the trainer as it was") {
    host::Backend backend(2);
    Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, OneFOneB> trainer(
        backend, {.micro_batches = 2, .seed = 3});
    trainer.forward_backward(tokens, ignored_targets, documents);
    const NamedTensors before = gradients_of(trainer);
    const std::vector<std::int32_t> short_ids(documents.begin(), documents.end() - 1);
    check_error([&] { trainer.forward_backward(tokens, ignored_targets, short_ids); },
                "document_ids has 19 ids, expected 20 (one per token, as many as tokens)");
    check_error([&] { trainer.predict(tokens, std::vector<std::int32_t>{}); },
                "document_ids has 0 ids, expected 20");
    std::vector<std::int32_t> longer = documents;
    longer.push_back(0);
    check_error([&] { trainer.predict(tokens, longer); }, "document_ids has 21 ids, expected 20");
    const std::vector<std::int32_t> all_ignored(tokens.size(), -100);
    check_error([&] { trainer.forward_backward(tokens, all_ignored, documents); },
                "all 20 targets are -100 (ignored); expected at least one class id in [0, 7)");
    for (const std::int32_t bad : {-1, -99, -101, std::numeric_limits<std::int32_t>::min()}) {
      CAPTURE(bad);
      std::vector<std::int32_t> y = ignored_targets;
      y[11] = bad;
      check_error([&] { trainer.forward_backward(tokens, y, documents); },
                  "target 11 is " + std::to_string(bad) +
                      ", expected a class id in [0, 7) or -100 (ignored)");
    }
    CHECK(gradients_of(trainer) == before);
    // and the next step adds what a fresh trainer's step gives
    Trainer<Gpt2, SoftmaxCrossEntropy, host::Backend, OneFOneB> fresh(
        backend, {.micro_batches = 2, .seed = 3});
    CHECK(trainer.forward_backward(tokens, ignored_targets, documents) ==
          fresh.forward_backward(tokens, ignored_targets, documents));
    for (const auto& [name, g] : gradients_of(fresh)) {
      CAPTURE(name);
      std::vector<double> twice = g;
      for (double& v : twice) v *= 2;
      CHECK(relative_error(gradients_of(trainer).at(name), twice) < 1e-6);
    }
  }
}

namespace {

// GPT-2's tying: the LM head (no bias) is the token embedding, across the first and last stage.
using TiedHead = Linear<D, V, false>;
using TiedGpt1 = Pipeline<Stage<Emb, Block, Block, Block, LayerNorm<D>, TiedHead>>;
using TiedGpt4 =
    Pipeline<Stage<Emb, Block>, Stage<Block>, Stage<Block>, Stage<LayerNorm<D>, TiedHead>>;
using TiedTrainer4 = Trainer<TiedGpt4, SoftmaxCrossEntropy, host::Backend, OneFOneB>;
const std::vector<Tie> gpt2_ties{{.parameter = "5.weight", .to = "0.wte.weight"}};

}  // namespace

TEST_SUITE("token models") {
  TEST_CASE("clip_grad_norm counts a tied pair once") {
    host::Backend backend(4);
    TiedTrainer4 trainer(backend, {.micro_batches = 2, .seed = 3, .ties = gpt2_ties});
    trainer.forward_backward(tokens, targets);
    double once = 0;  // every tensor's squares, the LM head's (the embedding's twin) left out
    for (const auto& [name, g] : gradients_of(trainer))
      if (name != "5.weight")
        for (const double v : g) once += v * v;
    CHECK(trainer.clip_grad_norm(1e30) == doctest::Approx(std::sqrt(once)).epsilon(1e-6));
  }

  TEST_CASE("a tied LM head and embedding hold one tensor and the sum of both gradients") {
    host::Backend backend(4);
    for (std::size_t m : {1u, 3u}) {
      CAPTURE(m);
      TiedTrainer4 trainer(backend, {.micro_batches = m, .seed = 3, .ties = gpt2_ties});
      const NamedTensors params = parameters_of(trainer);
      REQUIRE(params.at("5.weight") == params.at("0.wte.weight"));
      // The untied reference at the same (equal) tensors: d loss / d shared = the sum of both.
      const ReferenceResult ref =
          reference_step<TiedGpt1, SoftmaxCrossEntropy>(params, as_rows(tokens), targets);
      const float loss = trainer.forward_backward(tokens, targets);
      CHECK(loss == doctest::Approx(ref.loss).epsilon(loss_tolerance));
      std::vector<double> shared = ref.gradients.at("0.wte.weight");
      for (std::size_t i = 0; i < shared.size(); ++i) shared[i] += ref.gradients.at("5.weight")[i];
      const NamedTensors grads = gradients_of(trainer);
      CHECK(relative_error(grads.at("0.wte.weight"), shared) < gradient_tolerance);
      CHECK(grads.at("5.weight") == grads.at("0.wte.weight"));
      CHECK(relative_error(grads.at("0.wpe.weight"), ref.gradients.at("0.wpe.weight")) <
            gradient_tolerance);

      // A second step without zero_grad adds each step's sum once.
      trainer.forward_backward(tokens, targets);
      std::vector<double> twice = shared;
      for (double& g : twice) g *= 2;
      CHECK(relative_error(gradients_of(trainer).at("0.wte.weight"), twice) < gradient_tolerance);
      CHECK(gradients_of(trainer).at("5.weight") == gradients_of(trainer).at("0.wte.weight"));

      // An optimizer step keeps the two equal.
      trainer.step(optim::AdamW({.lr = 1e-2, .weight_decay = 0.1}));
      const NamedTensors stepped = parameters_of(trainer);
      CHECK(stepped.at("5.weight") == stepped.at("0.wte.weight"));
      CHECK(stepped.at("0.wte.weight") != params.at("0.wte.weight"));
    }
  }

  TEST_CASE("a tied tensor is saved once and loads back into both") {
    host::Backend backend(4);
    TiedTrainer4 trainer(backend, {.seed = 3, .ties = gpt2_ties});
    trainer.save("tied.safetensors");
    const auto saved = io::load_safetensors("tied.safetensors");
    CHECK(saved.count("0.wte.weight") == 1);
    CHECK(saved.count("5.weight") == 0);
    TiedTrainer4 other(backend, {.seed = 4, .ties = gpt2_ties});
    other.load("tied.safetensors");
    CHECK(parameters_of(other) == parameters_of(trainer));
    // set_parameter on either name sets the shared tensor.
    std::vector<float> ones(V * D, 1.0f);
    other.set_parameter("5.weight", ones);
    CHECK(other.parameter("0.wte.weight") == ones);
    // A file that holds both names with different values is refused.
    Trainer<Gpt4, SoftmaxCrossEntropy, host::Backend> untied(backend, {.seed = 3});
    std::vector<float> head(V * D, 0.5f);
    untied.set_parameter("5.weight", head);
    untied.save("both.safetensors");
    check_error(
        [&] {
          Trainer<Gpt4, SoftmaxCrossEntropy, host::Backend> tied(
              backend, {.seed = 3, .ties = {{.parameter = "5.weight", .to = "0.wte.weight"}}});
          tied.load("both.safetensors");
        },
        "\"5.weight\" is tied to \"0.wte.weight\", but the file holds different values");
  }

  TEST_CASE("gradient accumulation: scale_gradients(1 / A) after A equal batches is their mean's") {
    host::Backend backend(4);
    TiedTrainer4 whole(backend, {.micro_batches = 2, .seed = 3, .ties = gpt2_ties});
    TiedTrainer4 accumulated(backend, {.micro_batches = 2, .seed = 3, .ties = gpt2_ties});
    const std::span<const std::int32_t> x(tokens.data(), 4 * T), y(targets.data(), 4 * T);
    const float loss = whole.forward_backward(x, y);
    const float first = accumulated.forward_backward(x.first(2 * T), y.first(2 * T));
    const float second = accumulated.forward_backward(x.subspan(2 * T), y.subspan(2 * T));
    CHECK((first + second) / 2 == doctest::Approx(loss).epsilon(loss_tolerance));
    accumulated.scale_gradients(0.5);
    const NamedTensors want = gradients_of(whole), got = gradients_of(accumulated);
    for (const auto& [name, g] : want) {
      CAPTURE(name);
      CHECK(relative_error(got.at(name), g) < gradient_tolerance);
    }
    CHECK(got.at("5.weight") == got.at("0.wte.weight"));
    check_error([&] { accumulated.scale_gradients(std::nan("")); }, "must be finite, got nan");
  }

  TEST_CASE("nanoGPT's names: save writes them and load reads a state dict with masks and ties") {
    host::Backend backend(4);
    const NameMap names = nanogpt_names<TiedGpt4>();
    CHECK(names.file_name("0.wte.weight") == "transformer.wte.weight");
    CHECK(names.file_name("0.wpe.weight") == "transformer.wpe.weight");
    CHECK(names.file_name("1.attn.c_attn.weight") == "transformer.h.0.attn.c_attn.weight");
    CHECK(names.file_name("3.mlp.c_proj.bias") == "transformer.h.2.mlp.c_proj.bias");
    CHECK(names.file_name("4.bias") == "transformer.ln_f.bias");
    CHECK(names.file_name("5.weight") == "lm_head.weight");
    CHECK(nanogpt_names<Gpt1>().file_name("5.bias") == "lm_head.bias");
    TiedTrainer4 trainer(backend, {.seed = 3, .ties = gpt2_ties});
    trainer.save("nanogpt.safetensors", names);
    auto file = io::load_safetensors("nanogpt.safetensors");
    CHECK(file.size() == parameters_of(trainer).size() - 1);  // the tied tensor once, as wte
    CHECK(file.count("transformer.wte.weight") == 1);
    CHECK(file.count("transformer.h.2.ln_2.weight") == 1);
    CHECK(file.count("lm_head.weight") == 0);

    // A state dict as nanoGPT's GPT holds it: both tied names, a causal mask per block.
    std::vector<io::TensorView> state;
    for (const auto& [name, tensor] : file) state.push_back({name, tensor.shape, tensor.data});
    state.push_back({"lm_head.weight", file.at("transformer.wte.weight").shape,
                     file.at("transformer.wte.weight").data});
    const std::vector<float> mask(T * T, 1.0f);
    for (int block = 0; block < 3; ++block)
      state.push_back(
          {"transformer.h." + std::to_string(block) + ".attn.bias", {1, 1, T, T}, mask});
    io::save_safetensors("state_dict.safetensors", state);
    TiedTrainer4 other(backend, {.seed = 4, .ties = gpt2_ties});
    REQUIRE(parameters_of(other) != parameters_of(trainer));
    other.load("state_dict.safetensors", names);
    CHECK(parameters_of(other) == parameters_of(trainer));

    // Only the head's name (as safetensors' save_model may keep it): the tie reads it.
    std::erase_if(state,
                  [](const io::TensorView& t) { return t.name == "transformer.wte.weight"; });
    io::save_safetensors("head_only.safetensors", state);
    TiedTrainer4 third(backend, {.seed = 5, .ties = gpt2_ties});
    third.load("head_only.safetensors", names);
    CHECK(parameters_of(third) == parameters_of(trainer));

    // What still fails: a tensor the model lacks (without a skipped suffix), a missing one under
    // its file name, a map that gives two parameters one name or renames an unknown one.
    state.push_back({"transformer.h.0.attn.rotary", {T, T}, mask});
    io::save_safetensors("extra.safetensors", state);
    check_error([&] { third.load("extra.safetensors", names); },
                "has a tensor \"transformer.h.0.attn.rotary\" that the model does not have");
    check_error([&] { third.load("nanogpt.safetensors"); },
                "has no tensor \"0.wte.weight\" that the model needs");
    trainer.save("gpipe_names.safetensors");
    check_error([&] { third.load("gpipe_names.safetensors", names); },
                "has no tensor \"transformer.wte.weight\" that the model needs");
    NameMap twice = names;
    twice.rename("4.weight", "transformer.ln_f.bias");
    check_error([&] { third.save("twice.safetensors", twice); },
                "gives \"4.bias\" and \"4.weight\" the same name \"transformer.ln_f.bias\"");
    check_error([&] { third.load("nanogpt.safetensors", NameMap(names).rename("9.weight", "x")); },
                "the name map renames \"9.weight\" (to \"x\"), which the model does not have");
    CHECK(parameters_of(third) == parameters_of(trainer));  // no failed load changed it
  }

  TEST_CASE("nanogpt_names refuses a model of another shape, naming the parameter") {
    check_error([] { (void)nanogpt_names<Pipeline<Stage<Emb, Block, Head>>>(); },
                "parameter \"1.attn.c_attn.weight\" is not the final LayerNorm's");
    check_error(
        [] { (void)nanogpt_names<Pipeline<Stage<Linear<3, 4>, LayerNorm<4>, Linear<4, 2>>>>(); },
        "parameter \"0.weight\" is not an Embedding's");
  }

  TEST_CASE("a tie that cannot hold is a gpipe::Error at construction") {
    host::Backend backend(4);
    using Untied = Trainer<Gpt4, SoftmaxCrossEntropy, host::Backend>;
    check_error([&] { Untied(backend, {.ties = {{.parameter = "5.bias", .to = "0.wte.weight"}}}); },
                "their shapes differ ([7] and [7, 8])");
    check_error(
        [&] { Untied(backend, {.ties = {{.parameter = "9.weight", .to = "0.wte.weight"}}}); },
        "the model has no parameter \"9.weight\"");
    check_error([&] { Untied(backend, {.ties = {{.parameter = "5.weight", .to = "5.weight"}}}); },
                "cannot be tied to itself");
    check_error(
        [&] {
          Untied(backend, {.ties = {{.parameter = "5.weight", .to = "0.wte.weight"},
                                    {.parameter = "5.weight", .to = "0.wte.weight"}}});
        },
        "is already tied to \"0.wte.weight\"");
  }
}
