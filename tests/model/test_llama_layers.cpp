// The Llama family's layers against independent references: RMSNorm, TokenEmbedding, SwiGLU and
// LlamaBlock (both backward ops against central finite differences in double, with and without
// document ids; float against double), RMSNorm and RoPE against their formulas, and the document
// mask and position restart of LlamaBlock against the same tokens as a sample of their own.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "gpipe/backend/host.hpp"
#include "gpipe/model.hpp"
#include "support/finite_difference.hpp"
#include "support/layer_problem.hpp"

namespace {

using gpipe::Rng;
using gpipe::test::LayerRun;
using gpipe::test::relative_error;

constexpr std::size_t T = 8;        // tokens per sample
constexpr std::size_t samples = 2;  // rows = samples T
constexpr std::size_t rows = samples * T;

using Norm = gpipe::RMSNorm<6>;
using Gate = gpipe::detail::SwiGLU<5>;
using Block = gpipe::LlamaBlock<16, 4, 2, 24>::with_tokens<T>;
using BlockMha = gpipe::LlamaBlock<16, 4, 4, 24>::with_tokens<T>;
using BlockMqa = gpipe::LlamaBlock<16, 4, 1, 24, 500000>::with_tokens<T>;
using CheckpointedBlock = gpipe::Checkpoint<gpipe::LlamaBlock<16, 4, 2, 24>>::with_shape<16, T>;

static_assert(gpipe::layer_for<Block, gpipe::host::Kernels<double>>);
static_assert(gpipe::layer_for<Block, gpipe::host::Kernels<gpipe::bf16>>);
static_assert(gpipe::has_layer_kernels<gpipe::RMSNormOp, gpipe::host::Kernels<float>>);
static_assert(gpipe::has_layer_kernels<gpipe::RopeOp, gpipe::host::Kernels<float>>);
static_assert(gpipe::has_layer_kernels<gpipe::SwiGLUOp, gpipe::host::Kernels<float>>);
// 2 x 16 x 16 (q, o) + 2 x 8 x 16 (k, v) + 3 x 24 x 16 (gate, up, down) + 2 x 16 (norms)
static_assert(Block::num_params == 512 + 256 + 1152 + 32);

// Two documents per sample, the second sample's first id equal to the first's last (runs end at
// sample borders) and an id that comes back after another (two runs of one id: two documents).
const std::vector<std::int32_t> documents{7, 7, 7, 9, 9, 9, 9, 9, 9, 9, 3, 3, 3, 9, 9, 9};

// L's problem on `rows` rows, parameters perturbed by up to 0.2.
template <class L>
struct Problem : gpipe::test::LayerProblem<L> {
  explicit Problem(std::uint64_t seed) : gpipe::test::LayerProblem<L>(rows, seed, 0.2f) {}
};

}  // namespace

TYPE_TO_STRING_AS("RMSNorm<6>", Norm);
TYPE_TO_STRING_AS("SwiGLU<5>", Gate);
TYPE_TO_STRING_AS("LlamaBlock<16, 4, 2, 24> at T = 8", Block);
TYPE_TO_STRING_AS("LlamaBlock<16, 4, 4, 24> at T = 8", BlockMha);
TYPE_TO_STRING_AS("LlamaBlock<16, 4, 1, 24, 500000> at T = 8", BlockMqa);
TYPE_TO_STRING_AS("Checkpoint<LlamaBlock<16, 4, 2, 24>> at T = 8", CheckpointedBlock);

#define GPIPE_LLAMA_LAYERS Norm, Gate, Block, BlockMha, BlockMqa

TEST_SUITE("llama layers") {
  TEST_CASE_TEMPLATE("a Llama layer's backward ops match central differences in double", L,
                     GPIPE_LLAMA_LAYERS) {
    for (std::uint64_t seed : {1u, 2u}) {
      CAPTURE(seed);
      gpipe::test::check_backward_against_differences(Problem<L>(seed));
    }
  }

  TEST_CASE_TEMPLATE("LlamaBlock's backward ops match central differences with documents", L, Block,
                     BlockMha, BlockMqa) {
    gpipe::test::check_backward_against_differences(Problem<L>(3), documents);
  }

  TEST_CASE_TEMPLATE("a Llama layer's float kernels agree with its double kernels", L,
                     GPIPE_LLAMA_LAYERS) {
    const Problem<L> p(31);
    auto f = p.template run<float>();
    auto d = p.template run<double>();
    f.document = d.document = documents;
    f.forward_backward();
    d.forward_backward();
    CHECK(relative_error(f.y, d.y) <= 1e-5);
    CHECK(relative_error(f.dx, d.dx) <= 1e-5);
    CHECK(relative_error(f.grads, d.grads) <= 1e-5);
  }

  TEST_CASE("the bf16 kernels are the float kernels on the rounded inputs, rounded once") {
    using gpipe::bf16;
    constexpr std::size_t n = 24, width = 2 * n, heads = 4, hd = 6;
    Rng rng(8);
    const auto values = gpipe::test::uniform_values(rng, rows * width, -2.0f, 2.0f);
    std::vector<bf16> xb(values.size());
    std::vector<float> xf(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      xb[i] = bf16(static_cast<float>(values[i]));
      xf[i] = xb[i];
    }
    const std::vector<bf16> dyb(xb.begin(), xb.begin() + rows * n);
    const std::vector<float> dyf(xf.begin(), xf.begin() + rows * n);
    std::vector<float> weight(n);
    for (std::size_t i = 0; i < n; ++i) weight[i] = 0.5f + static_cast<float>(i) / n;
    gpipe::host::Kernels<bf16> kb;
    gpipe::host::Kernels<float> kf;
    // within one bf16 rounding of the float result (and the float kernels' own float rounding)
    auto close = [](const std::vector<bf16>& got, const std::vector<float>& want) {
      const std::vector<double> g(got.begin(), got.end()), w(want.begin(), want.end());
      return relative_error(g, w) <= 1.0 / 256;
    };
    {  // RMSNorm on (rows, n): y, dx, and dweight (float either way)
      using B = gpipe::LayerKernels<gpipe::RMSNormOp, gpipe::host::Kernels<bf16>>;
      using F = gpipe::LayerKernels<gpipe::RMSNormOp, gpipe::host::Kernels<float>>;
      std::vector<bf16> yb(rows * n), dxb(rows * n), sb(2 * rows);
      std::vector<float> yf(rows * n), dxf(rows * n), sf(2 * rows), dwb(n), dwf(n);
      B::forward(kb, rows, n, 1e-5, xb.data(), weight.data(), yb.data(), sb.data());
      F::forward(kf, rows, n, 1e-5, xf.data(), weight.data(), yf.data(), sf.data());
      B::backward_input(kb, rows, n, xb.data(), dyb.data(), weight.data(), sb.data(), dxb.data());
      F::backward_input(kf, rows, n, xf.data(), dyf.data(), weight.data(), sf.data(), dxf.data());
      B::backward_weight(kb, rows, n, xb.data(), dyb.data(), sb.data(), dwb.data());
      F::backward_weight(kf, rows, n, xf.data(), dyf.data(), sf.data(), dwf.data());
      CHECK(close(yb, yf));
      CHECK(close(dxb, dxf));
      CHECK(relative_error(std::vector<double>(dwb.begin(), dwb.end()),
                           std::vector<double>(dwf.begin(), dwf.end())) <= 1e-6);
    }
    {  // SwiGLU on (rows, 2n)
      using B = gpipe::LayerKernels<gpipe::SwiGLUOp, gpipe::host::Kernels<bf16>>;
      using F = gpipe::LayerKernels<gpipe::SwiGLUOp, gpipe::host::Kernels<float>>;
      std::vector<bf16> yb(rows * n), dxb(rows * width);
      std::vector<float> yf(rows * n), dxf(rows * width);
      B::forward(kb, rows, n, xb.data(), yb.data());
      F::forward(kf, rows, n, xf.data(), yf.data());
      B::backward(kb, rows, n, xb.data(), dyb.data(), dxb.data());
      F::backward(kf, rows, n, xf.data(), dyf.data(), dxf.data());
      CHECK(close(yb, yf));
      CHECK(close(dxb, dxf));
    }
    {  // RoPE on the first 4 heads of 6 of rows of 48, with documents
      std::vector<bf16> rb = xb;
      std::vector<float> rf = xf;
      gpipe::LayerKernels<gpipe::RopeOp, gpipe::host::Kernels<bf16>>::rotate(
          kb, rows, T, heads, hd, width, 10000, documents.data(), rb.data(), false);
      gpipe::LayerKernels<gpipe::RopeOp, gpipe::host::Kernels<float>>::rotate(
          kf, rows, T, heads, hd, width, 10000, documents.data(), rf.data(), false);
      CHECK(close(rb, rf));
    }
  }

  TEST_CASE("RMSNorm is x / sqrt(mean(x^2) + 1e-5) * weight") {
    const Problem<Norm> p(4);
    auto run = p.run<double>();
    run.forward();
    for (std::size_t r = 0; r < rows; ++r) {
      long double sq = 0;
      for (std::size_t i = 0; i < 6; ++i) sq += p.x[r * 6 + i] * p.x[r * 6 + i];
      const long double rstd = 1 / std::sqrt(sq / 6 + 1e-5L);
      for (std::size_t i = 0; i < 6; ++i)
        CHECK(run.y[r * 6 + i] ==
              doctest::Approx(static_cast<double>(p.x[r * 6 + i] * rstd * p.params[i]))
                  .epsilon(1e-14));
    }
    std::vector<float> init(6);
    Rng rng(1);
    Norm::init(init, rng);
    CHECK(init == std::vector<float>(6, 1.0f));
  }

  TEST_CASE("RoPE rotates as Hugging Face's q cos + rotate_half(q) sin at the token's position") {
    // 2 samples of T tokens, 3 heads of 6, in rows of 20 (the last 2 columns untouched)
    constexpr std::size_t heads = 3, hd = 6, ld = 20;
    const double base = 10000;
    Rng rng(12);
    const std::vector<double> x = gpipe::test::uniform_values(rng, rows * ld, -1.0f, 1.0f);
    for (const bool with_documents : {false, true}) {
      CAPTURE(with_documents);
      std::vector<double> y = x;
      gpipe::host::Kernels<double> k;
      gpipe::LayerKernels<gpipe::RopeOp, gpipe::host::Kernels<double>>::rotate(
          k, rows, T, heads, hd, ld, base, with_documents ? documents.data() : nullptr, y.data(),
          false);
      for (std::size_t r = 0; r < rows; ++r) {
        std::size_t position = r % T;
        if (with_documents) {  // the distance from the start of its run in its sample
          position = 0;
          for (std::size_t t = r; t % T != 0 && documents[t - 1] == documents[r]; --t) ++position;
        }
        for (std::size_t h = 0; h < heads; ++h)
          for (std::size_t i = 0; i < hd; ++i) {
            const std::size_t f = i % (hd / 2);  // HF: emb = cat(freqs, freqs)
            const long double angle =
                position * std::pow(static_cast<long double>(base), -2.0L * f / hd);
            const double* q = x.data() + r * ld + h * hd;
            const long double half = i < hd / 2 ? -q[i + hd / 2] : q[i - hd / 2];  // rotate_half
            CHECK(y[r * ld + h * hd + i] ==
                  doctest::Approx(
                      static_cast<double>(q[i] * std::cos(angle) + half * std::sin(angle)))
                      .epsilon(1e-13));
          }
        for (std::size_t i = heads * hd; i < ld; ++i) CHECK(y[r * ld + i] == x[r * ld + i]);
      }
    }
  }

  TEST_CASE("SwiGLU is silu(gate) * up") {
    const Problem<Gate> p(5);
    auto run = p.run<double>();
    run.forward();
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < 5; ++i) {
        const double g = p.x[r * 10 + i], u = p.x[r * 10 + 5 + i];
        CHECK(run.y[r * 5 + i] == doctest::Approx(g / (1 + std::exp(-g)) * u).epsilon(1e-14));
      }
  }

  TEST_CASE("a document's tokens in LlamaBlock give what they give as a sample of their own") {
    // Sample 0 packs documents 7 (tokens 0..2) and 9 (tokens 3..7); sample 1 of the second run
    // starts with token 3..7 of sample 0 and then other tokens. Document 9's rows must equal
    // sample 1's first rows: attention stays inside a run and RoPE restarts at its start.
    const Problem<Block> p(6);
    auto packed = p.run<double>();
    packed.document = {7, 7, 7, 9, 9, 9, 9, 9, 4, 4, 4, 4, 4, 4, 4, 4};
    auto alone = p.run<double>();
    const std::size_t D = 16;
    for (std::size_t t = 0; t < 5; ++t)
      for (std::size_t i = 0; i < D; ++i) alone.x[(T + t) * D + i] = p.x[(3 + t) * D + i];
    packed.forward();
    alone.forward();
    for (std::size_t t = 0; t < 5; ++t)
      for (std::size_t i = 0; i < D; ++i) {
        CAPTURE(t);
        CHECK(packed.y[(3 + t) * D + i] ==
              doctest::Approx(alone.y[(T + t) * D + i]).epsilon(1e-12));
      }
    // and without document ids the second document's rows do see the first's
    auto whole = p.run<double>();
    whole.forward();
    CHECK(std::abs(whole.y[3 * D] - packed.y[3 * D]) > 1e-6);
    // one run per sample is the same as no document ids
    auto one_run = p.run<double>();
    one_run.document = {1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2};
    one_run.forward();
    CHECK(one_run.y == whole.y);
  }

  TEST_CASE("a checkpointed LlamaBlock hands the document ids on: the block's step, bit for bit") {
    const Problem<Block> p(7);
    auto plain = p.run<double>();
    LayerRun<CheckpointedBlock, double> checkpointed(rows);
    checkpointed.x = p.x;
    checkpointed.params = p.params;
    checkpointed.dy = p.c;
    plain.document = checkpointed.document = documents;
    plain.forward_backward();
    checkpointed.forward_backward();
    CHECK(checkpointed.y == plain.y);
    CHECK(checkpointed.dx == plain.dx);
    CHECK(checkpointed.grads == plain.grads);
  }

  TEST_CASE("LlamaBlock names and shapes its parameters as Hugging Face's LlamaDecoderLayer") {
    const auto specs = Block::param_specs();
    const std::vector<std::string_view> names{
        "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
    const std::vector<std::array<std::size_t, 2>> shapes{
        {16, 0}, {16, 16}, {8, 16}, {8, 16}, {16, 16}, {16, 0}, {24, 16}, {24, 16}, {16, 24}};
    REQUIRE(specs.size() == names.size());
    std::size_t offset = 0;
    for (std::size_t k = 0; k < specs.size(); ++k) {
      CAPTURE(names[k]);
      CHECK(specs[k].name == names[k]);
      CHECK(specs[k].shape == shapes[k]);
      CHECK(specs[k].depth == 0);
      CHECK(specs[k].offset == offset);  // the tensors tile the block's parameters in this order
      offset += specs[k].size();
    }
    CHECK(offset == Block::num_params);
  }

  TEST_CASE("LlamaBlock starts as PyTorch's modules: norms at 1, Linear in +-1/sqrt(in)") {
    std::vector<float> p(Block::num_params);
    Rng rng(3);
    Block::init(p, rng);
    for (const gpipe::ParamSpec& s : Block::param_specs()) {
      CAPTURE(s.name);
      const double bound = s.rank == 1 ? 1.0 : 1.0 / std::sqrt(static_cast<double>(s.shape[1]));
      double largest = 0;
      for (std::size_t k = s.offset; k < s.offset + s.size(); ++k) {
        if (s.rank == 1) CHECK(p[k] == 1.0f);
        largest = std::max(largest, std::abs(static_cast<double>(p[k])));
      }
      CHECK(largest <= bound);
      CHECK(largest > 0.8 * bound);
    }
  }
}

TEST_SUITE("llama layers") {
  using Emb = gpipe::TokenEmbedding<5, T, 4>;

  TEST_CASE("TokenEmbedding gathers the id's row of its table, and W adds dy there") {
    LayerRun<Emb, double> run(rows);
    Rng rng(9);
    run.params = gpipe::test::uniform_values(rng, Emb::num_params, -1.0f, 1.0f);
    run.x = {4, 0, 4, 2, 2, 1, 0, 0, 3, 3, 4, 4, 4, 1, 2, 0};
    const std::vector<double> params = run.params, ids = run.x;
    run.forward();
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < 4; ++i)
        CHECK(run.y[r * 4 + i] == run.params[static_cast<std::size_t>(run.x[r]) * 4 + i]);
    const std::vector<double> c = gpipe::test::uniform_values(rng, rows * 4, -1.0f, 1.0f);
    const auto check = gpipe::test::check_gradients<Emb>(ids, params, c, rows, 1e-6);
    CHECK(check.params_error <= 1e-9);
    CHECK(check.max_grad > 1e-1);
    CHECK(check.dx_error == 0);
    CHECK(Emb::param_specs()[0].name == "weight");
    CHECK(Emb::num_params == 5 * 4);
  }
}

TEST_SUITE("llama layers") {
  // Of LlamaBlock<D, H, KVH, F>'s stash, Remat::selective drops both RMSNorms' outputs and rstd
  // and SwiGLU's output, 2 D + F + 4 per row; it keeps qkv, o, the log-sum-exps, gate and up.
  static_assert(Block::cheap_stash_per_row == 2 * 16 + 24 + 4);

  TEST_CASE("LlamaBlock's recompute rebuilds its cheap stash bit for bit, with documents") {
    const Problem<Block> p(89);
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
