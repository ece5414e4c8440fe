#pragma once
// Test your own layer as gpipe tests its own: its backward_input and backward_weight against
// central finite differences in double precision, on the host backend's kernels.
//
//   #include <gpipe/testing/gradient_check.hpp>
//   const auto check = gpipe::testing::check_layer<MyLayer>();   // 3 rows, random inputs
//   assert(check.dx_error < 1e-6 && check.params_error < 1e-6);
//
// The layer runs on gpipe::host::KernelContext<double> (its ops must be templates on the context,
// as the layer concept asks) through LayerRun<L, T>, which owns every buffer the layer asks for.
// Buffers the layer must write before anything reads them (y, stash, dx, grad_stash, workspace)
// are NaN before each op, so a layer that reads a value it never wrote, or that accumulates into
// dx, shows up as NaN (and NaN fails every comparison). The checked scalar is
//   f(x, params) = sum_i c_i y_i            so  df/dy = c,
// and its central differences (f(v + eps e_k) - f(v - eps e_k)) / (2 eps) are compared with
// backward_input's dx and backward_weight's grads (W runs twice from zero grads and must
// accumulate: half the sum is compared, so a W that overwrites is off by a factor 2).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "gpipe/backend/host.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/testing/relative_error.hpp"

namespace gpipe::testing {

/// A quiet NaN of T: what LayerRun fills write-only buffers with before each op.
template <class T>
inline constexpr T nan_v = std::numeric_limits<T>::quiet_NaN();

/// One forward / backward_input / backward_weight of layer L over `rows` rows on KernelContext<T>.
/// Set x, params (and dy before backward_input); grads start at zero and accumulate.
template <layer L, class T>
struct LayerRun {
  /// Every buffer sized for `rows_` rows; all start at zero (grads included).
  explicit LayerRun(std::size_t rows_)
      : rows(rows_),
        x(rows * L::in_features),
        params(L::num_params),
        y(rows * L::out_features),
        stash(rows * L::stash_per_row),
        dy(rows * L::out_features),
        dx(rows * L::in_features),
        grad_stash(rows * L::grad_stash_per_row),
        grads(L::num_params),
        workspace(rows * workspace_per_row_v<L>) {}

  std::size_t rows;              ///< rows of every op, fixed at construction
  host::KernelContext<T> ctx{};  ///< the kernel context the layer's ops run with
  std::vector<T> x;              ///< (rows, in_features)
  std::vector<T> params;         ///< (num_params)
  std::vector<T> y;              ///< (rows, out_features)
  std::vector<T> stash;          ///< (rows, stash_per_row)
  std::vector<T> dy;             ///< (rows, out_features)
  std::vector<T> dx;             ///< (rows, in_features)
  std::vector<T> grad_stash;     ///< (rows, grad_stash_per_row)
  std::vector<T> grads;          ///< (num_params), accumulated from zero
  std::vector<T> workspace;      ///< (rows, workspace_per_row), NaN before every op: scratch only
  /// (rows) each row's document id (packed documents, the Args' `document`), or empty: every op
  /// then gets nullptr, one document per sample.
  std::vector<std::int32_t> document;

  /// The Args' `document`: document's ids, or nullptr when it is empty.
  const std::int32_t* document_ids() const { return document.empty() ? nullptr : document.data(); }

  /// y, stash <- L::forward(x, params); y, stash and workspace are NaN before it.
  void forward() {
    std::ranges::fill(y, nan_v<T>);
    std::ranges::fill(stash, nan_v<T>);
    std::ranges::fill(workspace, nan_v<T>);
    L::forward(ctx, ForwardArgs<T>{rows, x.data(), y.data(), params.data(), stash.data(),
                                   workspace.data(), nullptr, document_ids()});
  }
  /// dx, grad_stash <- L::backward_input(x, dy, params, stash), with the forward's y kept
  /// (BackwardInputArgs::y); dx, grad_stash and workspace are NaN before it, so a layer that
  /// accumulates into dx yields NaN.
  void backward_input() {
    std::ranges::fill(dx, nan_v<T>);
    std::ranges::fill(grad_stash, nan_v<T>);
    std::ranges::fill(workspace, nan_v<T>);
    L::backward_input(ctx, BackwardInputArgs<T>{rows, x.data(), dy.data(), dx.data(), params.data(),
                                                stash.data(), grad_stash.data(), workspace.data(),
                                                params.data(), y.data(), document_ids()});
  }
  /// backward_input with dx == nullptr, as the first stage runs it (L::skips_input_gradient).
  void backward_input_without_dx() {
    std::ranges::fill(grad_stash, nan_v<T>);
    std::ranges::fill(workspace, nan_v<T>);
    L::backward_input(ctx, BackwardInputArgs<T>{rows, x.data(), dy.data(), nullptr, params.data(),
                                                stash.data(), grad_stash.data(), workspace.data(),
                                                params.data(), y.data(), document_ids()});
  }
  /// grads += L::backward_weight(x, dy, params, stash, grad_stash); workspace is NaN before it.
  void backward_weight() {
    std::ranges::fill(workspace, nan_v<T>);
    L::backward_weight(ctx, BackwardWeightArgs<T>{rows, x.data(), dy.data(), params.data(),
                                                  stash.data(), grad_stash.data(), grads.data(),
                                                  workspace.data(), document_ids()});
  }
  /// The cheap part of the stash (its last cheap_stash_per_row_v<L> elements per row, where
  /// LayerRun's one stash buffer keeps it) NaN, then L::recompute(x, params, the rest of the
  /// stash) writes it again (Remat::selective); nothing for a layer without a cheap part. After a
  /// forward, the stash is then as forward left it.
  void recompute() {
    constexpr std::size_t cheap = cheap_stash_per_row_v<L>;
    if constexpr (cheap > 0) {
      std::fill(stash.end() - static_cast<std::ptrdiff_t>(rows * cheap), stash.end(), nan_v<T>);
      std::ranges::fill(workspace, nan_v<T>);
      L::recompute(ctx, ForwardArgs<T>{rows, x.data(), nullptr, params.data(), stash.data(),
                                       workspace.data(), nullptr, document_ids()});
    }
  }
  /// forward, then both backward ops with the dy set.
  void forward_backward() {
    forward();
    backward_input();
    backward_weight();
  }
};

/// f(x, params) = sum_i c_i L(x; params)_i, in double, accumulated in long double; document:
/// the rows' document ids, or empty (LayerRun::document).
template <layer L>
double weighted_output(std::span<const double> x, std::span<const double> params,
                       std::span<const double> c, std::size_t rows,
                       std::span<const std::int32_t> document = {}) {
  LayerRun<L, double> run(rows);
  run.document.assign(document.begin(), document.end());
  std::ranges::copy(x, run.x.begin());
  std::ranges::copy(params, run.params.begin());
  run.forward();
  long double sum = 0;
  for (std::size_t i = 0; i < run.y.size(); ++i) sum += static_cast<long double>(c[i]) * run.y[i];
  return static_cast<double>(sum);
}

/// d f / d v_k ~ (f(v + eps e_k) - f(v - eps e_k)) / (2 eps) for every k; f takes the whole v.
template <class F>
std::vector<double> central_difference(F&& f, std::vector<double> v, double eps) {
  std::vector<double> g(v.size());
  for (std::size_t k = 0; k < v.size(); ++k) {
    const double v0 = v[k];
    v[k] = v0 + eps;
    const double up = f(v);
    v[k] = v0 - eps;
    const double down = f(v);
    v[k] = v0;
    g[k] = (up - down) / (2 * eps);
  }
  return g;
}

/// The errors of L's analytic gradients against central differences of f = sum c .* y.
struct GradientCheck {
  double dx_error;      ///< relative_error(dx, numeric d f / d x)
  double params_error;  ///< relative_error(grads, numeric d f / d params); 0 without params
  double max_dx;        ///< max |numeric d f / d x|, to see that the check is not vacuous
  double max_grad;      ///< max |numeric d f / d params|
};

/// L's gradients at (x, params) for f = sum_i c_i y_i against central differences of step `eps`:
/// x (rows, in_features), params (num_params), c (rows, out_features); document: the rows'
/// document ids for every op (packed documents), or empty. backward_weight runs twice from zero
/// grads and half the sum is compared, so one that overwrites is off by 2.
template <layer L>
GradientCheck check_gradients(const std::vector<double>& x, const std::vector<double>& params,
                              const std::vector<double>& c, std::size_t rows, double eps = 1e-6,
                              std::span<const std::int32_t> document = {}) {
  LayerRun<L, double> run(rows);
  run.document.assign(document.begin(), document.end());
  run.x = x;
  run.params = params;
  run.dy = c;
  run.forward_backward();
  // W accumulates: a second call doubles the gradient (exactly, in binary floating point), one
  // that overwrites leaves it at half of what is compared below
  run.backward_weight();
  for (double& g : run.grads) g /= 2;

  const auto numeric_dx = central_difference(
      [&](const std::vector<double>& v) {
        return weighted_output<L>(v, params, c, rows, document);
      },
      x, eps);
  const auto numeric_dp = central_difference(
      [&](const std::vector<double>& v) { return weighted_output<L>(x, v, c, rows, document); },
      params, eps);
  auto max_abs = [](const std::vector<double>& v) {
    double m = 0;
    for (double e : v) m = std::max(m, std::abs(e));
    return m;
  };
  return {relative_error(run.dx, numeric_dx),
          params.empty() ? 0.0 : relative_error(run.grads, numeric_dp), max_abs(numeric_dx),
          max_abs(numeric_dp)};
}

/// n values uniform in [lo, hi), drawn as float so that they are exact in double too.
inline std::vector<double> uniform_values(Rng& rng, std::size_t n, float lo, float hi) {
  std::vector<double> v(n);
  for (double& e : v) e = rng.uniform(lo, hi);
  return v;
}

/// L's initial parameters (L::init) plus a uniform perturbation in [-spread, spread), so that
/// parameters initialized to constants (LayerNorm's 1 and 0) are not special; float-exact.
template <layer L>
std::vector<double> perturbed_params(Rng& rng, float spread = 0.5f) {
  std::vector<float> p(L::num_params);
  L::init(p, rng);
  std::vector<double> out(L::num_params);
  for (std::size_t k = 0; k < p.size(); ++k) out[k] = p[k] + rng.uniform(-spread, spread);
  for (double& e : out) e = static_cast<float>(e);
  return out;
}

/// check_layer<L>(rows, seed, eps): check_gradients at random inputs: x and c uniform in
/// [-1, 1), the parameters from L::init plus a perturbation (perturbed_params).
template <layer L>
GradientCheck check_layer(std::size_t rows = 3, std::uint64_t seed = 1, double eps = 1e-6) {
  Rng rng(seed);
  const std::vector<double> params = perturbed_params<L>(rng);
  const std::vector<double> x = uniform_values(rng, rows * L::in_features, -1.0f, 1.0f);
  const std::vector<double> c = uniform_values(rng, rows * L::out_features, -1.0f, 1.0f);
  return check_gradients<L>(x, params, c, rows, eps);
}

}  // namespace gpipe::testing
