#pragma once
// Finite-difference checks of a layer's two backward ops in double precision: the installed
// gpipe/testing/gradient_check.hpp (what users test their own layers with), under the tests'
// namespace.

#include "gpipe/testing/gradient_check.hpp"
#include "support/relative_error.hpp"

namespace gpipe::test {

using testing::central_difference;
using testing::check_gradients;
using testing::check_layer;
using testing::GradientCheck;
using testing::LayerRun;
using testing::nan_v;
using testing::perturbed_params;
using testing::uniform_values;
using testing::weighted_output;

}  // namespace gpipe::test
