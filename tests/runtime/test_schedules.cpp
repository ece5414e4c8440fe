// Every schedule runs on the host backend without hanging and gives the GPipe schedule's loss and
// gradients: 1F1B and ZB-H1 on K = 2, 4, 8 devices, interleaved 1F1B with V = 2 on 1, 2 and 4
// devices (and V = 4 on one), for M in {1, 2, 4, 8, 16} (M < K included) and every remat policy.
// Each is compared with the GPipe trainer of the same model, seed, M and policy, and with the
// double-precision sequential reference; a step leaves only parameters and gradients allocated.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

// Eight stages, for V = 2 on four devices and for K = 8.
using Model8 = Pipeline<Stage<L0>, Stage<L1>, Stage<L2>, Stage<L3>, Stage<L4>, Stage<L5>, Stage<L6>,
                        Stage<Linear<5, 5>>>;

// Sixteen stages, for V = 2 on eight devices.
using Model16 = Pipeline<Stage<L0>, Stage<L1>, Stage<L2>, Stage<L3>, Stage<L4>, Stage<L5>,
                         Stage<L6>, Stage<Linear<5, 5>>, Stage<GELU>, Stage<Linear<5, 5>>,
                         Stage<LayerNorm<5>>, Stage<Linear<5, 5>>, Stage<ReLU>, Stage<Linear<5, 5>>,
                         Stage<GELU>, Stage<Linear<5, 5>>>;

template <class ModelT, class ScheduleT>
struct Config {
  using Model = ModelT;
  using Schedule = ScheduleT;
};

constexpr std::size_t rows = 16;  // enough rows for M = 16
constexpr std::uint64_t seed = 7;

// Float against float (GPipe) and against double (reference), relative to the largest entry of
// each reference tensor: the orders of accumulation differ only within a micro-batch's stage.
constexpr double tolerance = 2e-6;

double relative_difference(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-12);
}

template <class C>
void check_matches_gpipe() {
  using Model = typename C::Model;
  using Kind = typename C::Schedule;
  using Loss = SoftmaxCrossEntropy;
  constexpr std::size_t num_devices = Model::num_stages / Kind::chunks_per_device;

  const std::vector<float> x = random_inputs(rows, Model::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 11);

  host::Backend gpipe_backend(Model::num_stages);
  host::Backend backend(num_devices);
  for (std::size_t m : {1u, 2u, 4u, 8u, 16u}) {
    for (Remat remat : {Remat::never, Remat::always, Remat::except_last}) {
      CAPTURE(Kind::name);
      CAPTURE(num_devices);
      CAPTURE(m);
      CAPTURE(to_string(remat));
      const typename Trainer<Model, Loss, host::Backend>::Options options{
          .micro_batches = m, .remat = remat, .seed = seed};

      Trainer<Model, Loss, host::Backend> gpipe_trainer(gpipe_backend, options);
      const float gpipe_loss = gpipe_trainer.forward_backward(x, y);
      const NamedTensors gpipe_grads = gradients_of(gpipe_trainer);
      const ReferenceResult ref = reference_step<Model, Loss>(parameters_of(gpipe_trainer), x, y);

      Trainer<Model, Loss, host::Backend, Kind> trainer(
          backend, {.micro_batches = m, .remat = remat, .seed = seed});
      REQUIRE(trainer.schedule() == Kind::make(num_devices, m));
      REQUIRE(parameters_of(trainer) == parameters_of(gpipe_trainer));
      std::vector<std::size_t> before;
      for (std::size_t d = 0; d < num_devices; ++d)
        before.push_back(backend.memory_stats(d).current);

      const float loss = trainer.forward_backward(x, y);
      CHECK(relative_difference(loss, gpipe_loss) < tolerance);
      CHECK(relative_difference(loss, ref.loss) < tolerance);
      const NamedTensors grads = gradients_of(trainer);
      REQUIRE(grads.size() == ref.gradients.size());
      for (const auto& entry : grads) {
        const std::string& name = entry.first;  // not a structured binding: CAPTURE's lambda
        const std::vector<double>& g = entry.second;
        CAPTURE(name);
        CHECK(relative_error(g, gpipe_grads.at(name)) < tolerance);
        CHECK(relative_error(g, ref.gradients.at(name)) < tolerance);
      }
      for (std::size_t d = 0; d < num_devices; ++d) {
        CAPTURE(d);
        CHECK(backend.memory_stats(d).current == before[d]);
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("every schedule gives GPipe's loss and gradients", C, Config<Model2, OneFOneB>,
                   Config<Model4, OneFOneB>, Config<Model8, OneFOneB>, Config<Model2, ZeroBubbleH1>,
                   Config<Model4, ZeroBubbleH1>, Config<Model8, ZeroBubbleH1>,
                   Config<Model2, Interleaved<2>>, Config<Model4, Interleaved<2>>,
                   Config<Model8, Interleaved<2>>, Config<Model16, Interleaved<2>>,
                   Config<Model4, Interleaved<4>>) {
  check_matches_gpipe<C>();
}

TEST_CASE("a trainer places interleaved stages on devices round robin") {
  host::Backend backend(2);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, Interleaved<2>> trainer(
      backend, {.micro_batches = 3, .seed = seed});
  CHECK(trainer.num_devices == 2);
  CHECK(trainer.schedule().num_chunks == 2);
  for (std::size_t s = 0; s < 4; ++s) CHECK(trainer.device_of_stage(s) == s % 2);
  // Parameters of stages 0 and 2 live on device 0, of stages 1 and 3 on device 1.
  std::size_t on_device[2] = {};
  for (std::size_t s = 0; s < 4; ++s) on_device[s % 2] += Model4::stage_num_params[s];
  for (std::size_t d = 0; d < 2; ++d)
    CHECK(backend.memory_stats(d).current == 2 * sizeof(float) * on_device[d]);
}

TEST_CASE("inference follows the interleaved placement and matches GPipe's") {
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 3);
  host::Backend gpipe_backend(4);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend> gpipe_trainer(
      gpipe_backend, {.micro_batches = 4, .seed = seed});
  host::Backend backend(2);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, Interleaved<2>> trainer(
      backend, {.micro_batches = 4, .seed = seed});
  CHECK(trainer.predict(x) == gpipe_trainer.predict(x));
}
