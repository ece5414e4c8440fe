// The host's flash attention kernels (LayerKernels<CausalAttentionOp, host::Kernels<T>>, the
// blocked algorithm of backend/host/kernels/attention.hpp) against the attention's definition
// evaluated whole in double (tests/support/attention_reference.hpp): GPT-2's packing, grouped-query
// heads with q, k and v anywhere in a row, document ids, and T across several tiles, in double,
// float and bf16; the columns of dqkv outside the heads untouched; shapes the geometry refuses.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels_bf16.hpp"
#include "gpipe/backend/host/layers/attention.hpp"
#include "support/attention_reference.hpp"
#include "support/relative_error.hpp"

namespace {

using gpipe::AttentionGeometry;
using gpipe::test::AttentionProblem;
using gpipe::test::AttentionResult;
using gpipe::test::relative_error;

// Outside the heads, dqkv keeps what it held.
constexpr double untouched = 7.0;

// The cases: (geometry, documents).
struct Case {
  const char* name;
  AttentionGeometry g;
  bool documents;
};
const Case cases[] = {
    {"GPT-2 packing, T within one tile", AttentionGeometry::packed(2, 9, 3, 4), false},
    {"GPT-2 packing, T over three query tiles", AttentionGeometry::packed(2, 150, 2, 8), false},
    {"GPT-2 packing with documents", AttentionGeometry::packed(3, 130, 2, 8), true},
    {"GPT-2 packing, T over three key tiles", AttentionGeometry::packed(1, 300, 2, 4), false},
    // 4 query heads on 2 key/value heads: k at column 1, v at 13, q at 25, 3 spare columns
    {"grouped-query heads, q, k, v anywhere", {2, 70, 4, 2, 6, 52, 25, 1, 13}, false},
    {"grouped-query heads with documents", {2, 130, 6, 2, 5, 10 * 5, 0, 6 * 5, 8 * 5}, true},
    {"one key/value head for all", {1, 100, 4, 1, 8, 6 * 8, 0, 4 * 8, 5 * 8}, true},
};

// Runs T's kernels on the problem (inputs converted to T); the results widened to double.
template <class T, class Ctx>
AttentionResult run(Ctx& ctx, const AttentionProblem& p) {
  using M = gpipe::master_t<T>;
  using K = gpipe::LayerKernels<gpipe::CausalAttentionOp, Ctx>;
  const AttentionGeometry& g = p.g;
  const std::size_t hd = g.heads * g.head_size;
  std::vector<T> qkv, dout, o(g.rows() * hd, T(std::nanf(""))), dqkv(g.rows() * g.ld, T(untouched));
  for (double v : p.qkv) qkv.push_back(T(v));
  for (double v : p.dout) dout.push_back(T(v));
  std::vector<M> lse(g.rows() * g.heads, M(std::nanf(""))), delta(lse);
  K::forward(ctx, g, qkv.data(), o.data(), lse.data(), p.documents());
  K::backward(ctx, g, qkv.data(), o.data(), lse.data(), dout.data(), dqkv.data(), delta.data(),
              p.documents());
  AttentionResult r;
  for (T v : o) r.o.push_back(double(v));
  for (M v : lse) r.lse.push_back(double(v));
  for (T v : dqkv) r.dqkv.push_back(double(v));
  return r;
}

// The reference's dqkv with `untouched` outside the heads.
std::vector<double> expected_dqkv(const AttentionProblem& p, const AttentionResult& ref) {
  const AttentionGeometry& g = p.g;
  std::vector<double> out(ref.dqkv.size(), untouched);
  const std::size_t d = g.head_size;
  for (std::size_t r = 0; r < g.rows(); ++r)
    for (const auto [first, width] : {std::array<std::size_t, 2>{g.q, g.heads * d},
                                      std::array<std::size_t, 2>{g.k, g.kv_heads * d},
                                      std::array<std::size_t, 2>{g.v, g.kv_heads * d}})
      for (std::size_t c = first; c < first + width; ++c)
        out[r * g.ld + c] = ref.dqkv[r * g.ld + c];
  return out;
}

}  // namespace

TEST_SUITE("host flash attention") {
  TEST_CASE("in double it is the definition, to rounding") {
    gpipe::host::Kernels<double> k;
    for (const Case& c : cases) {
      CAPTURE(c.name);
      const AttentionProblem p(c.g, 1, c.documents);
      const AttentionResult ref = p.reference(), got = run<double>(k, p);
      CHECK(relative_error(got.o, ref.o) < 1e-13);
      CHECK(relative_error(got.lse, ref.lse) < 1e-13);
      CHECK(relative_error(got.dqkv, expected_dqkv(p, ref)) < 1e-12);
    }
  }

  TEST_CASE("in float it is the definition within float's error") {
    gpipe::host::Kernels<float> k;
    for (const Case& c : cases) {
      CAPTURE(c.name);
      const AttentionProblem p(c.g, 2, c.documents);
      const AttentionResult ref = p.reference(), got = run<float>(k, p);
      CHECK(relative_error(got.o, ref.o) < 1e-5);
      CHECK(relative_error(got.lse, ref.lse) < 1e-5);
      CHECK(relative_error(got.dqkv, expected_dqkv(p, ref)) < 1e-5);
    }
  }

  TEST_CASE("in bf16 it is the definition on the bf16 values, rounded once") {
    // Inputs that are bf16 values; o and dqkv are rounded once (relative 2^-8), the backward
    // reads the rounded o (its rowsum(do .* o) off by 2^-8 relative): a few 2^-8 normwise.
    gpipe::host::Kernels<gpipe::bf16> k;
    for (const Case& c : cases) {
      CAPTURE(c.name);
      AttentionProblem p(c.g, 3, c.documents);
      for (double& v : p.qkv) v = float(gpipe::bf16(v));
      for (double& v : p.dout) v = float(gpipe::bf16(v));
      const AttentionResult ref = p.reference(), got = run<gpipe::bf16>(k, p);
      CHECK(relative_error(got.o, ref.o) < 1.5 / 256);
      CHECK(relative_error(got.lse, ref.lse) < 1e-5);
      CHECK(relative_error(got.dqkv, expected_dqkv(p, ref)) < 3.0 / 256);
    }
  }

  TEST_CASE("a query attends to itself and its run's earlier tokens, not to another run's") {
    // One sample, ids 5 5 7 7 5: token 4 starts a second document of id 5.
    const AttentionGeometry g = AttentionGeometry::packed(1, 5, 1, 2);
    AttentionProblem p(g, 4);
    p.document = {5, 5, 7, 7, 5};
    gpipe::host::Kernels<double> k;
    const AttentionResult got = run<double>(k, p);
    // token 4 alone: o = v_4, lse = its own score
    for (std::size_t i = 0; i < 2; ++i)
      CHECK(got.o[4 * 2 + i] == doctest::Approx(p.qkv[4 * 6 + 4 + i]));
    // token 2 starts the run of 7: o = v_2
    for (std::size_t i = 0; i < 2; ++i)
      CHECK(got.o[2 * 2 + i] == doctest::Approx(p.qkv[2 * 6 + 4 + i]));
    CHECK(relative_error(got.o, p.reference().o) < 1e-13);
  }

  TEST_CASE("a geometry whose heads do not fit or do not group is a gpipe::Error") {
    using G = AttentionGeometry;
    CHECK_NOTHROW(G::packed(1, 4, 2, 3).check());
    CHECK_THROWS_AS((G{1, 4, 3, 2, 4, 28, 0, 12, 20}.check()), gpipe::Error);  // 3 % 2
    CHECK_THROWS_AS((G{1, 4, 2, 2, 4, 23, 0, 8, 16}.check()), gpipe::Error);   // v past 23
    CHECK_THROWS_AS((G{1, 4, 2, 0, 4, 24, 0, 8, 16}.check()), gpipe::Error);
    gpipe::host::Kernels<float> k;
    std::vector<float> x(4 * 28), o(4 * 12), lse(4 * 3);
    CHECK_THROWS_AS(
        (gpipe::LayerKernels<gpipe::CausalAttentionOp, gpipe::host::Kernels<float>>::forward(
            k, G{1, 4, 3, 2, 4, 28, 0, 12, 20}, x.data(), o.data(), lse.data())),
        gpipe::Error);
  }
}
