// The host layers on bf16 activations (host::Kernels<bf16>) against the same layers in double
// (host::Kernels<double>) on the same values: inputs that are bf16 values, float weights. Each
// element's error is checked against a bound derived from what the bf16 path does:
//
//   u = 2^-8 (bf16 rounding to nearest), e = 2^-24 (float's).
//   A GEMM rounds its float weights once (relative u), multiplies bf16 values exactly in float
//   and accumulates K products in float: |error| <= (u + (K + 1) e) S before its result is
//   rounded, S the sum of the products' magnitudes (computed in double). A result stored as bf16
//   adds u |y|; one accumulated into float gradients adds nothing more (dW = dy^T x: both
//   operands bf16 values, so only the accumulation's (K + 1) e S, which shows the sums are float).
//   Elementwise ops compute in float and round once: u |y| plus the float kernel's own error.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpipe/gpipe.hpp"

namespace {

using namespace gpipe;
constexpr double u = 1.0 / 256, e = 1.0 / (1 << 24);

// n bf16 values in [-scale, scale), and the same values as floats and doubles.
struct Values {
  std::vector<bf16> b;
  std::vector<float> f;
  std::vector<double> d;
};
Values values(std::size_t n, std::uint64_t seed, float scale = 1) {
  Rng rng(seed);
  Values v;
  for (std::size_t i = 0; i < n; ++i) {
    const bf16 x(rng.uniform(-scale, scale));
    v.b.push_back(x);
    v.f.push_back(float(x));
    v.d.push_back(float(x));
  }
  return v;
}
std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

}  // namespace

TEST_CASE("bf16 Linear: forward, input and weight gradients within the GEMM bound") {
  constexpr std::size_t rows = 33, in = 96, out = 40;
  using L = Linear<in, out>;
  std::vector<float> params(L::num_params);
  Rng rng(1);
  L::init(params, rng);
  const std::vector<double> params_d = widen(params);
  const Values x = values(rows * in, 2), dy = values(rows * out, 3);
  host::Kernels<bf16> k;
  host::Kernels<double> r;

  // |x| |W|^T and |dy| |W|, the magnitudes the bound scales with
  std::vector<double> absx(x.d), absw(params_d.begin(), params_d.begin() + out * in), absdy(dy.d);
  for (double& v : absx) v = std::abs(v);
  for (double& v : absw) v = std::abs(v);
  for (double& v : absdy) v = std::abs(v);

  std::vector<bf16> y(rows * out);
  L::forward(k, {rows, x.b.data(), y.data(), params.data(), nullptr});
  std::vector<double> y_ref(rows * out), s(rows * out);
  L::forward(r, {rows, x.d.data(), y_ref.data(), params_d.data(), nullptr});
  r.gemm(false, true, rows, out, in, 1.0, absx.data(), absw.data(), 0.0, s.data());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double bias = std::abs(params_d[out * in + i % out]);
    CHECK(std::abs(float(y[i]) - y_ref[i]) <=
          u * std::abs(y_ref[i]) + (1 + u) * ((u + (in + 1) * e) * s[i] + e * bias));
  }

  std::vector<bf16> dx(rows * in);
  L::backward_input(k, {rows, x.b.data(), dy.b.data(), dx.data(), params.data(), nullptr, nullptr});
  std::vector<double> dx_ref(rows * in), sx(rows * in);
  L::backward_input(
      r, {rows, x.d.data(), dy.d.data(), dx_ref.data(), params_d.data(), nullptr, nullptr});
  r.gemm(false, false, rows, in, out, 1.0, absdy.data(), absw.data(), 0.0, sx.data());
  for (std::size_t i = 0; i < dx.size(); ++i)
    CHECK(std::abs(float(dx[i]) - dx_ref[i]) <=
          u * std::abs(dx_ref[i]) + (1 + u) * (u + (out + 1) * e) * sx[i]);

  std::vector<float> grads(L::num_params, 0.5f);
  std::vector<double> grads_ref(L::num_params, 0.5), sw(out * in);
  L::backward_weight(
      k, {rows, x.b.data(), dy.b.data(), params.data(), nullptr, nullptr, grads.data()});
  L::backward_weight(
      r, {rows, x.d.data(), dy.d.data(), params_d.data(), nullptr, nullptr, grads_ref.data()});
  r.gemm(true, false, out, in, rows, 1.0, absdy.data(), absx.data(), 0.0, sw.data());
  for (std::size_t i = 0; i < out * in; ++i)
    CHECK(std::abs(grads[i] - grads_ref[i]) <= (rows + 2) * e * (sw[i] + 0.5));
  for (std::size_t j = 0; j < out; ++j) {  // the bias: column sums of dy, in float
    double sum_abs = 0.5;
    for (std::size_t r_ = 0; r_ < rows; ++r_) sum_abs += absdy[r_ * out + j];
    CHECK(std::abs(grads[out * in + j] - grads_ref[out * in + j]) <= (rows + 2) * e * sum_abs);
  }
}

TEST_CASE("bf16 elementwise layers, LayerNorm and Embedding: rounded once from float") {
  constexpr std::size_t rows = 8, n = 256;
  const Values x = values(rows * n, 4, 3.0f), dy = values(rows * n, 5);
  host::Kernels<bf16> k;
  host::Kernels<double> r;

  auto check_elementwise = [&](auto layer, double kernel_error) {
    using L = decltype(layer);
    using LN = typename L::template with_features<n>;
    std::vector<bf16> y(rows * n), dx(rows * n);
    std::vector<double> y_ref(rows * n), dx_ref(rows * n);
    LN::forward(k, {rows, x.b.data(), y.data(), nullptr, nullptr});
    LN::forward(r, {rows, x.d.data(), y_ref.data(), nullptr, nullptr});
    LN::backward_input(k, {rows, x.b.data(), dy.b.data(), dx.data(), nullptr, nullptr, nullptr});
    LN::backward_input(r,
                       {rows, x.d.data(), dy.d.data(), dx_ref.data(), nullptr, nullptr, nullptr});
    for (std::size_t i = 0; i < y.size(); ++i) {
      CHECK(std::abs(float(y[i]) - y_ref[i]) <=
            u * std::abs(y_ref[i]) + kernel_error * (1 + std::abs(x.d[i])));
      CHECK(std::abs(float(dx[i]) - dx_ref[i]) <=
            u * std::abs(dx_ref[i]) + kernel_error * (1 + std::abs(x.d[i])) * std::abs(dy.d[i]));
    }
  };
  // the float kernels' own errors: exact for ReLU; GELU's erf and exp, tanh's 2e-7 absolute
  // (kernels/simd.hpp) times x and the derivative's terms, a few e
  check_elementwise(ReLU{}, 0);
  check_elementwise(GELU{}, 8 * e);
  check_elementwise(GELUTanh{}, 2e-7 * 4 + 8 * e);

  // LayerNorm forward: y = xhat gamma + beta in float from double statistics (xhat rounded to
  // float, one product, one sum: 3 e), then rounded
  using LN = LayerNorm<n>;
  std::vector<float> params(LN::num_params);
  Rng rng(6);
  for (float& p : params) p = rng.uniform(-1.5f, 1.5f);
  const std::vector<double> params_d = widen(params);
  std::vector<bf16> y(rows * n), stash(rows * 2);
  std::vector<double> y_ref(rows * n), stash_ref(rows * 2);
  LN::forward(k, {rows, x.b.data(), y.data(), params.data(), stash.data()});
  LN::forward(r, {rows, x.d.data(), y_ref.data(), params_d.data(), stash_ref.data()});
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double xhat = (x.d[i] - stash_ref[2 * (i / n)]) * stash_ref[2 * (i / n) + 1];
    CHECK(std::abs(float(y[i]) - y_ref[i]) <=
          u * std::abs(y_ref[i]) +
              3 * e * (std::abs(xhat * params_d[i % n]) + std::abs(params_d[n + i % n])));
  }
  // its input gradient from the bf16 stash (float rstd, the mean recomputed), computed in
  // double and rounded once (float statistics: a few e relative to the terms' magnitudes)
  std::vector<bf16> dx(rows * n);
  std::vector<double> dx_ref(rows * n);
  LN::backward_input(
      k, {rows, x.b.data(), dy.b.data(), dx.data(), params.data(), stash.data(), nullptr});
  LN::backward_input(r, {rows, x.d.data(), dy.d.data(), dx_ref.data(), params_d.data(),
                         stash_ref.data(), nullptr});
  // The float statistics perturb mean and rstd by e relatively: xhat by e (|xhat| + rstd |mean|),
  // so each of dx's terms rstd (g - mean(g) - xhat mean(g xhat)) by a few e of its magnitude.
  for (std::size_t row = 0; row < rows; ++row) {
    const double mean = stash_ref[2 * row], rstd = stash_ref[2 * row + 1];
    double mean_g = 0, mean_gx = 0;
    for (std::size_t c = 0; c < n; ++c) {
      const double g = std::abs(dy.d[row * n + c] * params_d[c]);
      const double xhat = std::abs((x.d[row * n + c] - mean) * rstd) + rstd * std::abs(mean);
      mean_g += g / n;
      mean_gx += g * xhat / n;
    }
    for (std::size_t c = 0; c < n; ++c) {
      const std::size_t i = row * n + c;
      const double xhat = std::abs((x.d[i] - mean) * rstd) + rstd * std::abs(mean);
      const double terms = rstd * (std::abs(dy.d[i] * params_d[c]) + mean_g + xhat * mean_gx);
      CHECK(std::abs(float(dx[i]) - dx_ref[i]) <= u * std::abs(dx_ref[i]) + 8 * e * terms);
    }
  }

  // Embedding: wte[id] + wpe[t] in float, rounded once; ids in the bf16's bits, above 256
  using E = Embedding<1000, 4, n>;
  std::vector<float> table(E::num_params);
  E::init(table, rng);
  const std::vector<double> table_d = widen(table);
  std::vector<bf16> ids;
  std::vector<double> ids_d;
  for (std::size_t i = 0; i < rows; ++i) {
    const auto id = static_cast<std::uint16_t>(997 - 123 * i);
    ids.push_back(bf16::from_bits(id));
    ids_d.push_back(id);
  }
  std::vector<bf16> ey(rows * n);
  std::vector<double> ey_ref(rows * n);
  E::forward(k, {rows, ids.data(), ey.data(), table.data(), nullptr});
  E::forward(r, {rows, ids_d.data(), ey_ref.data(), table_d.data(), nullptr});
  for (std::size_t i = 0; i < ey.size(); ++i)
    CHECK(std::abs(float(ey[i]) - ey_ref[i]) <= (u + e) * std::abs(ey_ref[i]));
}

TEST_CASE("bf16 attention core: o rounded once from float, log-sum-exp and backward in float") {
  constexpr std::size_t D = 32, H = 2, T = 80, samples = 3, rows = samples * T, d = D / H;
  using Core = detail::CausalAttentionCore<D, H, T>;
  static_assert(Core::stash_per_row == 2 * H && Core::workspace_per_row == 2 * H);
  const Values qkv = values(rows * 3 * D, 7, 2.0f), dout = values(rows * D, 8);
  host::Kernels<bf16> k;
  host::Kernels<double> r;
  std::vector<bf16> stash(rows * Core::stash_per_row), o(rows * D);
  std::vector<double> stash_ref(rows * Core::stash_per_row), o_ref(rows * D);
  Core::forward(k, {rows, qkv.b.data(), o.data(), nullptr, stash.data(), nullptr});
  Core::forward(r, {rows, qkv.d.data(), o_ref.data(), nullptr, stash_ref.data(), nullptr});
  // Scores are d-term float dot products of |q|, |k| < 2, scaled by 1 / sqrt d: magnitudes up to
  // S = 4 sqrt d, each off by at most (d + 1) e S; the float softmax's exp adds 2e-7 relative.
  // The log-sum-exp (float, first H floats of the stash row) is off by about as much as a score.
  const double s = 4 * std::sqrt(double(d)), score = (d + 16) * e * s;
  std::vector<float> lse(rows * H);
  std::memcpy(lse.data(), stash.data(), lse.size() * sizeof(float));
  for (std::size_t i = 0; i < lse.size(); ++i)
    CHECK(std::abs(lse[i] - stash_ref[i]) <= score + e * std::abs(stash_ref[i]));
  // o = P v over tiles in float (P off by score relative, |v| < 2, T terms), rounded once
  for (std::size_t i = 0; i < o.size(); ++i)
    CHECK(std::abs(float(o[i]) - o_ref[i]) <= u * std::abs(o_ref[i]) + (score + T * e) * 2);

  // backward: from the bf16 o (rounded: u |o| in rowsum(do .* o)); dqkv rounded once. First
  // order: u times the magnitudes of the terms.
  std::vector<bf16> dqkv(rows * 3 * D), workspace(rows * Core::workspace_per_row);
  std::vector<double> dqkv_ref(rows * 3 * D), workspace_ref(rows * Core::workspace_per_row);
  Core::backward_input(k, {rows, qkv.b.data(), dout.b.data(), dqkv.data(), nullptr, stash.data(),
                           nullptr, workspace.data(), nullptr, o.data()});
  Core::backward_input(r, {rows, qkv.d.data(), dout.d.data(), dqkv_ref.data(), nullptr,
                           stash_ref.data(), nullptr, workspace_ref.data(), nullptr, o_ref.data()});
  double scale = 0;
  for (double v : dqkv_ref) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < dqkv.size(); ++i)
    CHECK(std::abs(float(dqkv[i]) - dqkv_ref[i]) <= u * std::abs(dqkv_ref[i]) + 4 * u * scale);

  // The stash holds floats: at an odd bf16 offset it cannot, and the core says so; its backward
  // needs o, which a Chain passes and nobody else may forget.
  CHECK_THROWS_AS(
      Core::forward(k, {rows, qkv.b.data(), o.data(), nullptr, stash.data() + 1, nullptr}), Error);
  CHECK_THROWS_AS(Core::backward_input(k, {rows, qkv.b.data(), dout.b.data(), dqkv.data(), nullptr,
                                           stash.data(), nullptr, workspace.data()}),
                  Error);
}
