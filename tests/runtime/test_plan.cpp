// gpipe::plan: choose_plan on costs given by hand (the fastest candidate that fits, the limits
// honoured, an Error naming the smallest bound when nothing fits), and the whole planner on the
// host backend under a cap: the trainer built from the plan in one line stays within the
// predicted bound, which stays within the limit. Then the same for a model of twice as many
// stages as devices (the two-chunk schedules, with a policy per device and per stage), and the
// device counts the planner refuses.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/plan.hpp"
#include "support/models.hpp"
#include "support/relative_error.hpp"

using namespace gpipe;
using namespace gpipe::test;

namespace {

constexpr std::size_t rows = 32;
const std::vector<Remat> all_policies = {Remat::never, Remat::selective, Remat::except_last,
                                         Remat::always};

// Costs that grow with the micro-batch's rows plus a fixed cost per op; recomputing adds the
// forward to B, recomputing the cheap layers a quarter of it. Device 1 is 50% slower, so that the
// searched schedule has something to find.
std::vector<PlanCosts> hand_costs() {
  std::vector<PlanCosts> out;
  for (std::size_t m : {1, 2, 4, 8, 16}) {
    PlanCosts c;
    c.micro_batches = m;
    for (std::size_t d = 0; d < Model3::num_stages; ++d) {
      const double scale = d == 1 ? 1.5 : 1.0;
      const double f = scale * (20.0 + 10.0 * static_cast<double>(rows / m));
      c.never.push_back({.forward = f, .backward_input = f, .backward_weight = f});
      c.always.push_back({.forward = f, .backward_input = 2 * f, .backward_weight = f});
      c.selective.push_back({.forward = f, .backward_input = 1.25 * f, .backward_weight = f});
    }
    out.push_back(c);
  }
  return out;
}

std::size_t smallest_peak(const Plan& plan, bool (*keep)(const PlanCandidate&)) {
  std::size_t best = std::numeric_limits<std::size_t>::max();
  for (const PlanCandidate& c : plan.candidates)
    if (keep(c)) best = std::min(best, c.peak_bytes);
  return best;
}

}  // namespace

TEST_CASE("without a limit the plan is the fastest candidate, and every other one is slower") {
  const std::vector<PlanCosts> costs = hand_costs();
  const Plan plan = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, all_policies);
  CHECK(plan.candidates.size() == costs.size() * all_policies.size() * 5);
  CHECK(plan.chosen.verdict == "chosen");
  CHECK(plan.chosen.remat == Remat::never);  // recomputing only costs time here
  std::size_t chosen = 0;
  for (const PlanCandidate& c : plan.candidates) {
    CHECK(c.fits);
    CHECK(c.predicted_us >= plan.chosen.predicted_us);
    if (c.verdict == "chosen") {
      ++chosen;
    } else {
      CHECK(c.verdict.starts_with("not faster: "));
    }
  }
  CHECK(chosen == 1);
  CHECK(plan.schedule.num_micro_batches == plan.chosen.micro_batches);
  CHECK(validate(plan.schedule).ok);
  // the prediction is the simulation of the chosen schedule with the costs of its policy
  for (const PlanCosts& c : costs)
    if (c.micro_batches == plan.chosen.micro_batches)
      CHECK(plan.chosen.predicted_us == simulate(plan.schedule, c.never).makespan);
  CHECK(plan.describe().starts_with("plan: "));
  // each policy's candidates are simulated with its own costs: selective's B lies between
  // never's and always's, and so does its step, schedule by schedule
  auto step = [&](const PlanCandidate& like, Remat remat) {
    for (const PlanCandidate& c : plan.candidates)
      if (c.schedule == like.schedule && c.micro_batches == like.micro_batches && c.remat == remat)
        return c.predicted_us;
    FAIL("no such candidate");
    return 0.0;
  };
  for (const PlanCandidate& c : plan.candidates) {
    if (c.remat != Remat::selective || c.schedule == "searched") continue;
    CAPTURE(c.schedule);
    CAPTURE(c.micro_batches);
    CHECK(step(c, Remat::never) < c.predicted_us);
    CHECK(c.predicted_us < step(c, Remat::always));
  }
}

TEST_CASE("costs of devices that share cores: every candidate is timed on the shared cores") {
  // the same costs with PlanCosts::cores 1 (3 devices on one core) and 2: each candidate's
  // step is simulate_on_cores', at least all its work on that many cores
  for (const double cores : {1.0, 2.0}) {
    std::vector<PlanCosts> costs = hand_costs();
    for (PlanCosts& c : costs) c.cores = cores;
    const Plan plan = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, all_policies);
    const Plan alone =
        choose_plan<Model3>(rows, hand_costs(), std::vector<std::size_t>{}, all_policies);
    REQUIRE(plan.candidates.size() == alone.candidates.size());
    bool slower = false;  // some candidate loses time to the shared cores
    for (std::size_t i = 0; i < plan.candidates.size(); ++i) {
      const PlanCandidate& c = plan.candidates[i];
      if (c.schedule == "searched") continue;  // searched from costs: not the same schedule
      CAPTURE(c.schedule);
      CAPTURE(c.micro_batches);
      CHECK(c.predicted_us >= alone.candidates[i].predicted_us);
      slower = slower || c.predicted_us > alone.candidates[i].predicted_us;
      double work = 0;
      for (const PlanCosts& pc : costs)
        if (pc.micro_batches == c.micro_batches)
          for (const OpCosts& o : detail::costs_of(pc, c.remat))
            work += static_cast<double>(c.micro_batches) *
                    (o.forward + o.backward_input + o.backward_weight);
      CHECK(c.predicted_us >= work / cores * (1 - 1e-12));
    }
    CHECK(slower);
    for (const PlanCosts& c : costs)
      if (c.micro_batches == plan.chosen.micro_batches && plan.chosen.uniform())
        CHECK(plan.chosen.predicted_us ==
              simulate_on_cores(plan.schedule, detail::costs_of(c, plan.chosen.remat), cores)
                  .makespan);
  }
}

TEST_CASE("selective keeps less than never and more than always; a limit between picks it") {
  // Model3 has cheap layers in stages 1 and 2 (GELU, the residual body's GELU), not in stage 0,
  // whose ReLU is its last layer.
  static_assert(Model3::stage_t<0>::cheap_stash_per_row == 0);
  static_assert(Model3::stage_t<1>::cheap_stash_per_row > 0);
  const std::vector<PlanCosts> costs = hand_costs();
  const Plan free = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, all_policies);
  auto peak_of = [&](const std::string& schedule, std::size_t m, Remat remat) {
    for (const PlanCandidate& c : free.candidates)
      if (c.schedule == schedule && c.micro_batches == m && c.remat == remat)
        return c.memory[1].activations_peak;
    FAIL("no such candidate");
    return std::size_t{0};
  };
  // (with M = 1 the one micro-batch rebuilds all it dropped before its B: no saving)
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"})
    for (std::size_t m : {4u, 16u}) {
      CAPTURE(schedule);
      CAPTURE(m);
      CHECK(peak_of(schedule, m, Remat::selective) < peak_of(schedule, m, Remat::never));
      CHECK(peak_of(schedule, m, Remat::always) < peak_of(schedule, m, Remat::selective));
    }
  // only never and selective weighed, under a limit that no never candidate fits but a selective
  // one does: the plan recomputes the cheap layers
  const std::vector<Remat> two = {Remat::never, Remat::selective};
  const Plan both = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, two);
  const std::size_t never_min =
      smallest_peak(both, [](const PlanCandidate& c) { return c.remat == Remat::never; });
  const std::size_t selective_min =
      smallest_peak(both, [](const PlanCandidate& c) { return c.remat == Remat::selective; });
  REQUIRE(selective_min < never_min);
  const Plan plan = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{never_min - 1}, two);
  // selective where never does not fit (with a policy per stage, never stays where it fits)
  CHECK(std::ranges::count(plan.chosen.stage_remat, Remat::selective) > 0);
  CHECK(plan.chosen.peak_bytes < never_min);
}

TEST_CASE("a limit below every Remat::never candidate makes the plan recompute, within the limit") {
  const std::vector<PlanCosts> costs = hand_costs();
  const Plan free = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, all_policies);
  const std::size_t never_min =
      smallest_peak(free, [](const PlanCandidate& c) { return c.remat == Remat::never; });
  const std::size_t any_min = smallest_peak(free, [](const PlanCandidate&) { return true; });
  REQUIRE(any_min < never_min);  // recomputing saves memory on this model
  const std::vector<std::size_t> limit = {never_min - 1};
  const Plan plan = choose_plan<Model3>(rows, costs, limit, all_policies);
  CHECK(std::ranges::count(plan.chosen.stage_remat, Remat::never) < 3);
  CHECK(plan.chosen.peak_bytes <= limit[0]);
  for (const PlanCandidate& c : plan.candidates) {
    CHECK(c.fits == (c.peak_bytes <= limit[0]));
    if (!c.fits) CHECK(c.verdict.starts_with("over memory: device "));
    if (c.fits) CHECK(c.predicted_us >= plan.chosen.predicted_us);
  }
}

TEST_CASE("a limit that forbids never on stage 0 only: recompute there, never on the last stage") {
  // 1F1B's stage d holds K - d micro-batches' stashes: with device 0 capped below what never
  // needs there under every candidate, and the others free, the plan recomputes on stage 0 only,
  // which is faster than any policy on every stage that fits.
  const std::vector<PlanCosts> costs = hand_costs();
  const Plan free = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, all_policies);
  std::size_t never0 = std::numeric_limits<std::size_t>::max();
  for (const PlanCandidate& c : free.candidates)
    if (c.remat == Remat::never && c.uniform())
      never0 = std::min(never0, c.memory[0].total_bound());
  const std::vector<std::size_t> limit = {never0 - 1, 0, 0};
  const Plan plan = choose_plan<Model3>(rows, costs, limit, all_policies);
  CAPTURE(plan.describe());
  REQUIRE(plan.chosen.stage_remat.size() == 3);
  CHECK(plan.chosen.stage_remat[0] != Remat::never);
  CHECK(plan.chosen.stage_remat[0] != Remat::selective);  // stage 0 has no cheap layers
  CHECK(plan.chosen.stage_remat[1] == Remat::never);
  CHECK(plan.chosen.stage_remat[2] == Remat::never);
  CHECK_FALSE(plan.chosen.uniform());
  CHECK(plan.chosen.remat == plan.chosen.stage_remat[0]);
  CHECK(plan.describe().find("remat " + plan.chosen.policies() + ":") != std::string::npos);
  CHECK(plan.chosen.policies() ==
        std::string(to_string(plan.chosen.stage_remat[0])) + "/never/never");
  // faster than every uniform candidate that fits
  for (const PlanCandidate& c : plan.candidates) {
    if (!c.uniform() || !c.fits) continue;
    CAPTURE(c.schedule);
    CAPTURE(c.micro_batches);
    CAPTURE(c.policies());
    CHECK(plan.chosen.predicted_us < c.predicted_us);
  }
  // the prediction is the simulation with each device's costs under its own policy
  for (const PlanCosts& c : costs) {
    if (c.micro_batches != plan.chosen.micro_batches) continue;
    const auto m = static_cast<double>(c.micro_batches);
    std::vector<OpCosts> mixed;
    for (std::size_t d = 0; d < 3; ++d) {
      switch (plan.chosen.stage_remat[d]) {
        case Remat::always:
          mixed.push_back(c.always[d]);
          break;
        case Remat::except_last:  // all but the last micro-batch recompute
          mixed.push_back(c.never[d]);
          mixed.back().backward_input =
              ((m - 1) * c.always[d].backward_input + c.never[d].backward_input) / m;
          break;
        case Remat::selective:
          mixed.push_back(c.selective[d]);
          break;
        default:
          mixed.push_back(c.never[d]);
      }
    }
    CHECK(plan.chosen.predicted_us == doctest::Approx(simulate(plan.schedule, mixed).makespan));
  }

  // the trainer built from the plan runs each stage under its policy: measured peak <= predicted
  // <= limit on every device, the same loss and gradients as the unplanned GPipe trainer
  const std::vector<float> x = random_inputs(rows, Model3::in_features, 5);
  const std::vector<std::int32_t> y = random_classes(rows, Model3::out_features, 6);
  host::Backend backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend, SearchedSchedule> trainer(backend, plan);
  CHECK(trainer.options().stage_remat == plan.chosen.stage_remat);
  backend.reset_peak();
  const float loss = trainer.forward_backward(x, y);
  for (std::size_t d = 0; d < 3; ++d) {
    CAPTURE(d);
    const MemoryStats stats = backend.memory_stats(d);
    CHECK(stats.peak_of(MemoryKind::activations) == plan.chosen.memory[d].activations_peak);
    CHECK(stats.peak <= plan.chosen.memory[d].total_bound());
    if (limit[d] != 0) CHECK(plan.chosen.memory[d].total_bound() <= limit[d]);
  }
  host::Backend plain_backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> plain(plain_backend, {.micro_batches = 1});
  CHECK(plain.forward_backward(x, y) == doctest::Approx(loss).epsilon(1e-5));
  for (const ParameterInfo& p : plain.parameter_info()) {
    CAPTURE(p.name);
    CHECK(relative_error(trainer.gradient(p.name), plain.gradient(p.name)) < 2e-6);
  }
}

TEST_CASE("predict_step_us: a plan's prediction again from its costs, overhead on every op") {
  std::vector<PlanCosts> costs = hand_costs();
  for (PlanCosts& c : costs) c.overhead_us = 5;
  const Plan plan = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, all_policies);
  CAPTURE(plan.describe());
  const auto at_m = std::ranges::find(costs, plan.chosen.micro_batches, &PlanCosts::micro_batches);
  REQUIRE(at_m != costs.end());
  CHECK(predict_step_us(plan.schedule, *at_m, plan.chosen.stage_remat) == plan.chosen.predicted_us);
  // by hand: never's costs on every stage, each op 5 us longer
  const std::vector<Remat> never(3, Remat::never);
  std::vector<OpCosts> slower = at_m->never;
  for (OpCosts& o : slower) {
    o.forward += 5;
    o.backward_input += 5;
    o.backward_weight += 5;
  }
  CHECK(predict_step_us(plan.schedule, *at_m, never) ==
        doctest::Approx(simulate(plan.schedule, slower).makespan));
  // costs at another micro-batch count, a policy list of another length
  const auto other = std::ranges::find_if(
      costs, [&](const PlanCosts& c) { return c.micro_batches != plan.chosen.micro_batches; });
  REQUIRE(other != costs.end());
  CHECK_THROWS_AS(predict_step_us(plan.schedule, *other, never), Error);
  CHECK_THROWS_AS(predict_step_us(plan.schedule, *at_m, std::vector<Remat>(2, Remat::never)),
                  Error);
}

TEST_CASE("a limit that nothing fits is an Error naming the smallest bound") {
  const std::vector<PlanCosts> costs = hand_costs();
  const Plan free = choose_plan<Model3>(rows, costs, std::vector<std::size_t>{}, all_policies);
  const std::size_t any_min = smallest_peak(free, [](const PlanCandidate&) { return true; });
  const std::vector<std::size_t> limit = {any_min - 1};
  try {
    (void)choose_plan<Model3>(rows, costs, limit, all_policies);
    FAIL("expected gpipe::Error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("needs up to " + std::to_string(any_min) + " bytes") !=
          std::string::npos);
  }
  // costs for more micro-batches than the batch has samples
  std::vector<PlanCosts> too_many = costs;
  too_many.back().micro_batches = rows + 1;
  CHECK_THROWS_AS(choose_plan<Model3>(rows, too_many, std::vector<std::size_t>{}, all_policies),
                  Error);
  // limits for neither 1 nor K devices
  CHECK_THROWS_AS(choose_plan<Model3>(rows, costs, std::vector<std::size_t>{1, 2}, all_policies),
                  Error);
}

TEST_CASE("the planner on a capped host backend: the plan's trainer stays within its bound") {
  const std::vector<float> x = random_inputs(rows, Model3::in_features, 5);
  const std::vector<std::int32_t> y = random_classes(rows, Model3::out_features, 6);
  // the limit: below what Remat::never needs at M = 1 (the whole batch's activations at once)
  const std::vector<PlanCosts> probe = hand_costs();
  const Plan free = choose_plan<Model3>(rows, probe, std::vector<std::size_t>{}, all_policies);
  std::size_t never_m1 = 0;
  for (const PlanCandidate& c : free.candidates)
    if (c.remat == Remat::never && c.micro_batches == 1 && c.schedule == "gpipe")
      never_m1 = c.peak_bytes;
  REQUIRE(never_m1 > 0);
  const std::size_t limit = never_m1 - 1;
  host::Backend backend(3, {.device_capacity = limit});

  const Plan plan = gpipe::plan<Model3, SoftmaxCrossEntropy>(
      backend, x, y, {.micro_batches = {1, 2, 4, 8}, .measure_steps = 1});
  CAPTURE(plan.describe());
  CHECK(plan.chosen.peak_bytes <= limit);
  CHECK(plan.chosen.predicted_us > 0);
  const bool never_m1_gpipe = plan.chosen.micro_batches == 1 &&
                              plan.chosen.stage_remat == std::vector<Remat>(3, Remat::never) &&
                              plan.chosen.schedule == "gpipe";
  CHECK_FALSE(never_m1_gpipe);

  Trainer<Model3, SoftmaxCrossEntropy, host::Backend, SearchedSchedule> trainer(backend, plan);
  CHECK(trainer.schedule() == plan.schedule);
  backend.reset_peak();
  const float loss = trainer.forward_backward(x, y);
  CHECK(loss > 0);
  for (std::size_t d = 0; d < 3; ++d) {
    CAPTURE(d);
    CHECK(backend.memory_stats(d).peak <= plan.chosen.memory[d].total_bound());
    CHECK(plan.chosen.memory[d].total_bound() <= limit);
  }
  // the same loss as the unplanned GPipe trainer (the plan changes the order, not the math)
  host::Backend plain_backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> plain(plain_backend, {.micro_batches = 1});
  CHECK(plain.forward_backward(x, y) == doctest::Approx(loss).epsilon(1e-5));
}

TEST_CASE(
    "the planner refuses micro-batch counts the batch cannot split into, and no measurement") {
  const std::vector<float> x = random_inputs(rows, Model3::in_features, 5);
  const std::vector<std::int32_t> y = random_classes(rows, Model3::out_features, 6);
  host::Backend backend(3);
  auto plan_with = [&](std::size_t m) {
    return gpipe::plan<Model3, SoftmaxCrossEntropy>(backend, x, y, {.micro_batches = {m}});
  };
  CHECK_THROWS_AS(plan_with(0), Error);
  CHECK_THROWS_AS(plan_with(rows + 1), Error);
  // and measurements of no step or no round
  auto measuring = [&](std::size_t steps, std::size_t rounds) {
    return gpipe::plan<Model3, SoftmaxCrossEntropy>(
        backend, x, y, {.micro_batches = {2}, .measure_steps = steps, .measure_rounds = rounds});
  };
  CHECK_THROWS_WITH_AS(measuring(0, 1), doctest::Contains("must be at least 1"), Error);
  CHECK_THROWS_WITH_AS(measuring(1, 0), doctest::Contains("must be at least 1"), Error);
}

namespace {

// y = x, whose forward calls (counted in forward_calls from 0) numbered in [slow_from, slow_to)
// each sleep slow_ms first: a stretch of time in which the machine is busy with other work.
inline std::atomic<std::size_t> forward_calls{0}, slow_from{0}, slow_to{0};
constexpr int slow_ms = 6;
struct SlowedIdentity : ParameterFree {
  static constexpr std::size_t in_features = 4, out_features = 4;
  static constexpr std::size_t stash_per_row = 0, grad_stash_per_row = 0;
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    const std::size_t call = forward_calls++;
    if (call >= slow_from && call < slow_to)
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
    ctx.copy(a.rows * 4, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 4, a.dy, a.dx);
  }
};
using SlowedModel = Pipeline<Stage<Linear<4, 4>, SlowedIdentity>, Stage<Linear<4, 3>>>;

}  // namespace

TEST_CASE("the planner's measurement rounds: one slow round moves no op cost") {
  const std::vector<float> x = random_inputs(rows, 4, 3);
  const std::vector<std::int32_t> y = random_classes(rows, 3, 4);
  host::Backend backend(2);
  const std::vector<Remat> policies = {Remat::never, Remat::always};
  const auto measure = [&](std::size_t rounds) {
    forward_calls = 0;
    return measure_plan_costs<SlowedModel, SoftmaxCrossEntropy>(
        backend, x, y,
        {.micro_batches = {2, 4}, .remat = policies, .measure_steps = 1, .measure_rounds = rounds});
  };
  // the forward calls of one round: every count and policy, a warm-up and a step each
  slow_from = slow_to = 0;
  measure(1);
  const std::size_t per_round = forward_calls;
  REQUIRE(per_round > 0);
  // stage 0's forward under never and always at each count (at least slow_ms where it slept)
  const auto stage0_forwards = [](const std::vector<PlanCosts>& costs) {
    std::vector<double> out;
    for (const PlanCosts& c : costs)
      out.insert(out.end(), {c.never[0].forward, c.always[0].forward});
    return out;
  };
  const double slow_us = 1000.0 * slow_ms;

  // one round, slow throughout: what the slow calls cost
  slow_from = 0;
  slow_to = per_round;
  for (double f : stage0_forwards(measure(1))) CHECK(f >= slow_us);

  // three rounds, the middle one slow: every median is a quick round's (a mean would carry a
  // third of the sleep)
  slow_from = per_round;
  slow_to = 2 * per_round;
  const std::vector<PlanCosts> costs = measure(3);
  CHECK(forward_calls == 3 * per_round);  // the rounds ran every configuration, each as often
  REQUIRE(costs.size() == 2);
  for (double f : stage0_forwards(costs)) CHECK(f < slow_us / 6);
  slow_from = slow_to = 0;
}

TEST_CASE(
    "with Remat::offload weighed, a limit that forbids never picks offload at never's speed") {
  // Deep stages on K 4, whose stashes offload moves off the device where two ops or more run
  // between a micro-batch's F and its B (a 1F1B stage s < 3 runs 3 - s forwards there; the last
  // stage keeps its stashes). Offload's ops cost never's (its copies beside the compute);
  // recomputing costs time: under a limit below every never candidate, offload wins.
  using Deep6 = repeat_stage_t<Linear<16, 16>, 6>;
  using Deep = Pipeline<Deep6, Deep6, Deep6, Stage<ReLU, Linear<16, 4>>>;
  std::vector<PlanCosts> costs;
  for (std::size_t m : {4, 8}) {
    PlanCosts c;
    c.micro_batches = m;
    for (std::size_t d = 0; d < 4; ++d) {
      const double f = 20.0 + 10.0 * static_cast<double>(rows / m);
      c.never.push_back({.forward = f, .backward_input = f, .backward_weight = f});
      c.always.push_back({.forward = f, .backward_input = 2 * f, .backward_weight = f});
    }
    c.offload = c.never;
    costs.push_back(c);
  }
  const std::vector<Remat> policies = {Remat::never, Remat::always, Remat::offload};
  const Plan free = choose_plan<Deep>(rows, costs, std::vector<std::size_t>{}, policies);
  const std::size_t never_min =
      smallest_peak(free, [](const PlanCandidate& c) { return c.remat == Remat::never; });
  const std::size_t offload_min =
      smallest_peak(free, [](const PlanCandidate& c) { return c.remat == Remat::offload; });
  REQUIRE(offload_min < never_min);
  const Plan plan =
      choose_plan<Deep>(rows, costs, std::vector<std::size_t>{never_min - 1}, policies);
  CHECK(plan.chosen.remat == Remat::offload);
  CHECK(plan.chosen.peak_bytes < never_min);
  std::size_t host = 0;
  for (const DeviceMemoryPrediction& p : plan.chosen.memory) host += p.offloaded;
  CHECK(host > 0);  // what left the devices is held in host memory
}

TEST_CASE("plan on the host backend leaves Remat::offload out") {
  host::Backend backend(Model3::num_stages);
  const std::vector<float> x = random_inputs(rows, Model3::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, Model3::out_features, 2);
  const Plan plan = gpipe::plan<Model3, SoftmaxCrossEntropy>(
      backend, x, y, {.micro_batches = {2, 4}, .measure_steps = 1});
  CHECK(!plan.candidates.empty());
  for (const PlanCandidate& c : plan.candidates) CHECK(c.remat != Remat::offload);
}

namespace {

// Model4's 4 stages on 2 devices: the costs of hand_costs' shape per stage, stage 3 twice as
// slow (on device 1 round robin, on device 0 in a V), so that the per-stage costs matter.
std::vector<PlanCosts> two_chunk_costs() {
  std::vector<PlanCosts> out;
  for (std::size_t m : {1, 2, 4, 8}) {
    PlanCosts c;
    c.micro_batches = m;
    c.num_devices = 2;
    for (std::size_t s = 0; s < Model4::num_stages; ++s) {
      const double scale = s == 3 ? 2.0 : 1.0;
      const double f = scale * (20.0 + 10.0 * static_cast<double>(rows / m));
      c.never.push_back({.forward = f, .backward_input = f, .backward_weight = f});
      c.always.push_back({.forward = f, .backward_input = 2 * f, .backward_weight = f});
      c.selective.push_back({.forward = f, .backward_input = 1.25 * f, .backward_weight = f});
    }
    out.push_back(c);
  }
  return out;
}

bool two_chunk_kind(const std::string& name) {
  return name == "interleaved-2" || name == "looped-bfs-2" || name == "zb-v" ||
         name == "dualpipe-v";
}

}  // namespace

// Device 0 free, device 1 capped one byte below the least it needs under Remat::never on all
// its stages, over every two-chunk schedule and M of `costs`.
std::vector<std::size_t> limit_below_never_on_device_1(const std::vector<PlanCosts>& costs) {
  const Plan free = choose_plan<Model4>(rows, costs, std::vector<std::size_t>{}, all_policies);
  std::size_t never1 = std::numeric_limits<std::size_t>::max();
  for (const PlanCandidate& c : free.candidates)
    if (c.remat == Remat::never && c.uniform())
      never1 = std::min(never1, c.memory[1].total_bound());
  return {0, never1 - 1};
}

TEST_CASE("a model of 2K stages on K devices: the two-chunk schedules, simulated per stage") {
  const std::vector<PlanCosts> costs = two_chunk_costs();
  const Plan plan = choose_plan<Model4>(rows, costs, std::vector<std::size_t>{}, all_policies);
  // per count: interleaved-2, looped-bfs-2, zb-v, and dualpipe-v from M = 2K = 4 on
  std::size_t expected = 0;
  for (const PlanCosts& c : costs) expected += all_policies.size() * (c.micro_batches >= 4 ? 4 : 3);
  CHECK(plan.candidates.size() == expected);
  for (const PlanCandidate& c : plan.candidates) {
    CAPTURE(c.schedule);
    CHECK(two_chunk_kind(c.schedule));
    CHECK((c.schedule != "dualpipe-v" || c.micro_batches >= 4));
    CHECK(c.stage_remat.size() == 4);
    CHECK(c.memory.size() == 2);
    CHECK(c.predicted_us >= plan.chosen.predicted_us);
  }
  CHECK(plan.chunks_per_device() == 2);
  CHECK(plan.schedule.num_devices == 2);
  CHECK(validate(plan.schedule).ok);
  // the prediction is the simulation with each stage's own costs, which the costs of the
  // stages' devices (stage 3's device taken as slow as stage 3 on both its stages) would not be
  for (const PlanCosts& c : costs) {
    if (c.micro_batches != plan.chosen.micro_batches) continue;
    CHECK(plan.chosen.predicted_us == simulate(plan.schedule, c.never).makespan);
    std::vector<OpCosts> per_device(2, c.never[0]);
    per_device[plan.schedule.device_of_stage(3)] = c.never[3];
    CHECK(simulate(plan.schedule, per_device).makespan > plan.chosen.predicted_us);
  }
  // deterministic: the same costs give the same plan
  const Plan again = choose_plan<Model4>(rows, costs, std::vector<std::size_t>{}, all_policies);
  CHECK(again.schedule == plan.schedule);
  CHECK(again.describe() == plan.describe());
}

TEST_CASE("a model of 2K stages: a limit forbidding never on one device mixes per device") {
  // device 1 capped below what it needs under Remat::never with every schedule and M, device 0
  // free: device 1 recomputes, and a mix keeps everything on device 0
  const std::vector<PlanCosts> costs = two_chunk_costs();
  const std::vector<std::size_t> limit = limit_below_never_on_device_1(costs);
  const Plan plan = choose_plan<Model4>(rows, costs, limit, all_policies);
  CAPTURE(plan.describe());
  CHECK(plan.chosen.memory[1].total_bound() <= limit[1]);
  REQUIRE(plan.chosen.stage_remat.size() == 4);
  std::size_t kept = 0;  // device 1's stages under never
  for (std::size_t s = 0; s < 4; ++s)
    if (plan.schedule.device_of_stage(s) == 1 && plan.chosen.stage_remat[s] == Remat::never) ++kept;
  CHECK(kept < 2);
  // the mixes of a policy per device (those of a policy per stage: the next test case): device
  // 1's memory is the uniform candidate's of its policy (a device's memory depends on its own
  // stages' policies), and the step no longer than that candidate's (device 0 does no more work)
  std::size_t mixes = 0;
  for (const PlanCandidate& c : plan.candidates) {
    if (c.uniform() || !c.fits) continue;
    CAPTURE(c.schedule);
    CAPTURE(c.micro_batches);
    CAPTURE(c.policies());
    const Schedule placement = c.schedule == "zb-v" || c.schedule == "dualpipe-v"
                                   ? ZeroBubbleV::make(2, c.micro_batches)
                                   : Interleaved<2>::make(2, c.micro_batches);
    Remat on[2] = {};
    for (std::size_t s = 0; s < 4; ++s) on[placement.device_of_stage(s)] = c.stage_remat[s];
    bool per_device = true;
    for (std::size_t s = 0; s < 4; ++s)
      per_device = per_device && c.stage_remat[s] == on[placement.device_of_stage(s)];
    if (!per_device || on[0] != Remat::never) continue;
    ++mixes;
    std::size_t uniform = 0;
    for (const PlanCandidate& u : plan.candidates)
      if (u.uniform() && u.remat == on[1] && u.schedule == c.schedule &&
          u.micro_batches == c.micro_batches) {
        ++uniform;
        CHECK(u.memory[1].total_bound() == c.memory[1].total_bound());
        CHECK(c.predicted_us <= u.predicted_us);
      }
    CHECK(uniform == 1);
  }
  CHECK(mixes > 0);
}

namespace {

// The ops of a two-chunk schedule by its name, for Model4 on 2 devices.
Schedule two_chunk_schedule(const std::string& name, std::size_t m) {
  if (name == "interleaved-2") return Interleaved<2>::make(2, m);
  if (name == "looped-bfs-2") return LoopedBFS<2>::make(2, m);
  if (name == "zb-v") return ZeroBubbleV::make(2, m);
  return DualPipeV::make(2, m);
}

// Whether some device of `schedule` runs its two stages under different policies.
bool splits_a_device(const Schedule& schedule, const std::vector<Remat>& stage_remat) {
  for (std::size_t d = 0; d < schedule.num_devices; ++d)
    if (stage_remat[schedule.stage_of(d, 0)] != stage_remat[schedule.stage_of(d, 1)]) return true;
  return false;
}

}  // namespace

TEST_CASE(
    "a model of 2K stages: a policy per stage (the device's chunks apart) beats every uniform "
    "candidate and every policy per device, and fits") {
  // Device 1 capped 1 byte below the least it needs under Remat::never on both its stages (over
  // every schedule and M): a policy per device recomputes both of its stages, a policy per stage
  // only the one whose stash saves the bytes. Every assignment of a policy to each stage, at
  // every schedule and M, weighed here by brute force: the planner's choice fits, splits a
  // device, and is faster than any uniform or per-device assignment that fits.
  const std::vector<PlanCosts> costs = two_chunk_costs();
  const std::vector<std::size_t> limit = limit_below_never_on_device_1(costs);
  const Plan plan = choose_plan<Model4>(rows, costs, limit, all_policies);
  CAPTURE(plan.describe());

  double best_uniform = std::numeric_limits<double>::max();     // one policy for all stages
  double best_per_device = std::numeric_limits<double>::max();  // a device's stages share one
  double best_per_stage = std::numeric_limits<double>::max();   // any
  for (const PlanCosts& c : costs)
    for (const std::string name : {"interleaved-2", "looped-bfs-2", "zb-v", "dualpipe-v"}) {
      if (name == "dualpipe-v" && c.micro_batches < 4) continue;
      const Schedule schedule = two_chunk_schedule(name, c.micro_batches);
      for (std::size_t code = 0; code < 256; ++code) {  // 4 stages, 4 policies each
        std::vector<Remat> stage_remat;
        for (std::size_t s = 0; s < 4; ++s)
          stage_remat.push_back(all_policies[(code >> 2 * s) & 3]);
        const std::vector<DeviceMemoryPrediction> memory =
            predict_memory<Model4>(schedule, rows, stage_remat, 2, 4);
        if (memory[1].total_bound() > limit[1]) continue;
        const double t =
            simulate(schedule, detail::costs_of(c, std::span<const Remat>(stage_remat))).makespan;
        best_per_stage = std::min(best_per_stage, t);
        if (splits_a_device(schedule, stage_remat)) continue;
        best_per_device = std::min(best_per_device, t);
        if (std::ranges::count(stage_remat, stage_remat[0]) == 4)
          best_uniform = std::min(best_uniform, t);
      }
    }
  REQUIRE(best_per_stage < best_per_device);  // the case this test is about exists
  CHECK(best_per_device <= best_uniform);
  CHECK(plan.chosen.predicted_us < best_per_device);
  CHECK(plan.chosen.predicted_us >= best_per_stage);
  CHECK(splits_a_device(plan.schedule, plan.chosen.stage_remat));
  CHECK(plan.chosen.fits);
  CHECK(plan.chosen.memory[1].total_bound() <= limit[1]);
  // every candidate's memory is predict_memory's for its policies, and its verdict follows it
  for (const PlanCandidate& c : plan.candidates) {
    CAPTURE(c.schedule);
    CAPTURE(c.micro_batches);
    CAPTURE(c.policies());
    const std::vector<DeviceMemoryPrediction> memory = predict_memory<Model4>(
        two_chunk_schedule(c.schedule, c.micro_batches), rows, c.stage_remat, 2, 4);
    CHECK(c.memory[1].total_bound() == memory[1].total_bound());
    CHECK(c.fits == (memory[1].total_bound() <= limit[1]));
  }

  // the trainer built from the plan runs each stage under its policy: measured peak <= predicted
  // <= limit on every device, and the unpipelined model's loss and gradients
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 9);
  const std::vector<std::int32_t> y = random_classes(rows, Model4::out_features, 10);
  host::Backend backend(2);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, PlannedSchedule<2>> trainer(backend, plan);
  CHECK(trainer.options().stage_remat == plan.chosen.stage_remat);
  backend.reset_peak();
  const float loss = trainer.forward_backward(x, y);
  for (std::size_t d = 0; d < 2; ++d) {
    CAPTURE(d);
    const MemoryStats stats = backend.memory_stats(d);
    CHECK(stats.peak_of(MemoryKind::activations) == plan.chosen.memory[d].activations_peak);
    CHECK(stats.peak <= plan.chosen.memory[d].total_bound());
  }
  host::Backend one_device(1);
  Trainer<Model1, SoftmaxCrossEntropy, host::Backend> plain(one_device, {.micro_batches = 1});
  CHECK(plain.forward_backward(x, y) == doctest::Approx(loss).epsilon(1e-5));
  for (const ParameterInfo& p : plain.parameter_info()) {
    CAPTURE(p.name);
    CHECK(relative_error(trainer.gradient(p.name), plain.gradient(p.name)) < 2e-6);
  }
}

TEST_CASE("a model of 2K stages: a limit that nothing fits is an Error naming the smallest bound") {
  const std::vector<PlanCosts> costs = two_chunk_costs();
  const Plan free = choose_plan<Model4>(rows, costs, std::vector<std::size_t>{}, all_policies);
  const std::size_t any_min = smallest_peak(free, [](const PlanCandidate&) { return true; });
  const std::string need = "needs up to " + std::to_string(any_min) + " bytes";
  CHECK_THROWS_WITH_AS(
      choose_plan<Model4>(rows, costs, std::vector<std::size_t>{any_min - 1}, all_policies),
      doctest::Contains(need.c_str()), Error);
  // costs for 3 devices: Model4 has neither 3 stages nor 6
  std::vector<PlanCosts> three = costs;
  for (PlanCosts& c : three) c.num_devices = 3;
  CHECK_THROWS_WITH_AS(choose_plan<Model4>(rows, three, std::vector<std::size_t>{}, all_policies),
                       doctest::Contains("costs are for 3 devices, and the model has 4 stages"),
                       Error);
}

TEST_CASE(
    "the planner on 2 capped devices for 4 stages: a two-chunk plan, within its bound, "
    "with the unpipelined model's gradients") {
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 7);
  const std::vector<std::int32_t> y = random_classes(rows, Model4::out_features, 8);
  // the limit: below what every two-chunk schedule needs under Remat::never at M = 1
  const Plan free =
      choose_plan<Model4>(rows, two_chunk_costs(), std::vector<std::size_t>{}, all_policies);
  const std::size_t never_m1 = smallest_peak(free, [](const PlanCandidate& c) {
    return c.remat == Remat::never && c.uniform() && c.micro_batches == 1;
  });
  const std::size_t limit = never_m1 - 1;
  host::Backend backend(2, {.device_capacity = limit});
  const PlanOptions options = {.micro_batches = {1, 2, 4, 8}, .measure_steps = 1};

  // the two halves of gpipe::plan: costs per stage, then the same choice twice
  const std::vector<PlanCosts> costs =
      measure_plan_costs<Model4, SoftmaxCrossEntropy>(backend, x, y, options);
  REQUIRE(!costs.empty());
  for (const PlanCosts& c : costs) {
    CHECK(c.num_devices == 2);
    REQUIRE(c.never.size() == 4);
    for (std::size_t s = 0; s < 4; ++s) CHECK(c.always[s].forward > 0);
  }
  const std::vector<Remat> policies = {Remat::never, Remat::selective, Remat::except_last,
                                       Remat::always};
  const std::vector<std::size_t> limits = {limit};
  const Plan first = choose_plan<Model4>(rows, costs, limits, policies);
  const Plan second = choose_plan<Model4>(rows, costs, limits, policies);
  CHECK(first.schedule == second.schedule);
  CHECK(first.describe() == second.describe());

  const Plan plan = gpipe::plan<Model4, SoftmaxCrossEntropy>(backend, x, y, options);
  CAPTURE(plan.describe());
  CHECK(plan.chunks_per_device() == 2);
  CHECK(two_chunk_kind(plan.chosen.schedule));
  CHECK(plan.chosen.peak_bytes <= limit);
  const bool never_m1_chosen = plan.chosen.micro_batches == 1 &&
                               plan.chosen.stage_remat == std::vector<Remat>(4, Remat::never);
  CHECK_FALSE(never_m1_chosen);

  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, PlannedSchedule<2>> trainer(backend, plan);
  CHECK(trainer.schedule() == plan.schedule);
  for (std::size_t s = 0; s < 4; ++s)
    CHECK(trainer.device_of_stage(s) == plan.schedule.device_of_stage(s));
  CHECK(trainer.options().micro_batches == plan.chosen.micro_batches);
  backend.reset_peak();
  const float loss = trainer.forward_backward(x, y);
  for (std::size_t d = 0; d < 2; ++d) {
    CAPTURE(d);
    const MemoryStats stats = backend.memory_stats(d);
    CHECK(stats.peak_of(MemoryKind::activations) == plan.chosen.memory[d].activations_peak);
    CHECK(stats.peak <= plan.chosen.memory[d].total_bound());
    CHECK(plan.chosen.memory[d].total_bound() <= limit);
  }
  // the unpipelined model: the same layers in one stage on one device, the same seed
  host::Backend one_device(1);
  Trainer<Model1, SoftmaxCrossEntropy, host::Backend> plain(one_device, {.micro_batches = 1});
  CHECK(plain.forward_backward(x, y) == doctest::Approx(loss).epsilon(1e-5));
  REQUIRE(plain.parameter_info().size() == trainer.parameter_info().size());
  for (const ParameterInfo& p : plain.parameter_info()) {
    CAPTURE(p.name);
    CHECK(relative_error(trainer.gradient(p.name), plain.gradient(p.name)) < 2e-6);
  }
}

TEST_CASE("a plan into a trainer of another number of stages per device is an Error") {
  // a two-chunk plan into a one-chunk schedule kind
  const Plan two =
      choose_plan<Model4>(rows, two_chunk_costs(), std::vector<std::size_t>{}, all_policies);
  host::Backend backend2(2);
  using OneChunk = Trainer<Model4, SoftmaxCrossEntropy, host::Backend, SearchedSchedule>;
  CHECK_THROWS_WITH_AS(OneChunk(backend2, two), doctest::Contains("PlannedSchedule<2>"), Error);
  // a one-chunk plan (Model4 on 4 devices) into a two-chunk one
  std::vector<PlanCosts> four = two_chunk_costs();
  for (PlanCosts& c : four) c.num_devices = 0;  // one stage per device
  const Plan one = choose_plan<Model4>(rows, four, std::vector<std::size_t>{}, all_policies);
  CHECK(one.chunks_per_device() == 1);
  using TwoChunk = Trainer<Model4, SoftmaxCrossEntropy, host::Backend, PlannedSchedule<2>>;
  CHECK_THROWS_WITH_AS(TwoChunk(backend2, one), doctest::Contains("PlannedSchedule<1>"), Error);
  // the right tags take them
  host::Backend backend4(4);
  CHECK_NOTHROW(TwoChunk(backend2, two));
  CHECK_NOTHROW(OneChunk(backend4, one));
  using PlannedOne = Trainer<Model4, SoftmaxCrossEntropy, host::Backend, PlannedSchedule<1>>;
  CHECK(PlannedOne(backend4, one).schedule() == one.schedule);
}

TEST_CASE("the planner needs as many devices as stages, or half as many") {
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, Model4::out_features, 2);
  host::Backend backend(3);
  CHECK_THROWS_WITH_AS(
      (gpipe::plan<Model4, SoftmaxCrossEntropy>(backend, x, y, {.micro_batches = {2}})),
      doctest::Contains("the model has 4 stages and the backend 3 devices"), Error);
  CHECK_THROWS_WITH_AS(
      (measure_plan_costs<Model4, SoftmaxCrossEntropy>(backend, x, y, {.micro_batches = {2}})),
      doctest::Contains("the model has 4 stages and the backend 3 devices"), Error);
}
