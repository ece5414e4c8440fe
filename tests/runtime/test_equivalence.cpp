// A pipelined step equals the unpipelined model on the host backend: the backend-conformance
// suite of tests/support/conformance_equivalence.hpp (K = 1..4 stages, M in {1, 2, 3, 8}, every
// remat policy, both losses; gradient accumulation; memory after a step; remat's peak); devices
// that split their kernels over a team of threads give the one-thread step.

#include <doctest/doctest.h>

#include <cstddef>
#include <string>

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/gpipe.hpp"
#include "support/conformance_equivalence.hpp"
#include "support/errors.hpp"
#include "support/host_factory.hpp"
#include "support/models.hpp"
#include "support/relative_error.hpp"

using gpipe::test::HostFactory;

TEST_CASE_TEMPLATE_APPLY(conformance_cross_entropy_equivalence,
                         gpipe::test::conformance::ModelCases<HostFactory>);
TEST_CASE_TEMPLATE_APPLY(conformance_mse_equivalence,
                         gpipe::test::conformance::ModelCases<HostFactory>);
TEST_CASE_TEMPLATE_INVOKE(conformance_gradient_accumulation, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_memory_after_step, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_remat_peak, HostFactory);

TEST_CASE("devices whose GEMMs split over a team of threads give the one-thread step") {
  // 128-row micro-batches through 256-wide layers: gemm_split cuts every hidden GEMM (forward,
  // input gradient, weight gradient) into three blocks on a team of three.
  using Model = gpipe::Pipeline<
      gpipe::Stage<gpipe::Linear<64, 256>, gpipe::ReLU, gpipe::Linear<256, 256>>,
      gpipe::Stage<gpipe::ReLU, gpipe::Linear<256, 256>, gpipe::ReLU, gpipe::Linear<256, 8>>>;
  REQUIRE(gpipe::host::gemm_split(128, 256, 256, 3).parts == 3);
  const std::size_t rows = 512;
  const auto x = gpipe::test::random_inputs(rows, 64, 1);
  const auto y = gpipe::test::random_classes(rows, 8, 2);
  gpipe::host::Backend one(2), team(2, {.threads_per_device = 3});
  CHECK(one.threads_per_device() == 1);
  CHECK(team.threads_per_device() == 3);
  using Trainer =
      gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, gpipe::OneFOneB>;
  Trainer alone(one, {.micro_batches = 4, .seed = 3}), split(team, {.micro_batches = 4, .seed = 3});
  for (int step = 0; step < 2; ++step) {  // the second step accumulates onto the first's gradients
    const float expected = alone.forward_backward(x, y);
    CHECK(split.forward_backward(x, y) == doctest::Approx(expected).epsilon(1e-6));
  }
  for (const auto& info : alone.parameter_info()) {
    INFO(info.name);
    CHECK(gpipe::test::relative_error(split.gradient(info.name), alone.gradient(info.name)) < 1e-6);
  }
}

TEST_CASE("threads_per_device out of range is a clear error") {
  for (std::size_t threads : {std::size_t{0}, gpipe::host::Team::max_threads + 1}) {
    INFO(threads);
    CHECK(gpipe::test::contains(
        gpipe::test::error_of([&] { gpipe::host::Backend b(1, {.threads_per_device = threads}); }),
        "threads_per_device must be 1 to 256, got " + std::to_string(threads)));
  }
}
