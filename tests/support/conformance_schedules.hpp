#pragma once
// Backend conformance, part 3: every schedule runs without hanging and gives the GPipe
// schedule's loss and gradients: 1F1B, ZB-H1 and ZB-H2 on K = 2, 4, 8 devices, interleaved 1F1B
// with V = 2 on 1, 2, 4 and 8 devices (and V = 4 on one), looped BFS with V = 2 on 2 and 4, ZB-V
// on 1, 2 and 4 and DualPipeV on 2 and 4 (V-shaped placement: device d holds stages d and
// 2K-1-d), for M in {1, 2, 4, 8, 16} (M < K included) and every remat policy (at M 4 also a policy
// per stage). Each is compared with the GPipe trainer of the same model, seed, M and policy, and
// with the double-precision sequential reference; a step leaves only parameters and gradients
// allocated.
//
// Instantiated per backend with a factory as in conformance_equivalence.hpp (here
// gradient_tolerance):
//   TEST_CASE_TEMPLATE_APPLY(conformance_schedules,
//                            gpipe::test::conformance::ScheduleCases<Factory>);

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gpipe/model.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "gpipe/schedule.hpp"
#include "support/conformance_equivalence.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace gpipe::test::conformance {

// Eight stages, for V = 2 on four devices and for K = 8.
using Model8 = Pipeline<Stage<L0>, Stage<L1>, Stage<L2>, Stage<L3>, Stage<L4>, Stage<L5>, Stage<L6>,
                        Stage<Linear<5, 5>>>;

// Sixteen stages, for V = 2 on eight devices.
using Model16 = Pipeline<Stage<L0>, Stage<L1>, Stage<L2>, Stage<L3>, Stage<L4>, Stage<L5>,
                         Stage<L6>, Stage<Linear<5, 5>>, Stage<GELU>, Stage<Linear<5, 5>>,
                         Stage<LayerNorm<5>>, Stage<Linear<5, 5>>, Stage<ReLU>, Stage<Linear<5, 5>>,
                         Stage<GELU>, Stage<Linear<5, 5>>>;

template <class FactoryT, class ModelT, class ScheduleT>
struct ScheduleCase {
  using Factory = FactoryT;
  using Model = ModelT;
  using Schedule = ScheduleT;
};

// 1F1B, ZB-H1 and ZB-H2 on K = 2, 4, 8 devices; interleaved with V = 2 on 1, 2, 4 and 8
// devices, and V = 4 on one; looped BFS with V = 2 on 2 and 4 devices; the V-shaped ZB-V on 1, 2
// and 4 devices and DualPipeV on 2 and 4 (where M >= 2K; below, the trainer refuses it).
template <class F>
using ScheduleCases =
    std::tuple<ScheduleCase<F, Model2, OneFOneB>, ScheduleCase<F, Model4, OneFOneB>,
               ScheduleCase<F, Model8, OneFOneB>, ScheduleCase<F, Model2, ZeroBubbleH1>,
               ScheduleCase<F, Model4, ZeroBubbleH1>, ScheduleCase<F, Model8, ZeroBubbleH1>,
               ScheduleCase<F, Model2, Interleaved<2>>, ScheduleCase<F, Model4, Interleaved<2>>,
               ScheduleCase<F, Model8, Interleaved<2>>, ScheduleCase<F, Model16, Interleaved<2>>,
               ScheduleCase<F, Model4, Interleaved<4>>, ScheduleCase<F, Model4, LoopedBFS<2>>,
               ScheduleCase<F, Model8, LoopedBFS<2>>, ScheduleCase<F, Model2, ZeroBubbleH2>,
               ScheduleCase<F, Model4, ZeroBubbleH2>, ScheduleCase<F, Model8, ZeroBubbleH2>,
               ScheduleCase<F, Model2, ZeroBubbleV>, ScheduleCase<F, Model4, ZeroBubbleV>,
               ScheduleCase<F, Model8, ZeroBubbleV>, ScheduleCase<F, Model4, DualPipeV>,
               ScheduleCase<F, Model8, DualPipeV>>;

inline constexpr std::size_t schedule_rows = 16;  // enough rows for M = 16
inline constexpr std::uint64_t schedule_seed = 7;

inline double relative_difference(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-12);
}

// Float against float (GPipe) and against double (reference), relative to the largest entry of
// each reference tensor, within the factory's gradient_tolerance (which bounds the loss too):
// the orders of accumulation differ only within a micro-batch's stage.
template <class C>
void check_schedule_matches_gpipe() {
  using Factory = typename C::Factory;
  using Backend = typename Factory::backend_type;
  using Model = typename C::Model;
  using Kind = typename C::Schedule;
  using Loss = SoftmaxCrossEntropy;
  constexpr double tolerance = Factory::gradient_tolerance;
  constexpr std::size_t rows = schedule_rows;
  constexpr std::uint64_t seed = schedule_seed;
  constexpr std::size_t num_devices = Model::num_stages / Kind::chunks_per_device;

  const std::vector<float> x = random_inputs(rows, Model::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 11);

  Backend gpipe_backend = Factory::make(Model::num_stages);
  Backend backend = Factory::make(num_devices);
  for (std::size_t m : {1u, 2u, 4u, 8u, 16u}) {
    // every policy on every stage, and at M 4 one per stage: stage s under mix[s % 4]
    constexpr Remat mix[] = {Remat::always, Remat::selective, Remat::never, Remat::except_last};
    std::vector<std::vector<Remat>> policies;
    for (Remat remat : {Remat::never, Remat::always, Remat::except_last, Remat::selective})
      policies.emplace_back(Model::num_stages, remat);
    if (m == 4) {
      policies.emplace_back();
      for (std::size_t s = 0; s < Model::num_stages; ++s) policies.back().push_back(mix[s % 4]);
    }
    for (const std::vector<Remat>& stage_remat : policies) {
      CAPTURE(Kind::name);
      CAPTURE(num_devices);
      CAPTURE(m);
      std::string remat;
      for (const Remat r : stage_remat) remat += std::string(to_string(r)) + " ";
      CAPTURE(remat);
      const typename Trainer<Model, Loss, Backend>::Options options{
          .micro_batches = m, .stage_remat = stage_remat, .seed = seed};
      if constexpr (std::is_same_v<Kind, DualPipeV>) {
        if (m < 2 * num_devices) {  // DualPipeV needs 2 micro-batches per stage of its V
          using T = Trainer<Model, Loss, Backend, Kind>;
          CHECK_THROWS_WITH_AS(
              T(backend, {.micro_batches = m, .stage_remat = stage_remat, .seed = seed}),
              doctest::Contains("at least 2K micro-batches"), Error);
          continue;
        }
      }

      Trainer<Model, Loss, Backend> gpipe_trainer(gpipe_backend, options);
      const float gpipe_loss = gpipe_trainer.forward_backward(x, y);
      const NamedTensors gpipe_grads = gradients_of(gpipe_trainer);
      const ReferenceResult ref = reference_step<Model, Loss>(parameters_of(gpipe_trainer), x, y);

      Trainer<Model, Loss, Backend, Kind> trainer(
          backend, {.micro_batches = m, .stage_remat = stage_remat, .seed = seed});
      REQUIRE(trainer.schedule() == Kind::make(num_devices, m));
      REQUIRE(parameters_of(trainer) == parameters_of(gpipe_trainer));
      std::vector<std::size_t> before;
      for (std::size_t d = 0; d < num_devices; ++d)
        before.push_back(backend.memory_stats(d).current);

      const float loss = trainer.forward_backward(x, y);
      CHECK(relative_difference(loss, gpipe_loss) < tolerance);
      CHECK(relative_difference(loss, ref.loss) < tolerance);
      check_tensors(gradients_of(trainer), ref.gradients, gpipe_grads, tolerance);
      for (std::size_t d = 0; d < num_devices; ++d) {
        CAPTURE(d);
        CHECK(backend.memory_stats(d).current == before[d]);
      }
    }
  }
}

}  // namespace gpipe::test::conformance

TEST_CASE_TEMPLATE_DEFINE("every schedule gives GPipe's loss and gradients", C,
                          conformance_schedules) {
  gpipe::test::conformance::check_schedule_matches_gpipe<C>();
}
