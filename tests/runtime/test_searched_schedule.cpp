// A schedule chosen at run time: op costs measured on the host backend (measure_op_costs), a
// schedule searched from them (search_schedule), run by a trainer through Options::schedule:
// the GPipe trainer's loss and gradients; a schedule of another shape is refused.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/measure_costs.hpp"
#include "support/models.hpp"

using namespace gpipe;
using namespace gpipe::test;

TEST_CASE("a schedule searched from measured costs trains as GPipe does") {
  constexpr std::size_t rows = 24, m = 6;
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(rows, Model4::out_features, 4);
  host::Backend backend(4);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, ZeroBubbleH1> probe(
      backend, {.micro_batches = m, .seed = 2});
  const std::vector<OpCosts> costs = measure_op_costs(probe, x, y, 2);
  REQUIRE(costs.size() == 4);
  for (const OpCosts& c : costs) {
    CHECK(c.forward > 0);
    CHECK(c.backward_input > 0);
    CHECK(c.backward_weight > 0);
  }
  for (const ParameterInfo& info : probe.parameter_info())  // measuring left no gradient
    for (float g : probe.gradient(info.name)) CHECK(g == 0);

  const Schedule searched = search_schedule(4, m, {.costs = costs, .max_stashes = {4}});
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, SearchedSchedule> trainer(
      backend, {.micro_batches = m, .seed = 2, .schedule = searched});
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, GPipe> gpipe_trainer(
      backend, {.micro_batches = m, .seed = 2});
  CHECK(trainer.schedule() == searched);
  const float loss = trainer.forward_backward(x, y);
  CHECK(loss == doctest::Approx(gpipe_trainer.forward_backward(x, y)).epsilon(1e-6));
  for (const ParameterInfo& info : trainer.parameter_info()) {
    CAPTURE(info.name);
    const std::vector<float> a = trainer.gradient(info.name), b = gpipe_trainer.gradient(info.name);
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5).scale(1e-6));
  }
}

TEST_CASE("Options::schedule of another shape than the trainer's is an Error") {
  host::Backend backend(4);
  using T = Trainer<Model4, SoftmaxCrossEntropy, host::Backend, SearchedSchedule>;
  CHECK_THROWS_AS(T(backend, {.micro_batches = 3, .schedule = make_zb_h1_schedule(4, 4)}), Error);
  CHECK_THROWS_AS(T(backend, {.micro_batches = 3, .schedule = make_zb_h1_schedule(2, 3)}), Error);
  CHECK_THROWS_AS(T(backend, {.micro_batches = 3, .schedule = make_interleaved_schedule(4, 2, 3)}),
                  Error);
  // an invalid list (a forward missing) is refused by the validator
  Schedule broken = make_zb_h1_schedule(4, 3);
  broken.ops[0].erase(broken.ops[0].begin());
  CHECK_THROWS_AS(T(backend, {.micro_batches = 3, .schedule = broken}), Error);
}
