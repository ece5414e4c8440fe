// Optimizer steps on a pipeline equal PyTorch's update rules applied to the unpipelined model's
// gradients, on the host backend: the backend-conformance suite of
// tests/support/conformance_optimizers.hpp; and hyperparameter checks.

#include <doctest/doctest.h>

#include <cstddef>

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/error.hpp"
#include "gpipe/optim.hpp"
#include "support/conformance_optimizers.hpp"
#include "support/host_factory.hpp"

using gpipe::test::HostFactory;

TEST_CASE_TEMPLATE_INVOKE(conformance_sgd, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_momentum, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_nesterov, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_adamw, HostFactory);

TEST_CASE("bad optimizer hyperparameters are a gpipe::Error") {
  using namespace gpipe;
  CHECK_THROWS_AS(optim::SGD({.lr = -1}), Error);
  CHECK_THROWS_AS(optim::SGD({.lr = 0.1, .nesterov = true}), Error);
  CHECK_THROWS_AS(optim::AdamW({.beta1 = 1.0}), Error);
  CHECK_THROWS_AS(optim::AdamW({.beta2 = -0.1}), Error);
  CHECK_THROWS_AS(optim::AdamW({.eps = -1}), Error);
}
