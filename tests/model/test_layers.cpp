// Every built-in layer against independent references: both backward ops against central finite
// differences in double precision, W accumulating, float kernels against double kernels, GELU
// against the erf formula, LayerNorm's statistics and eps. Every buffer a layer writes is NaN
// before the op (tests/support/finite_difference.hpp), so reading an unwritten value fails.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <type_traits>
#include <vector>

#include "gpipe/backend/host.hpp"
#include "gpipe/model.hpp"
#include "support/finite_difference.hpp"

namespace {

using gpipe::GELU;
using gpipe::LayerNorm;
using gpipe::Linear;
using gpipe::ReLU;
using gpipe::Residual;
using gpipe::Rng;
using gpipe::Stage;
using gpipe::test::LayerRun;
using gpipe::test::relative_error;

using Linear5x3 = Linear<5, 3>;
using Linear5x3NoBias = Linear<5, 3, false>;
using Relu6 = ReLU::with_features<6>;
using Gelu6 = GELU::with_features<6>;
using LayerNorm7 = LayerNorm<7>;
using ResidualMlp = Residual<Linear<4, 6>, GELU, Linear<6, 4>>::with_features<4>;
using ResidualNorm = Residual<LayerNorm<5>, Linear<5, 5>>::with_features<5>;
using StageChain = Stage<Linear<4, 8>, ReLU, LayerNorm<8>, Residual<Linear<8, 8>, GELU>>::bound<4>;
using CheckpointMlp = gpipe::Checkpoint<Linear<4, 6>, GELU, Linear<6, 4>>::with_features<4>;
using CheckpointedStage =
    Stage<Linear<4, 8>, gpipe::Checkpoint<GELU, LayerNorm<8>, Residual<Linear<8, 8>, GELU>>,
          Linear<8, 3>>::bound<4>;

constexpr std::size_t rows = 3;

double min_abs(std::span<const double> v) {
  double m = std::numeric_limits<double>::infinity();
  for (double e : v) m = std::min(m, std::abs(e));
  return m;
}

// The smallest |input| of any ReLU in L (infinity when L has none). Finite differences and the
// float-versus-double comparison are only meaningful away from ReLU's kink at 0.
template <class L>
double relu_margin(const std::vector<double>& x, const std::vector<double>& params) {
  if constexpr (std::is_same_v<L, Relu6>) {
    return min_abs(x);
  } else if constexpr (std::is_same_v<L, StageChain>) {
    using First = Linear<4, 8>;  // its output is the ReLU's input
    LayerRun<First, double> run(rows);
    run.x = x;
    std::copy_n(params.begin(), First::num_params, run.params.begin());
    run.forward();
    return min_abs(run.y);
  } else {
    return std::numeric_limits<double>::infinity();
  }
}

// Random inputs for L: x and c uniform in [-1, 1), params from L::init plus a perturbation; all
// float-exact. Redrawn until every ReLU input is at least 1e-3 away from 0.
template <class L>
struct Problem {
  std::vector<double> x, params, c;

  explicit Problem(std::uint64_t seed) {
    Rng rng(seed);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      x = gpipe::test::uniform_values(rng, rows * L::in_features, -1.0f, 1.0f);
      params = gpipe::test::perturbed_params<L>(rng);
      c = gpipe::test::uniform_values(rng, rows * L::out_features, -1.0f, 1.0f);
      if (relu_margin<L>(x, params) > 1e-3) return;
    }
    FAIL("no inputs found with every ReLU input away from 0");
  }

  template <class T>
  LayerRun<L, T> run() const {
    LayerRun<L, T> r(rows);
    std::ranges::copy(x, r.x.begin());
    std::ranges::copy(params, r.params.begin());
    std::ranges::copy(c, r.dy.begin());
    return r;
  }
};

bool all_finite(std::span<const double> v) {
  return std::ranges::all_of(v, [](double e) { return std::isfinite(e); });
}

}  // namespace

TYPE_TO_STRING_AS("Linear<5, 3>", Linear5x3);
TYPE_TO_STRING_AS("Linear<5, 3, false> (no bias)", Linear5x3NoBias);
TYPE_TO_STRING_AS("ReLU at width 6", Relu6);
TYPE_TO_STRING_AS("GELU at width 6", Gelu6);
TYPE_TO_STRING_AS("LayerNorm<7>", LayerNorm7);
TYPE_TO_STRING_AS("Residual<Linear<4, 6>, GELU, Linear<6, 4>>", ResidualMlp);
TYPE_TO_STRING_AS("Residual<LayerNorm<5>, Linear<5, 5>>", ResidualNorm);
TYPE_TO_STRING_AS("Stage<Linear<4, 8>, ReLU, LayerNorm<8>, Residual<Linear<8, 8>, GELU>>",
                  StageChain);
TYPE_TO_STRING_AS("Checkpoint<Linear<4, 6>, GELU, Linear<6, 4>>", CheckpointMlp);
TYPE_TO_STRING_AS(
    "Stage<Linear<4, 8>, Checkpoint<GELU, LayerNorm<8>, Residual<...>>, Linear<8, 3>>",
    CheckpointedStage);

#define GPIPE_BUILTIN_LAYERS                                                                   \
  Linear5x3, Linear5x3NoBias, Relu6, Gelu6, LayerNorm7, ResidualMlp, ResidualNorm, StageChain, \
      CheckpointMlp, CheckpointedStage

static_assert(gpipe::layer_for<Linear5x3, gpipe::host::Kernels<double>>);
static_assert(gpipe::layer_for<StageChain, gpipe::host::Kernels<double>>);
static_assert(gpipe::layer_for<StageChain, gpipe::host::Kernels<float>>);

TEST_SUITE("model layers") {
  TEST_CASE_TEMPLATE("a layer's backward ops match central differences of sum(c * y) in double", L,
                     GPIPE_BUILTIN_LAYERS) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      CAPTURE(seed);
      const Problem<L> p(seed);
      const auto check = gpipe::test::check_gradients<L>(p.x, p.params, p.c, rows, 1e-6);
      CAPTURE(check.dx_error);
      CAPTURE(check.params_error);
      CHECK(check.max_dx > 1e-2);  // the check is not vacuous
      CHECK(check.dx_error <= 1e-8);
      if constexpr (L::num_params > 0) {
        CHECK(check.max_grad > 1e-2);
        CHECK(check.params_error <= 1e-8);
      }
    }
  }

  TEST_CASE_TEMPLATE("backward_weight accumulates into grads instead of overwriting them", L,
                     GPIPE_BUILTIN_LAYERS) {
    const Problem<L> p(11);
    auto once = p.template run<double>();
    once.forward_backward();
    const std::vector<double> g = once.grads;

    // A second call on the same inputs doubles the gradient.
    once.backward_weight();
    std::vector<double> twice_expected = g;
    for (double& e : twice_expected) e *= 2;
    CHECK(relative_error(once.grads, twice_expected) <= 1e-14);

    // Starting from arbitrary grads g0 leaves g0 + g.
    auto offset = p.template run<double>();
    Rng rng(12);
    offset.grads = gpipe::test::uniform_values(rng, L::num_params, -1.0f, 1.0f);
    std::vector<double> expected = offset.grads;
    for (std::size_t k = 0; k < g.size(); ++k) expected[k] += g[k];
    offset.forward_backward();
    CHECK(relative_error(offset.grads, expected) <= 1e-14);
  }

  TEST_CASE_TEMPLATE("forward fills the whole stash and backward_input the whole grad stash", L,
                     GPIPE_BUILTIN_LAYERS) {
    const Problem<L> p(21);
    auto run = p.template run<double>();
    run.forward();
    CHECK(run.stash.size() == rows * L::stash_per_row);
    CHECK(all_finite(run.y));
    CHECK(all_finite(run.stash));
    run.backward_input();
    CHECK(run.grad_stash.size() == rows * L::grad_stash_per_row);
    CHECK(all_finite(run.dx));
    CHECK(all_finite(run.grad_stash));
    run.backward_weight();
    CHECK(all_finite(run.grads));
  }

  TEST_CASE_TEMPLATE("float kernels agree with double kernels within 1e-5 relative", L,
                     GPIPE_BUILTIN_LAYERS) {
    const Problem<L> p(31);
    auto f = p.template run<float>();
    auto d = p.template run<double>();
    f.forward_backward();
    d.forward_backward();
    CHECK(relative_error(f.y, d.y) <= 1e-5);
    CHECK(relative_error(f.dx, d.dx) <= 1e-5);
    CHECK(relative_error(f.grads, d.grads) <= 1e-5);
  }
}

TEST_SUITE("model layers") {
  TEST_CASE_TEMPLATE("GELU's forward is the exact erf form 0.5 x (1 + erf(x / sqrt 2))", T, float,
                     double) {
    const std::vector<T> x{-4, -2.5, -1, -0.5, -1e-3, 0, 1e-3, 0.25, 0.5, 1, 2, 3.5};
    std::vector<T> y(x.size(), gpipe::test::nan_v<T>);
    gpipe::host::Kernels<T> ctx;
    Gelu6::forward(ctx, gpipe::ForwardArgs<T>{2, x.data(), y.data(), nullptr, nullptr});
    // Relative to max(1, |y|): the tanh approximation is off by up to ~5e-4 on these points.
    const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-15;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const long double xi = x[i];
      const long double ref = 0.5L * xi * (1 + std::erf(xi / std::numbers::sqrt2_v<long double>));
      CAPTURE(xi);
      CHECK(std::abs(static_cast<long double>(y[i]) - ref) <= tol * std::max(1.0L, std::abs(ref)));
    }
  }

  TEST_CASE("ReLU passes positive inputs, zeroes the rest, and has gradient 0 at 0") {
    const std::vector<double> x{-2, -1e-9, 0, 1e-9, 3, 0.5};
    const std::vector<double> dy{1, 2, 3, 4, 5, 6};
    std::vector<double> y(6, gpipe::test::nan_v<double>), dx(6, gpipe::test::nan_v<double>);
    gpipe::host::Kernels<double> ctx;
    Relu6::forward(ctx, gpipe::ForwardArgs<double>{1, x.data(), y.data(), nullptr, nullptr});
    Relu6::backward_input(ctx, gpipe::BackwardInputArgs<double>{1, x.data(), dy.data(), dx.data(),
                                                                nullptr, nullptr, nullptr});
    CHECK(y == std::vector<double>{0, 0, 0, 1e-9, 3, 0.5});
    CHECK(dx == std::vector<double>{0, 0, 0, 4, 5, 6});
  }

  TEST_CASE("LayerNorm at initialization gives each row mean 0 and biased variance 1") {
    constexpr std::size_t n = 7;
    LayerRun<LayerNorm<n>, double> run(rows);
    std::vector<float> init(LayerNorm<n>::num_params);
    Rng rng(41);
    LayerNorm<n>::init(init, rng);
    std::ranges::copy(init, run.params.begin());
    for (std::size_t k = 0; k < n; ++k) {
      CHECK(run.params[k] == 1.0);
      CHECK(run.params[n + k] == 0.0);
    }
    // Rows far from mean 0 and variance 1: around 3 with spread 2, -10 with spread 8, 0 with 1.
    const double centre[rows] = {3, -10, 0}, spread[rows] = {2, 8, 1};
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t k = 0; k < n; ++k)
        run.x[r * n + k] = centre[r] + spread[r] * rng.uniform(-1.0f, 1.0f);
    run.forward();
    for (std::size_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      double mean_x = 0, mean_y = 0;
      for (std::size_t k = 0; k < n; ++k)
        mean_x += run.x[r * n + k] / n, mean_y += run.y[r * n + k] / n;
      double var_x = 0, var_y = 0;
      for (std::size_t k = 0; k < n; ++k) {
        var_x += (run.x[r * n + k] - mean_x) * (run.x[r * n + k] - mean_x) / n;
        var_y += (run.y[r * n + k] - mean_y) * (run.y[r * n + k] - mean_y) / n;
      }
      CHECK(std::abs(mean_y) <= 1e-14);
      CHECK(std::abs(var_y - 1) <= 1e-4);
      CHECK(std::abs(var_y - var_x / (var_x + 1e-5)) <= 1e-13);
    }
  }

  TEST_CASE("LayerNorm adds eps 1e-5 to the variance, so a constant row gives y = bias") {
    constexpr std::size_t n = 6;
    static_assert(LayerNorm<n>::eps == 1e-5);
    Rng rng(51);
    LayerRun<LayerNorm<n>, double> run(rows);
    run.params = gpipe::test::perturbed_params<LayerNorm<n>>(rng);
    // Row 0: variance ~1e-7, where eps dominates: var(y / weight) = v / (v + 1e-5) ~ 0.01.
    // Row 1: constant. Row 2: constant 0.
    for (std::size_t k = 0; k < n; ++k) {
      run.x[k] = 2 + 1e-3 * rng.uniform(-1.0f, 1.0f);
      run.x[n + k] = -3.25;
      run.x[2 * n + k] = 0;
    }
    run.forward();

    double mean_x = 0, var_x = 0, var_xhat = 0;
    for (std::size_t k = 0; k < n; ++k) mean_x += run.x[k] / n;
    for (std::size_t k = 0; k < n; ++k) var_x += (run.x[k] - mean_x) * (run.x[k] - mean_x) / n;
    for (std::size_t k = 0; k < n; ++k) {
      const double xhat = (run.y[k] - run.params[n + k]) / run.params[k];
      var_xhat += xhat * xhat / n;
    }
    CHECK(var_x < 1e-6);
    CHECK(var_xhat == doctest::Approx(var_x / (var_x + 1e-5)).epsilon(1e-8));
    CHECK(var_xhat < 0.2);

    for (std::size_t r = 1; r < rows; ++r)
      for (std::size_t k = 0; k < n; ++k) CHECK(run.y[r * n + k] == run.params[n + k]);

    // The input gradient of a constant row is finite: rstd = 1/sqrt(1e-5) there.
    Rng dy_rng(52);
    run.dy = gpipe::test::uniform_values(dy_rng, rows * n, -1.0f, 1.0f);
    run.backward_input();
    CHECK(all_finite(run.dx));
  }
}

TEST_SUITE("model layers") {
  TEST_CASE("a chain skips its first layer's B when dx is not wanted, and B_1.. still run") {
    // Linear first: no grad stash, so dx == nullptr skips its GEMM; the rest of the chain must
    // give the same grad stash (its g_1) and the same W as with dx.
    using Chain = Stage<Linear<4, 6>, ReLU, Linear<6, 3>>::bound<4>;
    static_assert(Chain::skips_input_gradient);
    static_assert(
        !Stage<Residual<Linear<4, 4>, GELU>, Linear<4, 3>>::bound<4>::skips_input_gradient);
    LayerRun<Chain, double> with_dx(rows), without_dx(rows);
    for (auto* run : {&with_dx, &without_dx}) {
      Rng same(61);
      run->x = gpipe::test::uniform_values(same, rows * 4, -1.0f, 1.0f);
      run->params = gpipe::test::uniform_values(same, Chain::num_params, -1.0f, 1.0f);
      run->dy = gpipe::test::uniform_values(same, rows * 3, -1.0f, 1.0f);
      run->forward();
    }
    with_dx.backward_input();
    without_dx.backward_input_without_dx();
    CHECK(without_dx.grad_stash == with_dx.grad_stash);
    CHECK(all_finite(without_dx.grad_stash));
    with_dx.backward_weight();
    without_dx.backward_weight();
    CHECK(without_dx.grads == with_dx.grads);
  }
}

TEST_SUITE("model layers") {
  // Stage<Linear<4, 8>, ReLU, LayerNorm<8>, Residual<Linear<8, 8>, GELU>>: of its stash
  // (a_1..a_3 8 each, LayerNorm's 2 statistics, the residual body's a_1 8), ReLU's and
  // LayerNorm's outputs and LayerNorm's statistics are cheap; the body's GELU is its last layer,
  // whose output the chain does not keep.
  static_assert(StageChain::stash_per_row == 34 && StageChain::cheap_stash_per_row == 18);
  static_assert(ResidualMlp::cheap_stash_per_row == 6 && ResidualNorm::cheap_stash_per_row == 7);
  static_assert(Stage<Linear<4, 6>, ReLU>::bound<4>::cheap_stash_per_row == 0);
  static_assert(gpipe::cheap_stash_per_row_v<CheckpointMlp> == 0 &&
                CheckpointMlp::stash_per_row == 0);

  TEST_CASE_TEMPLATE("recompute rebuilds the cheap part of the stash bit for bit", L, StageChain,
                     ResidualMlp, ResidualNorm, CheckpointedStage) {
    const Problem<L> p(71);
    for (bool as_float : {false, true}) {
      CAPTURE(as_float);
      auto check = [&]<class T>(LayerRun<L, T> run) {
        run.forward();
        const std::vector<T> stash = run.stash;
        run.recompute();
        CHECK(run.stash == stash);  // bitwise, and NaN left anywhere differs
        if constexpr (gpipe::cheap_stash_per_row_v < L >> 0) {
          CHECK(std::ranges::none_of(run.stash, [](T v) { return std::isnan(v); }));
        }
      };
      if (as_float)
        check(p.template run<float>());
      else
        check(p.template run<double>());
    }
  }
}
