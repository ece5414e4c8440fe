#pragma once
// A layer's random problem for the tests of tests/model/ (inputs, parameters, output weights) and
// the check that its two backward ops match central differences on it.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gpipe/model/layer.hpp"
#include "support/finite_difference.hpp"

namespace gpipe::test {

// Random inputs for L on `rows` rows: x and c (the weights of the checked sum of L's outputs)
// uniform in [-1, 1), params from L::init plus a perturbation in [-spread, spread); all
// float-exact.
template <class L>
struct LayerProblem {
  std::size_t rows;
  std::vector<double> x, params, c;

  LayerProblem(std::size_t rows, std::uint64_t seed, float spread = 0.5f) : rows(rows) {
    Rng rng(seed);
    x = uniform_values(rng, rows * L::in_features, -1.0f, 1.0f);
    params = perturbed_params<L>(rng, spread);
    c = uniform_values(rng, rows * L::out_features, -1.0f, 1.0f);
  }

  // The problem as a LayerRun in F, c as its output gradient.
  template <class F>
  LayerRun<L, F> run() const {
    LayerRun<L, F> r(rows);
    std::ranges::copy(x, r.x.begin());
    std::ranges::copy(params, r.params.begin());
    std::ranges::copy(c, r.dy.begin());
    return r;
  }
};

// L's two backward ops on p (with each row's document id, or none) against central differences
// in double: within 1e-8 relative, and not vacuous (the largest gradients above 1e-2).
template <class L>
void check_backward_against_differences(const LayerProblem<L>& p,
                                        std::span<const std::int32_t> documents = {}) {
  const GradientCheck check = check_gradients<L>(p.x, p.params, p.c, p.rows, 1e-6, documents);
  CAPTURE(check.dx_error);
  CAPTURE(check.params_error);
  CHECK(check.max_dx > 1e-2);
  CHECK(check.dx_error <= 1e-8);
  if constexpr (L::num_params > 0) {
    CHECK(check.max_grad > 1e-2);
    CHECK(check.params_error <= 1e-8);
  }
}

}  // namespace gpipe::test
