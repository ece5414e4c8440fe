// The token-model layers against independent references: GELUTanh, the causal attention core,
// CausalSelfAttention and TransformerBlock (both backward ops against central finite differences
// in double, float against double), the attention core's forward against a direct evaluation of
// its definition, causality and independence of samples, and Embedding's gather and scatter-add;
// with packed documents (document ids per row) the same checks, against a mask and positions
// written here from the definition of a document run.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <vector>

#include "gpipe/backend/host.hpp"
#include "gpipe/model.hpp"
#include "support/finite_difference.hpp"
#include "support/layer_problem.hpp"

namespace {

using gpipe::Rng;
using gpipe::test::LayerRun;
using gpipe::test::relative_error;

constexpr std::size_t T = 3;        // tokens per sample
constexpr std::size_t samples = 2;  // rows = samples T
constexpr std::size_t rows = samples * T;

using GeluTanh6 = gpipe::GELUTanh::with_features<6>;
using AttentionCore = gpipe::detail::CausalAttentionCore<4, 2, T>;
using SelfAttention = gpipe::CausalSelfAttention<4, 2>::with_tokens<T>;
using SelfAttentionOneHead = gpipe::CausalSelfAttention<3, 1>::with_tokens<T>;
using Block = gpipe::TransformerBlock<4, 2>::with_tokens<T>;

static_assert(gpipe::kernel_context<gpipe::host::Kernels<float>>);
static_assert(gpipe::kernel_context<gpipe::host::Kernels<double>>);
static_assert(gpipe::layer_for<Block, gpipe::host::Kernels<double>>);
static_assert(gpipe::has_layer_kernels<gpipe::CausalAttentionOp, gpipe::host::Kernels<float>>);
static_assert(!gpipe::has_layer_kernels<gpipe::CausalAttentionOp, int>);

// L's problem on `rows` rows.
template <class L>
struct Problem : gpipe::test::LayerProblem<L> {
  explicit Problem(std::uint64_t seed) : gpipe::test::LayerProblem<L>(rows, seed) {}
};

// Document ids of the rows (2 samples of 3 tokens): sample 0 is runs {0, 1}, {2}; sample 1
// starts with sample 0's last id, yet a new run (runs end at sample borders): {3, 4}, {5}.
const std::vector<std::int32_t> documents{5, 5, 2, 2, 2, 1};
// Two runs of one id are two documents: sample 0 {0}, {1}, {2} (ids 1, 2, 1); sample 1 {3, 4, 5}.
const std::vector<std::int32_t> repeated_ids{1, 2, 1, 4, 4, 4};

// The first row of row r's document: walk back while the previous row is in r's sample and has
// its id (empty ids: the sample's first row).
std::size_t run_start(const std::vector<std::int32_t>& ids, std::size_t r) {
  std::size_t u = r;
  while (u % T != 0 && !ids.empty() && ids[u - 1] == ids[r]) --u;
  return ids.empty() ? r - r % T : u;
}

// The attention core's output by its definition, in long double: per sample b, head h, query t,
// o = sum_{t' <= t} softmax_t'(q . k_t' / sqrt d) v_t', t' from the start of t's document (ids,
// or the sample's start without).
std::vector<double> attention_by_definition(const std::vector<double>& qkv, std::size_t heads,
                                            std::size_t d,
                                            const std::vector<std::int32_t>& ids = {}) {
  const std::size_t D = heads * d;
  std::vector<double> o(rows * D);
  auto at = [&](std::size_t row, std::size_t part, std::size_t h, std::size_t i) {
    return static_cast<long double>(qkv[row * 3 * D + part * D + h * d + i]);
  };
  for (std::size_t b = 0; b < samples; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t t = 0; t < T; ++t) {
        const std::size_t first = run_start(ids, b * T + t) - b * T;
        std::vector<long double> score(t + 1, -INFINITY);
        for (std::size_t u = first; u <= t; ++u) {
          long double dot = 0;
          for (std::size_t i = 0; i < d; ++i)
            dot += at(b * T + t, 0, h, i) * at(b * T + u, 1, h, i);
          score[u] = dot / std::sqrt(static_cast<long double>(d));
        }
        const long double max = *std::max_element(score.begin(), score.end());
        long double sum = 0;
        for (long double& s : score) sum += s = std::exp(s - max);
        for (std::size_t i = 0; i < d; ++i) {
          long double acc = 0;
          for (std::size_t u = first; u <= t; ++u) acc += score[u] / sum * at(b * T + u, 2, h, i);
          o[(b * T + t) * D + h * d + i] = static_cast<double>(acc);
        }
      }
    }
  }
  return o;
}

}  // namespace

TYPE_TO_STRING_AS("GELUTanh at width 6", GeluTanh6);
TYPE_TO_STRING_AS("the causal attention core (D = 4, H = 2, T = 3)", AttentionCore);
TYPE_TO_STRING_AS("CausalSelfAttention<4, 2> at T = 3", SelfAttention);
TYPE_TO_STRING_AS("CausalSelfAttention<3, 1> at T = 3", SelfAttentionOneHead);
TYPE_TO_STRING_AS("TransformerBlock<4, 2> at T = 3", Block);

#define GPIPE_TOKEN_LAYERS GeluTanh6, AttentionCore, SelfAttention, SelfAttentionOneHead, Block

TEST_SUITE("token model layers") {
  TEST_CASE_TEMPLATE("a token layer's backward ops match central differences in double", L,
                     GPIPE_TOKEN_LAYERS) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      CAPTURE(seed);
      gpipe::test::check_backward_against_differences(Problem<L>(seed));
    }
  }

  TEST_CASE_TEMPLATE("with document ids a token layer's backward ops match central differences", L,
                     GPIPE_TOKEN_LAYERS) {
    for (const auto& ids : {documents, repeated_ids}) {
      for (std::uint64_t seed : {1u, 2u}) {
        CAPTURE(seed);
        gpipe::test::check_backward_against_differences(Problem<L>(seed), ids);
      }
    }
  }

  TEST_CASE_TEMPLATE("a token layer's float kernels agree with its double kernels", L,
                     GPIPE_TOKEN_LAYERS) {
    const Problem<L> p(31);
    auto f = p.template run<float>();
    auto d = p.template run<double>();
    f.forward_backward();
    d.forward_backward();
    CHECK(relative_error(f.y, d.y) <= 1e-5);
    CHECK(relative_error(f.dx, d.dx) <= 1e-5);
    CHECK(relative_error(f.grads, d.grads) <= 1e-5);
  }

  TEST_CASE("the attention core's forward is causal softmax(q k^T / sqrt d) v per head") {
    const Problem<AttentionCore> p(5);
    auto run = p.run<double>();
    run.forward();
    CHECK(relative_error(run.y, attention_by_definition(p.x, 2, 2)) <= 1e-14);
  }

  TEST_CASE("with document ids the attention core attends only within each token's document") {
    const Problem<AttentionCore> p(7);
    for (const auto& ids : {documents, repeated_ids}) {
      auto run = p.run<double>();
      run.document = ids;
      run.forward();
      CHECK(relative_error(run.y, attention_by_definition(p.x, 2, 2, ids)) <= 1e-14);
      // the mask matters here: without it the output differs
      CHECK(relative_error(run.y, attention_by_definition(p.x, 2, 2)) > 1e-3);
    }
  }

  TEST_CASE("attention reads no later token and no other sample") {
    const Problem<SelfAttention> p(6);
    auto base = p.run<double>();
    base.forward();
    // Change the last token of sample 0: rows 0..T-2 and all of sample 1 keep their output.
    auto changed = p.run<double>();
    for (std::size_t i = 0; i < SelfAttention::in_features; ++i)
      changed.x[(T - 1) * SelfAttention::in_features + i] += 0.5;
    changed.forward();
    const std::size_t width = SelfAttention::out_features;
    for (std::size_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      const bool affected = r == T - 1;
      bool same = true;
      for (std::size_t i = 0; i < width; ++i)
        same = same && base.y[r * width + i] == changed.y[r * width + i];
      CHECK(same == !affected);
    }
  }

  TEST_CASE("GELUTanh is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), near the erf GELU") {
    const std::vector<double> x{-4, -2.5, -1, -0.5, -1e-3, 0, 1e-3, 0.25, 0.5, 1, 2, 3.5};
    std::vector<double> y(x.size());
    gpipe::host::Kernels<double> k;
    gpipe::LayerKernels<gpipe::GeluTanhOp, gpipe::host::Kernels<double>>::forward(
        k, x.size(), x.data(), y.data());
    for (std::size_t i = 0; i < x.size(); ++i) {
      CAPTURE(x[i]);
      const long double v = x[i];
      const long double u =
          std::sqrt(2.0L / std::numbers::pi_v<long double>) * (v + 0.044715L * v * v * v);
      CHECK(y[i] ==
            doctest::Approx(static_cast<double>(0.5L * v * (1 + std::tanh(u)))).epsilon(1e-15));
      CHECK(std::abs(y[i] - 0.5 * x[i] * (1 + std::erf(x[i] / std::numbers::sqrt2))) < 1e-3);
    }
  }

  TEST_CASE("TransformerBlock names its parameters as nanoGPT does") {
    const auto specs = Block::param_specs();
    const std::vector<std::string_view> names{
        "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
        "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    REQUIRE(specs.size() == names.size());
    std::size_t offset = 0;
    for (std::size_t k = 0; k < specs.size(); ++k) {
      CAPTURE(names[k]);
      CHECK(specs[k].name == names[k]);
      CHECK(specs[k].depth == 0);
      CHECK(specs[k].offset == offset);  // the tensors tile the block's parameters in this order
      offset += specs[k].size();
    }
    CHECK(offset == Block::num_params);
    CHECK(specs[2].shape == std::array<std::size_t, 2>{12, 4});
    CHECK(specs[10].shape == std::array<std::size_t, 2>{4, 16});
  }
}

TEST_SUITE("token model layers") {
  using Emb = gpipe::Embedding<5, T, 4>;

  TEST_CASE("Embedding adds the id's row of wte to the position's row of wpe") {
    LayerRun<Emb, double> run(rows);
    Rng rng(9);
    run.params = gpipe::test::uniform_values(rng, Emb::num_params, -1.0f, 1.0f);
    run.x = {4, 0, 4, 2, 2, 1};
    run.forward();
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < 4; ++i) {
        const auto id = static_cast<std::size_t>(run.x[r]);
        CHECK(run.y[r * 4 + i] == run.params[id * 4 + i] + run.params[20 + (r % T) * 4 + i]);
      }
  }

  TEST_CASE("with document ids Embedding's position restarts at 0 where a document starts") {
    LayerRun<Emb, double> run(rows);
    Rng rng(11);
    run.params = gpipe::test::uniform_values(rng, Emb::num_params, -1.0f, 1.0f);
    run.x = {4, 0, 4, 2, 2, 1};
    for (const auto& ids : {documents, repeated_ids}) {
      run.document = ids;
      run.forward();
      for (std::size_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        const std::size_t position = r - run_start(ids, r);
        for (std::size_t i = 0; i < 4; ++i) {
          const auto id = static_cast<std::size_t>(run.x[r]);
          CHECK(run.y[r * 4 + i] == run.params[id * 4 + i] + run.params[20 + position * 4 + i]);
        }
      }
    }
  }

  TEST_CASE("with document ids Embedding's W adds each row into its position's row of wpe") {
    Rng rng(12);
    const std::vector<double> params =
        gpipe::test::uniform_values(rng, Emb::num_params, -1.0f, 1.0f);
    const std::vector<double> c = gpipe::test::uniform_values(rng, rows * 4, -1.0f, 1.0f);
    const std::vector<double> ids{4, 0, 4, 2, 4, 1};
    const auto check = gpipe::test::check_gradients<Emb>(ids, params, c, rows, 1e-6, documents);
    CHECK(check.params_error <= 1e-9);
    CHECK(check.max_grad > 1e-1);
    LayerRun<Emb, double> run(rows);
    run.x = ids;
    run.params = params;
    run.dy = c;
    run.document = documents;  // positions 0 1 0, 0 1 0
    run.forward_backward();
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(run.grads[20 + 0 * 4 + i] ==
            ((c[0 * 4 + i] + c[2 * 4 + i]) + c[3 * 4 + i]) + c[5 * 4 + i]);
      CHECK(run.grads[20 + 1 * 4 + i] == c[1 * 4 + i] + c[4 * 4 + i]);
      CHECK(run.grads[20 + 2 * 4 + i] == 0);  // no document reaches position 2
    }
  }

  TEST_CASE("Embedding's W matches central differences and adds repeated ids up") {
    Rng rng(10);
    const std::vector<double> params =
        gpipe::test::uniform_values(rng, Emb::num_params, -1.0f, 1.0f);
    const std::vector<double> c = gpipe::test::uniform_values(rng, rows * 4, -1.0f, 1.0f);
    const std::vector<double> ids{4, 0, 4, 2, 4, 1};  // id 4 three times, id 3 never
    const auto check = gpipe::test::check_gradients<Emb>(ids, params, c, rows, 1e-6);
    CHECK(check.params_error <= 1e-9);
    CHECK(check.max_grad > 1e-1);
    CHECK(check.dx_error == 0);  // d y / d id = 0, numerically too
    LayerRun<Emb, double> run(rows);
    run.x = ids;
    run.params = params;
    run.dy = c;
    run.forward_backward();
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(run.grads[4 * 4 + i] == c[0 * 4 + i] + c[2 * 4 + i] + c[4 * 4 + i]);
      CHECK(run.grads[3 * 4 + i] == 0);
      CHECK(run.grads[20 + 1 * 4 + i] == c[1 * 4 + i] + c[4 * 4 + i]);  // position 1
    }
  }
}

TEST_SUITE("token model layers") {
  // Of TransformerBlock<D, H>'s stash, 15 D + 2 H + 4 per row, Remat::selective drops ln_1's and
  // ln_2's outputs and statistics and GELU's output, 6 D + 4; it keeps qkv, the attention output
  // o, the log-sum-exps, c_fc's output and the first residual's output. Attention keeps all.
  static_assert(Block::stash_per_row == 15 * 4 + 2 * 2 + 4 && Block::cheap_stash_per_row == 28);
  static_assert(SelfAttention::cheap_stash_per_row == 0);

  TEST_CASE("TransformerBlock's recompute rebuilds its cheap stash bit for bit, with documents") {
    const Problem<Block> p(83);
    for (bool with_documents : {false, true}) {
      CAPTURE(with_documents);
      LayerRun<Block, float> run = p.run<float>();
      if (with_documents) run.document = documents;
      run.forward();
      const std::vector<float> stash = run.stash;
      run.recompute();
      // bit for bit: NaN where nothing writes (the float log-sum-exps fill half their room)
      CHECK(std::memcmp(run.stash.data(), stash.data(), stash.size() * sizeof(float)) == 0);
    }
  }
}
