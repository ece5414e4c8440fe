// A pipelined step equals the unpipelined model: for K = 1..4 stages, M in {1, 2, 3, 8}
// micro-batches (3 and 8 do not divide the batch of 10), every remat policy and both losses,
// the loss and every parameter's gradient match the double-precision sequential reference, and
// the float K = 1, M = 1 run.

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

constexpr std::size_t rows = 10;
constexpr std::uint64_t seed = 7;

// Float against double, relative to the largest reference entry of each tensor: a few float ulps
// per accumulated term (observed below 1e-6 for every configuration).
constexpr double gradient_tolerance = 2e-6;
constexpr double loss_tolerance = 1e-6;

template <class Loss>
auto targets() {
  if constexpr (std::is_same_v<Loss, SoftmaxCrossEntropy>) {
    return random_classes(rows, L6::out_features, 11);
  } else {
    return random_inputs(rows, L6::out_features, 11);
  }
}

template <class Model, class Loss>
void check_against_reference() {
  const std::vector<float> x = random_inputs(rows, Model::in_features, 3);
  const auto y = targets<Loss>();

  host::Backend single_backend(1);
  Trainer<Model1, Loss, host::Backend> single(single_backend, {.micro_batches = 1, .seed = seed});
  const float single_loss = single.forward_backward(x, y);
  const NamedTensors single_grads = gradients_of(single);
  const ReferenceResult ref = reference_step<Model, Loss>(parameters_of(single), x, y);
  CHECK(single_loss == doctest::Approx(ref.loss).epsilon(loss_tolerance));

  host::Backend backend(Model::num_stages);
  for (std::size_t m : {1u, 2u, 3u, 8u}) {
    for (Remat remat : {Remat::never, Remat::always, Remat::except_last}) {
      CAPTURE(m);
      CAPTURE(to_string(remat));
      Trainer<Model, Loss, host::Backend> trainer(backend,
                                                  {.micro_batches = m, .remat = remat, .seed = seed});
      // The same seed gives the same parameters whatever the split into stages.
      REQUIRE(parameters_of(trainer) == parameters_of(single));

      const float loss = trainer.forward_backward(x, y);
      CHECK(loss == doctest::Approx(ref.loss).epsilon(loss_tolerance));
      const NamedTensors grads = gradients_of(trainer);
      REQUIRE(grads.size() == ref.gradients.size());
      for (const auto& [name, g] : grads) {
        CAPTURE(name);
        CHECK(relative_error(g, ref.gradients.at(name)) < gradient_tolerance);
        CHECK(relative_error(g, single_grads.at(name)) < gradient_tolerance);
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("a pipelined cross-entropy step equals the unpipelined model", Model, Model1,
                   Model2, Model3, Model4) {
  check_against_reference<Model, SoftmaxCrossEntropy>();
}

TEST_CASE_TEMPLATE("a pipelined MSE step equals the unpipelined model", Model, Model1, Model2,
                   Model3, Model4) {
  check_against_reference<Model, MSELoss>();
}

TEST_CASE("gradients accumulate over forward_backward calls until zero_grad") {
  const std::vector<float> x = random_inputs(rows, Model3::in_features, 3);
  const auto y = targets<SoftmaxCrossEntropy>();
  host::Backend backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> trainer(backend,
                                                              {.micro_batches = 4, .seed = seed});
  trainer.forward_backward(x, y);
  const NamedTensors once = gradients_of(trainer);
  trainer.forward_backward(x, y);
  const NamedTensors twice = gradients_of(trainer);
  for (const auto& [name, g] : once) {
    std::vector<double> doubled(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) doubled[i] = 2 * g[i];
    CHECK(relative_error(twice.at(name), doubled) < 1e-6);
  }
  trainer.zero_grad();
  for (const auto& [name, g] : gradients_of(trainer))
    for (double v : g) CHECK(v == 0.0);
}

TEST_CASE("a step leaves only parameters and gradients on each device") {
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 3);
  const auto y = targets<SoftmaxCrossEntropy>();
  host::Backend backend(4);
  for (Remat remat : {Remat::never, Remat::always, Remat::except_last}) {
    Trainer<Model4, SoftmaxCrossEntropy, host::Backend> trainer(
        backend, {.micro_batches = 3, .remat = remat, .seed = seed});
    std::vector<std::size_t> before;
    for (std::size_t d = 0; d < 4; ++d) before.push_back(backend.memory_stats(d).current);
    for (std::size_t d = 0; d < 4; ++d)
      CHECK(before[d] == 2 * sizeof(float) * Model4::stage_num_params[d]);
    trainer.forward_backward(x, y);
    for (std::size_t d = 0; d < 4; ++d) CHECK(backend.memory_stats(d).current == before[d]);
  }
}

TEST_CASE("remat always keeps fewer activation bytes alive than never") {
  const std::vector<float> x = random_inputs(64, Model2::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(64, L6::out_features, 5);
  std::size_t peak[2] = {};
  for (Remat remat : {Remat::never, Remat::always}) {
    host::Backend backend(2);
    Trainer<Model2, SoftmaxCrossEntropy, host::Backend> trainer(
        backend, {.micro_batches = 8, .remat = remat, .seed = seed});
    backend.reset_peak();
    trainer.forward_backward(x, y);
    peak[remat == Remat::always] = backend.memory_stats(1).peak;
  }
  CHECK(peak[1] < peak[0]);
}
