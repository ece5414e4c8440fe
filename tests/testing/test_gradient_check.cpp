// gpipe::testing::check_layer, the installed gradient checker: it passes a library layer and a
// right user layer, and catches a layer whose backward_input or backward_weight is wrong, or
// whose W overwrites the gradient instead of accumulating into it.

#include <doctest/doctest.h>

#include "gpipe/model.hpp"
#include "gpipe/testing/gradient_check.hpp"

namespace {

using namespace gpipe;

// y = w * x elementwise (one weight per feature); Wrong selects a defect.
enum class Defect { none, input_gradient, weight_gradient, overwrites };
template <Defect Wrong>
struct Scale {
  static constexpr std::size_t in_features = 3, out_features = 3, num_params = 3;
  static constexpr std::size_t stash_per_row = 0, grad_stash_per_row = 0;
  static constexpr std::array<ParamSpec, 1> param_specs() { return {{{"weight", {3}}}}; }
  static void init(std::span<float> p, Rng& rng) {
    for (float& v : p) v = rng.uniform(0.5f, 1.5f);
  }
  template <class Ctx>
  static void forward(Ctx&, const ForwardArgs<typename Ctx::value_type>& a) {
    for (std::size_t r = 0; r < a.rows; ++r)
      for (std::size_t j = 0; j < 3; ++j) a.y[r * 3 + j] = a.params[j] * a.x[r * 3 + j];
  }
  template <class Ctx>
  static void backward_input(Ctx&, const BackwardInputArgs<typename Ctx::value_type>& a) {
    const double factor = Wrong == Defect::input_gradient ? 1.01 : 1.0;
    for (std::size_t r = 0; r < a.rows; ++r)
      for (std::size_t j = 0; j < 3; ++j)
        a.dx[r * 3 + j] =
            static_cast<typename Ctx::value_type>(factor * a.params[j] * a.dy[r * 3 + j]);
  }
  template <class Ctx>
  static void backward_weight(Ctx&, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    for (std::size_t j = 0; j < 3; ++j) {
      typename Ctx::value_type g = 0;
      for (std::size_t r = 0; r < a.rows; ++r) g += a.x[r * 3 + j] * a.dy[r * 3 + j];
      if (Wrong == Defect::weight_gradient && j == 1) g *= 2;
      if (Wrong == Defect::overwrites)
        a.grads[j] = g;
      else
        a.grads[j] += g;
    }
  }
};

}  // namespace

TEST_CASE("check_layer passes right gradients and catches wrong ones") {
  const auto linear = testing::check_layer<Linear<4, 3>>();
  CHECK(linear.dx_error < 1e-7);
  CHECK(linear.params_error < 1e-7);
  CHECK(linear.max_dx > 0.1);  // not vacuous
  const auto right = testing::check_layer<Scale<Defect::none>>(5, 2);
  CHECK(right.dx_error < 1e-7);
  CHECK(right.params_error < 1e-7);
  CHECK(testing::check_layer<Scale<Defect::input_gradient>>(5, 2).dx_error > 1e-3);
  CHECK(testing::check_layer<Scale<Defect::weight_gradient>>(5, 2).params_error > 0.1);
  // W must accumulate into grads: the check runs it twice
  CHECK(testing::check_layer<Scale<Defect::overwrites>>(5, 2).params_error > 0.4);
}
