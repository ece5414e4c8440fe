// gpipe::plan against the configurations a user would try by hand, on the host backend: a
// GPT-2-shaped model of 4 stages on 4 devices (and on 2 devices, two stages each) under a memory
// limit of a fraction of what 1F1B with M = 2K and Remat::never needs (predict_memory's bound on
// its largest device).
//   model     Embedding<256, 128, 64>, 4 TransformerBlock<64, 4> (one per stage), LayerNorm,
//             the LM head; batch 32 samples (4096 tokens); SoftmaxCrossEntropy; fp32
//   plan      gpipe::plan under the limit (its two halves, measure_plan_costs and choose_plan,
//             in plan_s), its trainer built from the plan, steps timed: plan_ms, beside
//             predicted_ms
//   by hand   1F1B, M = 2K = 8, Remat::always: always_ms (the usual answer to a memory limit)
//   all       every built-in schedule of one stage per device (GPipe, 1F1B, ZB-H1, ZB-H2) x M in
//             {1, 2, 4, 8, 16} x {never, selective, except_last, always} on every stage, and the
//             plan's policy per stage for each, whose bound fits, each timed the same way:
//             best_ms, and how many ran (configs)
//   uniform   the same policy on every stage: the candidate the planner would choose without a
//             policy per stage (the fastest predicted that fits): uniform_predicted_ms,
//             uniform_ms; the fastest of them measured: best_uniform_ms
// Counters: plan_ms, predicted_ms, prediction_error_pct (|measured - predicted| / measured),
// always_ms, speedup_vs_always (always_ms / plan_ms), best_ms, plan_vs_best (plan_ms / best_ms,
// >= 1; 1 means the plan was the fastest found), configs, median_error_pct and max_error_pct
// (the prediction's error over every configuration run), plan_s, uniform_predicted_ms,
// uniform_ms, best_uniform_ms, vs_uniform (uniform_ms / plan_ms: what the policy per stage gains).
// Each configuration is timed in --rounds rounds (default 15) that alternate the configurations:
// in each, its trainer is built on the row's backend, runs one warm-up step and --steps timed
// steps (default 1); its figure is the median of all its timed steps. plan_spread_pct:
// (slowest - fastest) / median of the plan's steps, how much one configuration swung in the run;
// twin_ms: the plan's configuration timed again as the built-in candidate it is, twin_gap_pct
// their difference: the noise that plan_vs_best and prediction_error_pct are read against.
// in_round_predicted_ms: the plan's step predicted again in every round (predict_step_us from op
// costs measure_plan_costs takes there, at the plan's M), their median, and in_round_error_pct,
// its |plan_ms - it| / plan_ms: the planner's model measured beside the steps it predicts, where
// predicted_ms also carries the machine's drift between planning and running.
// BM_PlanTwoChunk: the same model's 4 stages on 2 devices, two per device: the plan among
// Interleaved<2>, LoopedBFS<2>, ZB-V and DualPipeV (PlannedSchedule<2> runs it), under a limit of
// a fraction of what Interleaved<2> with M = 2K = 4 and Remat::never needs; by hand:
// Interleaved<2>, M = 2K, with the least recompute whose bound fits (never, selective, always:
// hand_ms, speedup_vs_hand; at 75 % only always fits, at 100 % never does); all: every two-chunk
// built-in schedule x M x policy (and the plan's mixes) that fits, timed (best_ms, plan_vs_best,
// configs); plan_ms, predicted_ms, prediction_error_pct, plan_s as above.
// BM_PlanTwoDevices: as BM_Plan, the same layers in 2 stages (two blocks each) on 2 devices, one
// stage per device: no more device threads than cores on a 2-core machine, where BM_Plan's 4
// devices share them.
// BM_Remat: the same model under 1F1B with M = 2K and each remat policy, no limit: the step
// (step_ms, its ratio to never's), the largest device's peak activations measured and predicted
// (act_MiB, predicted_act_MiB, their ratio to never's) and its whole peak (peak_MiB); the policy's
// steps alternated with never's in rounds as above.
//
// Usage: bench_plan [--rounds=R] [--steps=N] [Google Benchmark flags]; Arg: the limit in percent of
// the Remat::never bound (45, 60 and 80). At 45 % no micro-batch count up to 16 lets the first
// stages keep everything, while the last stage (1F1B: one stash at a time) still can: where a
// policy per stage pays.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <gpipe/gpipe.hpp>
#include <gpipe/runtime/plan.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr std::size_t V = 256, T = 128, D = 64, H = 4, samples = 32;
using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Gpt = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block>, gpipe::Stage<Block>,
                            gpipe::Stage<Block, gpipe::LayerNorm<D>, gpipe::Linear<D, V>>>;
constexpr std::size_t K = Gpt::num_stages;
using Gpt2 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block>,
                             gpipe::Stage<Block, Block, gpipe::LayerNorm<D>, gpipe::Linear<D, V>>>;
using Loss = gpipe::SoftmaxCrossEntropy;

long steps_flag = 1, rounds_flag = 15;

struct Batch {
  std::vector<std::int32_t> tokens, targets;
};

Batch make_batch() {
  Batch b;
  for (std::size_t i = 0; i < samples * T; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>((i * 7919) % V));
    b.targets.push_back(static_cast<std::int32_t>((i * 104729 + 3) % V));
  }
  return b;
}

// What a configuration's trainer is built from: M and a policy per stage, or a plan.
struct Setting {
  std::size_t micro_batches = 1;
  std::vector<gpipe::Remat> stage_remat;
  template <class Options>
  Options options() const {
    Options o{};
    o.micro_batches = micro_batches;
    o.stage_remat = stage_remat;
    return o;
  }
};
struct FromPlan {
  const gpipe::Plan& plan;
  template <class Options>
  Options options() const {
    return plan;
  }
};

// The median of v; NaN for an empty v.
double median_of(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::ranges::sort(v);
  return v[v.size() / 2];
}

// One step of `trainer` (and zero_grad), its milliseconds.
template <class TrainerT>
double time_step(TrainerT& trainer, const Batch& b) {
  const auto start = std::chrono::steady_clock::now();
  benchmark::DoNotOptimize(trainer.forward_backward(b.tokens, b.targets));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  trainer.zero_grad();
  return ms;
}

// The configurations of a row, timed in alternation: --rounds rounds, each of which builds every
// configuration's trainer in turn on the row's backend (the order rotated by one each round), runs
// one warm-up step and times --steps steps; a configuration's figure is the median of all its
// timed steps. On a shared VM one configuration's steps swing widely from one second to the next
// (BENCHMARKS.md, "Let gpipe choose"): timed one after the other, configurations would be compared
// across those swings; alternated, every configuration sees them alike. (Keeping every trainer
// alive instead, each on a backend of its own, made instances of one configuration differ: the
// machine's memory state changes with dozens of trainers held.)
class Rounds {
 public:
  // Times on `backend` with the batch b; both outlive the Rounds.
  Rounds(gpipe::host::Backend& backend, const Batch& b) : backend_(backend), batch_(b) {}

  // Adds Trainer<Model, Loss, host::Backend, Schedule>(backend, args's options); returns its
  // index. A configuration that runs out of memory is timed no more, and its figure is NaN.
  template <class Model, class Schedule, class Args>
  std::size_t add(const Args& args) {
    configs_.push_back(
        {[args](gpipe::host::Backend& backend, const Batch& b, std::vector<double>& ms) {
          using TrainerT = gpipe::Trainer<Model, Loss, gpipe::host::Backend, Schedule>;
          TrainerT trainer(backend, args.template options<typename TrainerT::Options>());
          time_step(trainer, b);  // warm-up: its first allocations
          for (long s = 0; s < steps_flag; ++s) ms.push_back(time_step(trainer, b));
        }});
    return configs_.size() - 1;
  }

  // Adds work that runs once in every round, beside the configurations (untimed).
  void add_work(std::function<void(gpipe::host::Backend&, const Batch&)> work) {
    configs_.push_back({[work = std::move(work)](gpipe::host::Backend& backend, const Batch& b,
                                                 std::vector<double>&) { work(backend, b); }});
  }

  void run() {
    const std::size_t n = configs_.size();
    for (long round = 0; round < rounds_flag; ++round)
      for (std::size_t i = 0; i < n; ++i) {
        Config& c = configs_[(i + static_cast<std::size_t>(round)) % n];
        if (c.out_of_memory) continue;
        try {
          c.run(backend_, batch_, c.ms);
        } catch (const gpipe::OutOfMemory&) {
          c.out_of_memory = true;
          c.ms.clear();
        }
      }
  }

  // The median step of configuration i, in milliseconds; NaN if it ran out of memory.
  double ms(std::size_t i) const { return median_of(configs_[i].ms); }
  // (slowest - fastest) / median of configuration i's steps, in percent: the swing of one
  // configuration over the run.
  double spread_pct(std::size_t i) const {
    if (configs_[i].ms.empty()) return NAN;
    const auto [lo, hi] = std::ranges::minmax(configs_[i].ms);
    return 100 * (hi - lo) / ms(i);
  }

 private:
  struct Config {
    std::function<void(gpipe::host::Backend&, const Batch&, std::vector<double>&)> run;
    std::vector<double> ms = {};
    bool out_of_memory = false;
  };
  gpipe::host::Backend& backend_;
  const Batch& batch_;
  std::vector<Config> configs_;
};

// median_error_pct, max_error_pct: over the configurations run, |measured - predicted| /
// measured in percent (the planner's prediction of every candidate, not only the chosen one's).
void set_error_counters(benchmark::State& state, std::vector<double> errors) {
  if (errors.empty()) return;
  std::sort(errors.begin(), errors.end());
  state.counters["median_error_pct"] = errors[errors.size() / 2];
  state.counters["max_error_pct"] = errors.back();
}

// The configurations of a row that ran: (index in the Rounds, the candidate it runs).
using Timed = std::vector<std::pair<std::size_t, const gpipe::PlanCandidate*>>;

// The index of the plan's chosen candidate among `all`, timed as a built-in schedule beside the
// plan's own trainer; none where the plan's schedule is a searched one.
std::optional<std::size_t> twin_of(const gpipe::Plan& plan, const Timed& all) {
  for (const auto& [i, c] : all)
    if (c->schedule == plan.chosen.schedule && c->micro_batches == plan.chosen.micro_batches &&
        c->stage_remat == plan.chosen.stage_remat)
      return i;
  return std::nullopt;
}

// plan_spread_pct: how much the plan's steps swung in the run ((slowest - fastest) / median);
// twin_ms, twin_gap_pct: the plan's configuration timed a second time (as the built-in candidate
// it is) and |plan_ms - twin_ms| / twin_ms: two figures of one configuration, the noise that
// plan_vs_best and the prediction's error are read against.
void set_noise_counters(benchmark::State& state, const Rounds& rounds, std::size_t plan_i,
                        std::optional<std::size_t> twin_i) {
  state.counters["plan_spread_pct"] = rounds.spread_pct(plan_i);
  if (!twin_i) return;
  state.counters["twin_ms"] = rounds.ms(*twin_i);
  state.counters["twin_gap_pct"] =
      100 * std::abs(rounds.ms(plan_i) - rounds.ms(*twin_i)) / rounds.ms(*twin_i);
}

// The plan's step predicted again in every round of `rounds` (predict_step_us from op costs that
// measure_plan_costs measures there, one round of it at the plan's M under `policies`), in
// milliseconds, one per round, into `out`: beside predicted_ms, measured before the rounds, the
// planner's model without the machine's drift between planning and running.
template <class Model>
void predict_in_rounds(Rounds& rounds, const gpipe::Plan& plan,
                       const std::vector<gpipe::Remat>& policies, std::vector<double>& out) {
  rounds.add_work([&plan, policies, &out](gpipe::host::Backend& backend, const Batch& b) {
    const std::vector<gpipe::PlanCosts> costs = gpipe::measure_plan_costs<Model, Loss>(
        backend, b.tokens, b.targets,
        {.micro_batches = {plan.chosen.micro_batches}, .remat = policies, .measure_rounds = 1});
    if (!costs.empty())
      out.push_back(gpipe::predict_step_us(plan.schedule, costs.front(), plan.chosen.stage_remat) /
                    1e3);
  });
}

// in_round_predicted_ms, in_round_error_pct: the median of predict_in_rounds' predictions and its
// |plan_ms - it| / plan_ms.
void set_in_round_counters(benchmark::State& state, const std::vector<double>& predicted,
                           double plan_ms) {
  const double ms = median_of(predicted);
  state.counters["in_round_predicted_ms"] = ms;
  state.counters["in_round_error_pct"] = 100 * std::abs(plan_ms - ms) / plan_ms;
}

// BM_Plan's body for Model, one stage per device.
template <class Model>
void run_plan(benchmark::State& state) {
  constexpr std::size_t K = Model::num_stages;
  const Batch b = make_batch();
  const std::size_t rows = samples * T;
  const double fraction = static_cast<double>(state.range(0)) / 100;
  std::size_t never_bound = 0;
  for (const auto& p :
       gpipe::predict_memory<Model>(gpipe::OneFOneB::make(K, 2 * K), rows, gpipe::Remat::never, 2))
    never_bound = std::max(never_bound, p.total_bound());
  const auto limit = static_cast<std::size_t>(fraction * static_cast<double>(never_bound));
  gpipe::host::Backend backend(K, {.device_capacity = limit});
  const std::vector<std::size_t> counts = {1, 2, 4, 8, 16};
  // the host backend has no copy stream: PlanOptions' policies less offload, as gpipe::plan weighs
  std::vector<gpipe::Remat> policies = gpipe::PlanOptions{}.remat;
  std::erase(policies, gpipe::Remat::offload);

  for (auto _ : state) {
    // gpipe::plan's two halves, so that the uniform plan below reuses the measured costs
    const auto start = std::chrono::steady_clock::now();
    const std::vector<gpipe::PlanCosts> costs = gpipe::measure_plan_costs<Model, Loss>(
        backend, b.tokens, b.targets, {.micro_batches = counts});
    const std::vector<std::size_t> limits = {limit};
    const gpipe::Plan plan = gpipe::choose_plan<Model>(rows, costs, limits, policies);
    const double plan_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Rounds rounds(backend, b);
    const std::size_t plan_i = rounds.add<Model, gpipe::SearchedSchedule>(FromPlan{plan});
    std::vector<double> in_round;
    predict_in_rounds<Model>(rounds, plan, policies, in_round);
    // the plan without a policy per stage: the fastest predicted of the plans that weigh one
    // policy each (their candidates are all uniform)
    std::optional<gpipe::Plan> uniform;
    for (const gpipe::Remat p : policies) {
      try {
        gpipe::Plan one = gpipe::choose_plan<Model>(rows, costs, limits, std::vector{p});
        if (!uniform || one.chosen.predicted_us < uniform->chosen.predicted_us)
          uniform = std::move(one);
      } catch (const gpipe::Error&) {  // nothing fits under p
      }
    }
    std::optional<std::size_t> uniform_i;
    if (uniform) uniform_i = rounds.add<Model, gpipe::SearchedSchedule>(FromPlan{*uniform});
    // by hand; NaN where even this does not fit
    const std::size_t always_i = rounds.add<Model, gpipe::OneFOneB>(Setting{
        .micro_batches = 2 * K, .stage_remat = std::vector<gpipe::Remat>(K, gpipe::Remat::always)});
    // every built-in candidate that fits, by the plan's own verdicts
    Timed all;
    for (const gpipe::PlanCandidate& c : plan.candidates) {
      if (!c.fits || c.schedule == "searched") continue;
      const Setting o{.micro_batches = c.micro_batches, .stage_remat = c.stage_remat};
      std::size_t i = 0;
      if (c.schedule == "gpipe")
        i = rounds.add<Model, gpipe::GPipe>(o);
      else if (c.schedule == "1f1b")
        i = rounds.add<Model, gpipe::OneFOneB>(o);
      else if (c.schedule == "zb-h1")
        i = rounds.add<Model, gpipe::ZeroBubbleH1>(o);
      else
        i = rounds.add<Model, gpipe::ZeroBubbleH2>(o);
      all.emplace_back(i, &c);
    }
    rounds.run();

    const double plan_ms = rounds.ms(plan_i);
    const double uniform_ms = uniform_i ? rounds.ms(*uniform_i) : NAN;
    const double uniform_predicted_ms = uniform ? uniform->chosen.predicted_us / 1e3 : NAN;
    const double always_ms = rounds.ms(always_i);
    double best_ms = plan_ms, best_uniform_ms = uniform_ms;
    std::vector<double> errors;  // [config] |measured - predicted| / measured, percent
    for (const auto& [i, c] : all) {
      const double ms = rounds.ms(i);
      best_ms = std::min(best_ms, ms);
      if (c->uniform()) best_uniform_ms = std::min(best_uniform_ms, ms);
      errors.push_back(100 * std::abs(ms - c->predicted_us / 1e3) / ms);
    }
    const std::size_t configs = all.size();
    set_noise_counters(state, rounds, plan_i, twin_of(plan, all));
    set_in_round_counters(state, in_round, plan_ms);
    set_error_counters(state, errors);
    state.counters["uniform_ms"] = uniform_ms;
    state.counters["uniform_predicted_ms"] = uniform_predicted_ms;
    state.counters["best_uniform_ms"] = best_uniform_ms;
    state.counters["vs_uniform"] = uniform_ms / plan_ms;
    state.counters["plan_ms"] = plan_ms;
    state.counters["predicted_ms"] = plan.chosen.predicted_us / 1e3;
    state.counters["prediction_error_pct"] =
        100 * std::abs(plan_ms - plan.chosen.predicted_us / 1e3) / plan_ms;
    state.counters["always_ms"] = always_ms;
    state.counters["speedup_vs_always"] = always_ms / plan_ms;
    state.counters["best_ms"] = best_ms;
    state.counters["plan_vs_best"] = plan_ms / best_ms;
    state.counters["configs"] = static_cast<double>(configs);
    state.counters["plan_s"] = plan_s;
    state.counters["limit_MiB"] = static_cast<double>(limit) / (1 << 20);
    std::string label = plan.chosen.schedule + " M " + std::to_string(plan.chosen.micro_batches) +
                        " remat " + plan.chosen.policies();
    if (uniform)
      label += "; uniform: " + uniform->chosen.schedule + " M " +
               std::to_string(uniform->chosen.micro_batches) + " remat " +
               uniform->chosen.policies();
    state.SetLabel(label);
  }
}
void BM_Plan(benchmark::State& state) { run_plan<Gpt>(state); }
BENCHMARK(BM_Plan)
    ->ArgName("limit_pct")
    ->Arg(45)
    ->Arg(60)
    ->Arg(80)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

void BM_PlanTwoChunk(benchmark::State& state) {
  constexpr std::size_t K2 = K / 2;  // devices: two stages each
  const Batch b = make_batch();
  const std::size_t rows = samples * T;
  const double fraction = static_cast<double>(state.range(0)) / 100;
  const auto bound_of = [&](std::size_t m, gpipe::Remat remat) {
    std::size_t bound = 0;
    for (const auto& p :
         gpipe::predict_memory<Gpt>(gpipe::Interleaved<2>::make(K2, m), rows, remat, 2))
      bound = std::max(bound, p.total_bound());
    return bound;
  };
  const auto limit = static_cast<std::size_t>(
      fraction * static_cast<double>(bound_of(2 * K2, gpipe::Remat::never)));
  gpipe::host::Backend backend(K2, {.device_capacity = limit});
  std::vector<gpipe::Remat> policies = gpipe::PlanOptions{}.remat;
  std::erase(policies, gpipe::Remat::offload);

  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const gpipe::Plan plan =
        gpipe::plan<Gpt, Loss>(backend, b.tokens, b.targets, {.micro_batches = {1, 2, 4, 8, 16}});
    const double plan_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Rounds rounds(backend, b);
    const std::size_t plan_i = rounds.add<Gpt, gpipe::PlannedSchedule<2>>(FromPlan{plan});
    std::vector<double> in_round;
    predict_in_rounds<Gpt>(rounds, plan, policies, in_round);
    // by hand: Interleaved<2>, M = 2K, the least recompute that fits
    std::optional<std::size_t> hand_i;
    std::string hand = "none fits";
    for (const gpipe::Remat r :
         {gpipe::Remat::never, gpipe::Remat::selective, gpipe::Remat::always})
      if (bound_of(2 * K2, r) <= limit) {
        hand_i = rounds.add<Gpt, gpipe::Interleaved<2>>(
            Setting{.micro_batches = 2 * K2, .stage_remat = std::vector(K, r)});
        hand = gpipe::to_string(r);
        break;
      }
    Timed all;
    for (const gpipe::PlanCandidate& c : plan.candidates) {
      if (!c.fits) continue;
      const Setting o{.micro_batches = c.micro_batches, .stage_remat = c.stage_remat};
      std::size_t i = 0;
      if (c.schedule == "interleaved-2")
        i = rounds.add<Gpt, gpipe::Interleaved<2>>(o);
      else if (c.schedule == "looped-bfs-2")
        i = rounds.add<Gpt, gpipe::LoopedBFS<2>>(o);
      else if (c.schedule == "zb-v")
        i = rounds.add<Gpt, gpipe::ZeroBubbleV>(o);
      else
        i = rounds.add<Gpt, gpipe::DualPipeV>(o);
      all.emplace_back(i, &c);
    }
    rounds.run();

    const double plan_ms = rounds.ms(plan_i);
    const double hand_ms = hand_i ? rounds.ms(*hand_i) : NAN;
    double best_ms = plan_ms;
    std::vector<double> errors;
    for (const auto& [i, c] : all) {
      const double ms = rounds.ms(i);
      best_ms = std::min(best_ms, ms);
      errors.push_back(100 * std::abs(ms - c->predicted_us / 1e3) / ms);
    }
    const std::size_t configs = all.size();
    set_noise_counters(state, rounds, plan_i, twin_of(plan, all));
    set_in_round_counters(state, in_round, plan_ms);
    set_error_counters(state, errors);
    state.counters["plan_ms"] = plan_ms;
    state.counters["predicted_ms"] = plan.chosen.predicted_us / 1e3;
    state.counters["prediction_error_pct"] =
        100 * std::abs(plan_ms - plan.chosen.predicted_us / 1e3) / plan_ms;
    state.counters["hand_ms"] = hand_ms;
    state.counters["speedup_vs_hand"] = hand_ms / plan_ms;
    state.counters["best_ms"] = best_ms;
    state.counters["plan_vs_best"] = plan_ms / best_ms;
    state.counters["configs"] = static_cast<double>(configs);
    state.counters["plan_s"] = plan_s;
    state.counters["limit_MiB"] = static_cast<double>(limit) / (1 << 20);
    state.SetLabel(plan.chosen.schedule + " M " + std::to_string(plan.chosen.micro_batches) +
                   " remat " + plan.chosen.policies() + "; by hand: interleaved-2 M " +
                   std::to_string(2 * K2) + " remat " + hand);
  }
}
// The same layers in 2 stages on 2 devices (as many device threads as this machine's cores, where
// it has 2): one chunk per device without devices sharing cores.
void BM_PlanTwoDevices(benchmark::State& state) { run_plan<Gpt2>(state); }
BENCHMARK(BM_PlanTwoDevices)
    ->ArgName("limit_pct")
    ->Arg(45)
    ->Arg(60)
    ->Arg(80)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

BENCHMARK(BM_PlanTwoChunk)
    ->ArgName("limit_pct")
    ->Arg(75)
    ->Arg(100)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

// The largest device's peak activation bytes, its predicted peak and the largest whole peak of
// one step under 1F1B, M = 2K, `remat`.
struct RematMemory {
  std::size_t activations = 0, predicted = 0, peak = 0;
};
RematMemory remat_memory(const Batch& b, gpipe::Remat remat) {
  gpipe::host::Backend backend(K);
  gpipe::Trainer<Gpt, Loss, gpipe::host::Backend, gpipe::OneFOneB> trainer(
      backend, {.micro_batches = 2 * K, .remat = remat});
  trainer.forward_backward(b.tokens, b.targets);
  backend.reset_peak();
  trainer.forward_backward(b.tokens, b.targets);
  const auto predicted = gpipe::predict_memory<Gpt>(trainer.schedule(), samples * T, remat);
  RematMemory r;
  for (std::size_t d = 0; d < K; ++d) {
    const gpipe::MemoryStats stats = backend.memory_stats(d);
    r.activations = std::max(r.activations, stats.peak_of(gpipe::MemoryKind::activations));
    r.predicted = std::max(r.predicted, predicted[d].activations_peak);
    r.peak = std::max(r.peak, stats.peak);
  }
  return r;
}

void BM_Remat(benchmark::State& state) {
  const Batch b = make_batch();
  const auto remat = static_cast<gpipe::Remat>(state.range(0));
  for (auto _ : state) {
    // never's step beside this policy's, alternated
    gpipe::host::Backend backend(K);
    Rounds rounds(backend, b);
    const auto add = [&](gpipe::Remat p) {
      return rounds.add<Gpt, gpipe::OneFOneB>(
          Setting{.micro_batches = 2 * K, .stage_remat = std::vector(K, p)});
    };
    const std::size_t never_i = add(gpipe::Remat::never);
    const std::size_t remat_i = remat == gpipe::Remat::never ? never_i : add(remat);
    rounds.run();
    const RematMemory never = remat_memory(b, gpipe::Remat::never);
    const RematMemory r = remat == gpipe::Remat::never ? never : remat_memory(b, remat);
    constexpr double MiB = 1 << 20;
    state.counters["step_ms"] = rounds.ms(remat_i);
    state.counters["step_vs_never"] = rounds.ms(remat_i) / rounds.ms(never_i);
    state.counters["act_MiB"] = static_cast<double>(r.activations) / MiB;
    state.counters["predicted_act_MiB"] = static_cast<double>(r.predicted) / MiB;
    state.counters["act_vs_never"] =
        static_cast<double>(r.activations) / static_cast<double>(never.activations);
    state.counters["peak_MiB"] = static_cast<double>(r.peak) / MiB;
  }
  state.SetLabel(std::string(gpipe::to_string(remat)));
}
BENCHMARK(BM_Remat)
    ->ArgName("remat")
    ->Arg(static_cast<int>(gpipe::Remat::never))
    ->Arg(static_cast<int>(gpipe::Remat::selective))
    ->Arg(static_cast<int>(gpipe::Remat::always))
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0)
      steps_flag = std::strtol(argv[i] + 8, nullptr, 10);
    else if (std::strncmp(argv[i], "--rounds=", 9) == 0)
      rounds_flag = std::strtol(argv[i] + 9, nullptr, 10);
    else
      argv[out++] = argv[i];
  }
  *argc = out;
  if (steps_flag < 1 || rounds_flag < 1) {
    std::fprintf(stderr, "%s: --steps and --rounds must be at least 1\n", argv[0]);
    return 1;
  }
  return 0;
}
