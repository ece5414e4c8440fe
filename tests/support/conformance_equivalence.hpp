#pragma once
// Backend conformance, part 1: a pipelined step equals the unpipelined model. For K = 1..4
// stages, M in {1, 2, 3, 8} micro-batches (3 and 8 do not divide the batch of 10), every remat
// policy on every stage and a policy per stage (Options::stage_remat), and both losses, the loss
// and every parameter's gradient match the double-precision sequential reference and the float K =
// 1, M = 1 run on the same backend. Gradients accumulate until zero_grad, device memory returns to
// parameters + gradients after a step, and remat lowers the activation peak.
//
// Written once, instantiated per backend with a factory (tests/runtime/test_equivalence.cpp for
// the host backend, tests/cuda/test_equivalence.cu for the CUDA backend):
//
//   struct Factory {
//     using backend_type = ...;
//     static backend_type make(std::size_t devices);   // a fresh backend with that many devices
//     static constexpr double gradient_tolerance = ..., loss_tolerance = ...,
//                             accumulate_tolerance = ...;
//     static constexpr bool report_errors = ...;        // MESSAGE the worst errors seen
//   };
//   TEST_CASE_TEMPLATE_APPLY(conformance_cross_entropy_equivalence,
//                            gpipe::test::conformance::ModelCases<Factory>);
//   TEST_CASE_TEMPLATE_APPLY(conformance_mse_equivalence, ModelCases<Factory>);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_gradient_accumulation, Factory);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_memory_after_step, Factory);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_remat_peak, Factory);

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gpipe/model.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace gpipe::test::conformance {

inline constexpr std::size_t rows = 10;
inline constexpr std::uint64_t seed = 7;

// One test case: a backend factory and a model split.
template <class F, class M>
struct Case {
  using factory = F;
  using model = M;
};
template <class F>
using ModelCases = std::tuple<Case<F, Model1>, Case<F, Model2>, Case<F, Model3>, Case<F, Model4>>;

// The largest relative_error over the tensors of `a`, against the same names in `b`.
inline double worst_relative_error(const NamedTensors& a, const NamedTensors& b) {
  double worst = 0;
  for (const auto& [name, t] : a) worst = std::max(worst, relative_error(t, b.at(name)));
  return worst;
}

// CHECKs every tensor of `got` against the tensor of the same name in the double-precision
// `reference` and in the float run `same_precision` (relative_error < tolerance, naming the
// tensor on failure); returns the largest error against `reference`.
inline double check_tensors(const NamedTensors& got, const NamedTensors& reference,
                            const NamedTensors& same_precision, double tolerance) {
  REQUIRE(got.size() == reference.size());
  double worst = 0;
  for (const auto& entry : got) {
    const std::string& name = entry.first;  // not a structured binding: CAPTURE's lambda
    CAPTURE(name);
    const double to_reference = relative_error(entry.second, reference.at(name));
    CHECK(to_reference < tolerance);
    CHECK(relative_error(entry.second, same_precision.at(name)) < tolerance);
    worst = std::max(worst, to_reference);
  }
  return worst;
}

template <class Loss>
auto targets() {
  if constexpr (std::is_same_v<Loss, SoftmaxCrossEntropy>) {
    return random_classes(rows, L6::out_features, 11);
  } else {
    return random_inputs(rows, L6::out_features, 11);
  }
}

template <class Factory, class Model, class Loss>
void check_against_reference() {
  using Backend = typename Factory::backend_type;
  const std::vector<float> x = random_inputs(rows, Model::in_features, 3);
  const auto y = targets<Loss>();

  Backend single_backend = Factory::make(1);
  Trainer<Model1, Loss, Backend> single(single_backend, {.micro_batches = 1, .seed = seed});
  const float single_loss = single.forward_backward(x, y);
  const NamedTensors single_grads = gradients_of(single);
  const ReferenceResult ref = reference_step<Model, Loss>(parameters_of(single), x, y);
  CHECK(single_loss == doctest::Approx(ref.loss).epsilon(Factory::loss_tolerance));

  double worst_gradient = worst_relative_error(single_grads, ref.gradients);
  double worst_loss = std::abs(single_loss - ref.loss) / std::max(std::abs(ref.loss), 1e-12);
  Backend backend = Factory::make(Model::num_stages);
  for (std::size_t m : {1u, 2u, 3u, 8u}) {
    // every policy on every stage, then one per stage: stage s under mix[s % 4]
    constexpr Remat mix[] = {Remat::always, Remat::selective, Remat::never, Remat::except_last};
    std::vector<std::vector<Remat>> policies;
    for (Remat remat : {Remat::never, Remat::always, Remat::except_last, Remat::selective})
      policies.emplace_back(Model::num_stages, remat);
    policies.emplace_back();
    for (std::size_t s = 0; s < Model::num_stages; ++s) policies.back().push_back(mix[s % 4]);
    for (const std::vector<Remat>& stage_remat : policies) {
      CAPTURE(Model::num_stages);
      CAPTURE(m);
      std::string remat;
      for (const Remat r : stage_remat) remat += std::string(to_string(r)) + " ";
      CAPTURE(remat);
      Trainer<Model, Loss, Backend> trainer(
          backend, {.micro_batches = m, .stage_remat = stage_remat, .seed = seed});
      // The same seed gives the same parameters whatever the split into stages.
      REQUIRE(parameters_of(trainer) == parameters_of(single));

      const float loss = trainer.forward_backward(x, y);
      CHECK(loss == doctest::Approx(ref.loss).epsilon(Factory::loss_tolerance));
      worst_loss =
          std::max(worst_loss, std::abs(loss - ref.loss) / std::max(std::abs(ref.loss), 1e-12));
      worst_gradient =
          std::max(worst_gradient, check_tensors(gradients_of(trainer), ref.gradients, single_grads,
                                                 Factory::gradient_tolerance));
    }
  }
  if constexpr (Factory::report_errors) {
    MESSAGE("K = " << Model::num_stages << ": worst relative error against the double reference: "
                   << "gradients " << worst_gradient << " (bound " << Factory::gradient_tolerance
                   << "), loss " << worst_loss << " (bound " << Factory::loss_tolerance << ")");
  }
}

}  // namespace gpipe::test::conformance

TEST_CASE_TEMPLATE_DEFINE("a pipelined cross-entropy step equals the unpipelined model", C,
                          conformance_cross_entropy_equivalence) {
  gpipe::test::conformance::check_against_reference<typename C::factory, typename C::model,
                                                    gpipe::SoftmaxCrossEntropy>();
}

TEST_CASE_TEMPLATE_DEFINE("a pipelined MSE step equals the unpipelined model", C,
                          conformance_mse_equivalence) {
  gpipe::test::conformance::check_against_reference<typename C::factory, typename C::model,
                                                    gpipe::MSELoss>();
}

TEST_CASE_TEMPLATE_DEFINE("gradients accumulate over forward_backward calls until zero_grad",
                          Factory, conformance_gradient_accumulation) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  using Backend = typename Factory::backend_type;
  const std::vector<float> x = random_inputs(rows, Model3::in_features, 3);
  const auto y = targets<SoftmaxCrossEntropy>();
  Backend backend = Factory::make(3);
  Trainer<Model3, SoftmaxCrossEntropy, Backend> trainer(backend,
                                                        {.micro_batches = 4, .seed = seed});
  trainer.forward_backward(x, y);
  const NamedTensors once = gradients_of(trainer);
  trainer.forward_backward(x, y);
  const NamedTensors twice = gradients_of(trainer);
  for (const auto& [name, g] : once) {
    std::vector<double> doubled(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) doubled[i] = 2 * g[i];
    CHECK(relative_error(twice.at(name), doubled) < Factory::accumulate_tolerance);
  }
  trainer.zero_grad();
  for (const auto& [name, g] : gradients_of(trainer))
    for (double v : g) CHECK(v == 0.0);
}

TEST_CASE_TEMPLATE_DEFINE("a step leaves only parameters and gradients on each device", Factory,
                          conformance_memory_after_step) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  using Backend = typename Factory::backend_type;
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 3);
  const auto y = targets<SoftmaxCrossEntropy>();
  Backend backend = Factory::make(4);
  for (Remat remat : {Remat::never, Remat::always, Remat::except_last, Remat::selective}) {
    Trainer<Model4, SoftmaxCrossEntropy, Backend> trainer(
        backend, {.micro_batches = 3, .remat = remat, .seed = seed});
    std::vector<std::size_t> before;
    for (std::size_t d = 0; d < 4; ++d) before.push_back(backend.memory_stats(d).current);
    for (std::size_t d = 0; d < 4; ++d)
      CHECK(before[d] == 2 * sizeof(float) * Model4::stage_num_params[d]);
    trainer.forward_backward(x, y);
    for (std::size_t d = 0; d < 4; ++d) CHECK(backend.memory_stats(d).current == before[d]);
  }
}

TEST_CASE_TEMPLATE_DEFINE("remat always keeps fewer activation bytes alive than never", Factory,
                          conformance_remat_peak) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  using Backend = typename Factory::backend_type;
  const std::vector<float> x = random_inputs(64, Model2::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(64, L6::out_features, 5);
  std::size_t peak[2] = {};
  for (Remat remat : {Remat::never, Remat::always}) {
    Backend backend = Factory::make(2);
    Trainer<Model2, SoftmaxCrossEntropy, Backend> trainer(
        backend, {.micro_batches = 8, .remat = remat, .seed = seed});
    backend.reset_peak();
    trainer.forward_backward(x, y);
    peak[remat == Remat::always] = backend.memory_stats(1).peak;
  }
  CHECK(peak[1] < peak[0]);
}
