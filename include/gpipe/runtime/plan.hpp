#pragma once
// gpipe::plan: the schedule, micro-batch count and remat policy of each stage that the simulator
// predicts fastest for a model on a backend, among those whose predicted memory fits every
// device's limit, from op costs measured on that backend.
//
//   gpipe::Plan plan = gpipe::plan<Model, Loss>(backend, x, y, {.device_limit = {6ull << 30}});
//   std::cout << plan.describe();                 // the choice, and why not the others
//   gpipe::Trainer<Model, Loss, Backend, gpipe::SearchedSchedule> trainer(backend, plan);
//   // a model of 2K stages on a backend of K devices: two stages per device
//   gpipe::Trainer<Model8, Loss, Backend, gpipe::PlannedSchedule<2>> trainer8(backend, plan8);
//
// Two halves: measure_plan_costs times F, B and W per stage for each micro-batch count, with
// and without recompute, and with selective recompute where the model has cheap layers (a 1F1B
// trainer per configuration, or an Interleaved<2> one for two stages per device,
// measure_stage_costs); choose_plan, a pure function of those costs, weighs every candidate
// (one stage per device: GPipe, 1F1B, ZB-H1, ZB-H2 and a schedule searched from the costs; two:
// Interleaved<2>, LoopedBFS<2>, ZB-V and DualPipeV; each with every micro-batch count and remat
// policy, and with a policy per device): predict_memory's bound (total_bound: exact parameters,
// gradients, optimizer state and activations, a bound on the workspace) against the limit,
// simulate's makespan with each stage's measured costs for the time.
//
// How many devices: the backend's pipeline devices, K = backend.num_devices(). A model of S
// stages takes one stage per device where S <= K (on devices 0..S-1), two where S = 2K; any
// other S is a gpipe::Error naming both numbers. choose_plan reads K from the costs
// (PlanCosts::num_devices).
//
// A policy per device: for a given schedule and M, a device's memory depends on its own stages'
// policies only, and their op costs are those measured under those policies. So each device may
// take any policy (for all its stages) that fits its limit (1F1B's stage d holds K - d stashes:
// the first stages recompute, the last keeps everything); from each device's cheapest fitting
// policy (least F + B + W over its stages), a descent moves one device at a time to another
// fitting policy while the simulated step gets shorter. The mix is a candidate beside the
// uniform ones where it differs from them. (With two stages per device the device's two stages
// share its policy: a device's bound is known for uniform policies only.)
// Because memory is judged by a bound, a plan never exceeds a limit when run; a candidate whose
// true peak would just fit may be turned away.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/measure_costs.hpp"
#include "gpipe/runtime/memory_model.hpp"
#include "gpipe/runtime/offload.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/dual_pipe_v.hpp"
#include "gpipe/schedule/gpipe.hpp"
#include "gpipe/schedule/interleaved.hpp"
#include "gpipe/schedule/looped_bfs.hpp"
#include "gpipe/schedule/one_f_one_b.hpp"
#include "gpipe/schedule/search.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/schedule/zero_bubble.hpp"
#include "gpipe/schedule/zero_bubble_v.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe {

/// What `plan` chooses among and under which limits; an empty list takes its default.
struct PlanOptions {
  /// Bytes each pipeline device may hold at its peak: one entry per device, or one for all.
  /// Empty: each device's cap as the backend has it (`memory_stats(d).capacity`; 0: no limit).
  std::vector<std::size_t> device_limit = {};
  /// Micro-batch counts to weigh. Empty: 1, 2, 4, ... up to the batch's samples, and the
  /// samples themselves.
  std::vector<std::size_t> micro_batches = {};
  /// Remat policies to weigh. `plan` and `measure_plan_costs` leave Remat::offload out on a
  /// backend without a copy stream (the host backend), where a Trainer refuses it.
  std::vector<Remat> remat = {Remat::never, Remat::selective, Remat::except_last, Remat::always,
                              Remat::offload};
  /// Floats of optimizer state per parameter the run will keep (AdamW 2, SGD with momentum 1,
  /// no optimizer state 0), counted in every device's memory.
  std::size_t optimizer_state_per_param = 2;
  /// Traced steps per measured configuration, after one warm-up step.
  std::size_t measure_steps = 2;
};

/// F, B and W per stage (microseconds) at one micro-batch count, measured without and with
/// recompute: what choose_plan predicts step times from. With one stage per device a stage's
/// entry is its device's.
struct PlanCosts {
  std::size_t micro_batches = 0;  ///< M of the measurement
  std::vector<OpCosts> never;     ///< [stage] under Remat::never
  std::vector<OpCosts> always;    ///< [stage] under Remat::always (B recomputes the forward)
  /// [stage] under Remat::selective (B recomputes the cheap layers); empty: taken as `never`'s
  /// (a model without cheap layers recomputes nothing under selective).
  std::vector<OpCosts> selective = {};
  /// [stage] under Remat::offload (its copies run beside the compute, and B waits for its
  /// fetch); empty: taken as `never`'s.
  std::vector<OpCosts> offload = {};
  /// K, the devices the plan is for: the model's stage count S (one stage per device; 0 says
  /// the same) or S / 2 (two stages per device: the two-chunk schedules are weighed).
  std::size_t num_devices = 0;
  /// What the executor adds to each op slot of the critical path (hand-overs, issuing), in
  /// microseconds: the measured steps' wall time less their simulated makespan, per slot.
  /// choose_plan adds it to every op's cost.
  double overhead_us = 0;
};

/// One configuration the planner weighed, and its verdict.
struct PlanCandidate {
  /// The schedule tag's name: "gpipe", "1f1b", "zb-h1", "zb-h2" or "searched" (one stage per
  /// device); "interleaved-2", "looped-bfs-2", "zb-v" or "dualpipe-v" (two)
  std::string schedule;
  std::size_t micro_batches = 0;  ///< M
  /// The remat policy of every stage where they share one; for a policy per device (`uniform()`
  /// false), the first stage's: `stage_remat` has them all.
  Remat remat = Remat::never;
  std::vector<Remat> stage_remat;  ///< [stage] each stage's remat policy
  double predicted_us = 0;         ///< simulated step with the measured op costs, microseconds
  std::vector<DeviceMemoryPrediction> memory;  ///< [device] predict_memory's prediction
  std::size_t peak_bytes = 0;                  ///< the largest device's total_bound()
  std::size_t peak_device = 0;                 ///< the device with that bound
  bool fits = false;                           ///< every device's bound within its limit
  std::string verdict;  ///< "chosen", or why not: "over memory: ...", "not faster: ..."

  /// Whether every stage has the same policy, `remat`.
  bool uniform() const {
    return std::ranges::all_of(stage_remat, [&](Remat r) { return r == remat; });
  }
  /// "always" where every stage has that policy, else each stage's: "always/selective/never".
  std::string policies() const {
    if (uniform()) return std::string(to_string(remat));
    std::string out;
    for (const Remat r : stage_remat) out += (out.empty() ? "" : "/") + std::string(to_string(r));
    return out;
  }
};

namespace detail {

// The per-stage costs of `remat` at costs.micro_batches (except_last recomputes every
// micro-batch's forward but the last one's, so its B is the mean of the two measured B's), with
// the executor's overhead per op added to every op.
inline std::vector<OpCosts> costs_of(const PlanCosts& costs, Remat remat) {
  std::vector<OpCosts> out = remat == Remat::always ? costs.always
                             : remat == Remat::selective && !costs.selective.empty()
                                 ? costs.selective
                             : remat == Remat::offload && !costs.offload.empty() ? costs.offload
                                                                                 : costs.never;
  const auto m = static_cast<double>(costs.micro_batches);
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (remat == Remat::except_last)
      out[d].backward_input =
          ((m - 1) * costs.always[d].backward_input + costs.never[d].backward_input) / m;
    out[d].forward += costs.overhead_us;
    out[d].backward_input += costs.overhead_us;
    out[d].backward_weight += costs.overhead_us;
  }
  return out;
}

// The per-stage costs of a policy per stage, [stage]: stage s's from costs_of(policy[s]).
inline std::vector<OpCosts> costs_of(const PlanCosts& costs, std::span<const Remat> policy) {
  std::vector<OpCosts> out;
  for (std::size_t s = 0; s < policy.size(); ++s) out.push_back(costs_of(costs, policy[s])[s]);
  return out;
}

// A policy per device for `schedule` at costs.micro_batches, from bound[p][d], device d's memory
// bound under policies[p] on all its stages (a device's memory depends on its own stages'
// policies only): each device's cheapest policy (least F + B + W over its stages, the earlier on
// a tie) among those within its limit, then one device at a time moved to another of its fitting
// policies while the simulated step gets shorter. Where a device has none within its limit,
// every device's smallest policy instead (`fits` false). Deterministic. `policy` is per stage,
// each stage its device's.
struct PolicyMix {
  std::vector<Remat> policy;  // [stage]
  bool fits = true;
};
inline PolicyMix mix_policies(const Schedule& schedule, const PlanCosts& costs,
                              std::span<const Remat> policies,
                              const std::vector<std::vector<std::size_t>>& bound,
                              std::span<const std::size_t> limit) {
  const std::size_t K = schedule.num_devices, S = schedule.num_stages();
  // [device] => [stage]
  const auto per_stage = [&](const std::vector<Remat>& per_device) {
    std::vector<Remat> out;
    for (std::size_t s = 0; s < S; ++s) out.push_back(per_device[schedule.device_of_stage(s)]);
    return out;
  };
  const auto step_of = [&](const std::vector<Remat>& per_device) {
    return simulate(schedule, costs_of(costs, per_stage(per_device))).makespan;
  };
  std::vector<std::vector<std::size_t>> fitting(K);  // [device] indices into policies
  std::vector<Remat> device_policy;                  // [device]
  PolicyMix mix;
  for (std::size_t d = 0; d < K; ++d) {
    for (std::size_t p = 0; p < policies.size(); ++p)
      if (limit[d] == 0 || bound[p][d] <= limit[d]) fitting[d].push_back(p);
    mix.fits = mix.fits && !fitting[d].empty();
  }
  if (!mix.fits) {
    for (std::size_t d = 0; d < K; ++d) {
      std::size_t smallest = 0;
      for (std::size_t p = 1; p < policies.size(); ++p)
        if (bound[p][d] < bound[smallest][d]) smallest = p;
      device_policy.push_back(policies[smallest]);
    }
    mix.policy = per_stage(device_policy);
    return mix;
  }
  for (std::size_t d = 0; d < K; ++d) {
    const auto work = [&](std::size_t p) {
      const std::vector<OpCosts> c = costs_of(costs, policies[p]);
      double sum = 0;
      for (std::size_t s = 0; s < S; ++s)
        if (schedule.device_of_stage(s) == d)
          sum += c[s].forward + c[s].backward_input + c[s].backward_weight;
      return sum;
    };
    std::size_t cheapest = fitting[d].front();
    for (const std::size_t p : fitting[d])
      if (work(p) < work(cheapest)) cheapest = p;
    device_policy.push_back(policies[cheapest]);
  }
  double step = step_of(device_policy);
  // each accepted move shortens the step, so the descent ends; a bound on the passes anyway
  for (std::size_t pass = 0, moved = 1; moved != 0 && pass < K * policies.size(); ++pass) {
    moved = 0;
    for (std::size_t d = 0; d < K; ++d)
      for (const std::size_t p : fitting[d]) {
        if (policies[p] == device_policy[d]) continue;
        std::vector<Remat> trial = device_policy;
        trial[d] = policies[p];
        const double t = step_of(trial);
        if (t < step) {
          step = t;
          device_policy = std::move(trial);
          ++moved;
        }
      }
  }
  mix.policy = per_stage(device_policy);
  return mix;
}

// K for a model of `stages` stages on a backend of `devices` pipeline devices: `stages` (one
// stage per device) where the backend has that many, devices (two stages per device) where
// stages == 2 devices; else an Error naming both numbers.
inline std::size_t plan_devices(std::size_t stages, std::size_t devices) {
  if (stages <= devices) return stages;
  require(stages == 2 * devices, [&] {
    return "plan: the model has " + std::to_string(stages) + " stages and the backend " +
           std::to_string(devices) + " devices; the planner places one stage per device (at " +
           "least as many devices as stages) or two (twice as many stages as devices)";
  });
  return devices;
}

// K of the costs (each entry's num_devices, 0 read as `stages`): `stages` or stages / 2, the
// same in every entry, else an Error.
inline std::size_t devices_of(std::span<const PlanCosts> costs, std::size_t stages) {
  const auto devices = [&](const PlanCosts& c) {
    return c.num_devices == 0 ? stages : c.num_devices;
  };
  const std::size_t k = devices(costs.front());
  for (const PlanCosts& c : costs)
    require(devices(c) == k, "plan's costs are for different device counts");
  require(k == stages || 2 * k == stages, [&] {
    return "plan's costs are for " + std::to_string(k) + " devices, and the model has " +
           std::to_string(stages) + " stages: one or two stages per device";
  });
  return k;
}

// "12.3 MiB", "45.6 KiB" or "789 B".
inline std::string format_bytes(std::size_t bytes) {
  char text[32];
  if (bytes >= (1u << 20))
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1u << 20));
  else if (bytes >= (1u << 10))
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / (1u << 10));
  else
    std::snprintf(text, sizeof text, "%zu B", bytes);
  return text;
}

// `value` with `digits` decimals.
inline std::string format_fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

// limits[d] for each of k devices from 1 or k entries (0: no limit).
inline std::vector<std::size_t> limits_for(std::span<const std::size_t> given, std::size_t k) {
  require(given.empty() || given.size() == 1 || given.size() == k, [&] {
    return "plan needs a device limit for 1 or " + std::to_string(k) + " devices, got " +
           std::to_string(given.size());
  });
  std::vector<std::size_t> out(k, 0);
  for (std::size_t d = 0; d < k && !given.empty(); ++d) out[d] = given[given.size() == 1 ? 0 : d];
  return out;
}

// The default micro-batch counts for `samples` samples: powers of two below it, and it.
inline std::vector<std::size_t> default_micro_batches(std::size_t samples) {
  std::vector<std::size_t> out;
  for (std::size_t m = 1; m < samples; m *= 2) out.push_back(m);
  out.push_back(samples);
  return out;
}

}  // namespace detail

namespace detail {
inline constexpr char planned_name_prefix[] = "planned-";
}  // namespace detail

/// Schedule tag for a Trainer built from a `gpipe::Plan` (or any schedule chosen at run time in
/// Options::schedule) of V stages per device, with whatever placement that schedule has (round
/// robin, or ZB-V's and DualPipeV's V): `PlannedSchedule<2>` runs a plan for a model of 2K stages
/// on K devices, `PlannedSchedule<1>` (or `SearchedSchedule`) one of one stage per device. Name
/// `"planned-V"`; without Options::schedule, make(K, M) is Interleaved<V>'s (1F1B's for V = 1).
template <std::size_t V>
struct PlannedSchedule
    : detail::RoundRobinScheduleKind<V, detail::planned_name_prefix, make_interleaved_schedule> {
  static_assert(V >= 1, "gpipe: PlannedSchedule<V> needs at least one chunk per device");
};

/// What `plan` returns: the chosen configuration, its schedule (one or two stages per device),
/// and every candidate with its verdict. It converts to the Options of any Trainer, so that a
/// Trainer whose schedule kind has as many chunks per device as the plan's schedule
/// (`gpipe::SearchedSchedule` or `gpipe::PlannedSchedule<1>` for one, `PlannedSchedule<2>` for
/// two; another count is a gpipe::Error) is built from it in one line:
///
///     gpipe::Trainer<Model, Loss, Backend, gpipe::SearchedSchedule> trainer(backend, plan);
///     gpipe::Trainer<Model8, Loss, Backend, gpipe::PlannedSchedule<2>> trainer8(backend, plan8);
struct Plan {
  Schedule schedule;                      ///< the chosen candidate's ops
  PlanCandidate chosen;                   ///< the chosen candidate
  std::vector<PlanCandidate> candidates;  ///< every candidate weighed, the chosen one included

  /// Stages per device of the schedule (1 or 2): the `V` of the PlannedSchedule<V> that runs it.
  std::size_t chunks_per_device() const { return schedule.num_chunks; }

  /// Trainer options of the plan: micro_batches, schedule and the remat policies set (`remat`
  /// where every stage has the same one, else `stage_remat`), the rest as given.
  template <class Options>
  requires requires(Options o) {
    o.micro_batches;
    o.remat;
    o.stage_remat;
    o.schedule;
  }
  operator Options() const {
    Options options{};
    options.micro_batches = chosen.micro_batches;
    if (chosen.uniform())
      options.remat = chosen.remat;
    else
      options.stage_remat = chosen.stage_remat;
    options.schedule = schedule;
    return options;
  }

  /// The plan for a person: the choice with its prediction, then every candidate, fastest first.
  std::string describe() const {
    std::string out = "plan: " + line(chosen) + "\ncandidates (fastest first):\n";
    std::vector<const PlanCandidate*> order;
    for (const PlanCandidate& c : candidates) order.push_back(&c);
    std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
      return a->predicted_us < b->predicted_us;
    });
    for (const PlanCandidate* c : order) out += "  " + line(*c) + ": " + c->verdict + "\n";
    return out;
  }

 private:
  static std::string line(const PlanCandidate& c) {
    return c.schedule + ", M " + std::to_string(c.micro_batches) + ", remat " + c.policies() +
           ": " + detail::format_fixed(c.predicted_us / 1e3, 3) + " ms, up to " +
           detail::format_bytes(c.peak_bytes) + " on device " + std::to_string(c.peak_device);
  }
};

/// Chooses among the candidates (see the top of this file) for Model on K devices, K the costs'
/// num_devices (S, the model's stages: one stage per device; S / 2: two), a batch of `rows` rows
/// (tokens in a token model), the measured `costs` (one entry per micro-batch count to weigh)
/// and per-device `limits` (1 or K entries, 0 = none): the fastest predicted candidate whose
/// predicted memory bound fits every device (ties: the smaller peak, then the earlier
/// candidate: per micro-batch count, each policy on every stage with GPipe, 1F1B, ZB-H1, ZB-H2,
/// searched, then a policy per device with each; with two stages per device Interleaved<2>,
/// LoopedBFS<2>, ZB-V and, where M >= 2K, DualPipeV in their place, none searched).
/// target_bytes_per_row as predict_memory's. Deterministic: the same inputs give the same plan,
/// so processes that share costs share the plan. Throws gpipe::Error when no candidate fits,
/// naming the smallest bound and its configuration, for costs without entries, or for costs of
/// another device count.
template <class Model, class Precision = Fp32>
Plan choose_plan(std::size_t rows, std::span<const PlanCosts> costs,
                 std::span<const std::size_t> limits, std::span<const Remat> policies,
                 std::size_t optimizer_state_per_param = 2, std::size_t target_bytes_per_row = 4) {
  constexpr std::size_t S = Model::num_stages;
  detail::require(!costs.empty() && !policies.empty(),
                  "plan needs op costs and a remat policy to weigh");
  const std::size_t K = detail::devices_of(costs, S);
  const bool one_chunk = K == S;
  const std::vector<std::size_t> limit = detail::limits_for(limits, K);

  Plan plan;
  std::optional<std::size_t> best;
  std::vector<Schedule> schedules;  // [candidate]
  // Weighs `schedule` under stage_remat ([stage]) with the stages' costs op_costs.
  const auto weigh = [&](std::string name, std::size_t m, std::vector<Remat> stage_remat,
                         const std::vector<OpCosts>& op_costs, Schedule schedule) {
    PlanCandidate cand;
    cand.schedule = std::move(name);
    cand.micro_batches = m;
    cand.remat = stage_remat.front();
    cand.stage_remat = std::move(stage_remat);
    cand.predicted_us = simulate(schedule, op_costs).makespan;
    cand.memory = predict_memory<Model, Precision>(schedule, rows, cand.stage_remat,
                                                   optimizer_state_per_param, target_bytes_per_row);
    cand.fits = true;
    std::string over;
    for (std::size_t d = 0; d < K; ++d) {
      const std::size_t bound = cand.memory[d].total_bound();
      if (bound > cand.peak_bytes) {
        cand.peak_bytes = bound;
        cand.peak_device = d;
      }
      if (limit[d] != 0 && bound > limit[d] && over.empty()) {
        cand.fits = false;
        over = "over memory: device " + std::to_string(d) + " needs up to " +
               std::to_string(bound) + " bytes, its limit is " + std::to_string(limit[d]);
      }
    }
    cand.verdict = over;
    const std::size_t index = plan.candidates.size();
    if (cand.fits) {
      const PlanCandidate* b = best ? &plan.candidates[*best] : nullptr;
      if (b == nullptr || cand.predicted_us < b->predicted_us ||
          (cand.predicted_us == b->predicted_us && cand.peak_bytes < b->peak_bytes))
        best = index;
    }
    plan.candidates.push_back(std::move(cand));
    schedules.push_back(std::move(schedule));
  };
  for (const PlanCosts& c : costs) {
    detail::require(c.never.size() == S && c.always.size() == S &&
                        (c.selective.empty() || c.selective.size() == S) &&
                        (c.offload.empty() || c.offload.size() == S),
                    [&] { return "plan's costs are for " + std::to_string(S) + " stages"; });
    const std::size_t m = c.micro_batches, samples = rows / Model::tokens_per_sample;
    detail::require(m >= 1 && m <= samples, [&] {
      return "plan: costs for " + std::to_string(m) + " micro-batches of a batch of " +
             std::to_string(samples) + " samples";
    });
    // the built-in schedules' names and ops; with one stage per device a searched one follows
    std::vector<std::string> kinds;
    std::vector<Schedule> built_in;
    const auto add = [&]<class Kind>(Kind) {
      kinds.emplace_back(Kind::name);
      built_in.push_back(Kind::make(K, m));
    };
    if (one_chunk) {
      add(GPipe{});
      add(OneFOneB{});
      add(ZeroBubbleH1{});
      add(ZeroBubbleH2{});
      kinds.emplace_back(SearchedSchedule::name);
    } else {
      add(Interleaved<2>{});
      add(LoopedBFS<2>{});
      add(ZeroBubbleV{});
      if (m >= 2 * K) add(DualPipeV{});  // which needs M >= 2K
    }
    // [kind][policy][device]: the bound of each built-in schedule under each uniform policy
    std::vector<std::vector<std::vector<std::size_t>>> bound(
        built_in.size(), std::vector<std::vector<std::size_t>>(policies.size()));
    for (std::size_t p = 0; p < policies.size(); ++p) {
      const std::vector<OpCosts> op_costs = detail::costs_of(c, policies[p]);
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        // searched: from the measured costs, with 1F1B's memory (the built-ins cover more of it)
        Schedule schedule = k < built_in.size()
                                ? built_in[k]
                                : search_schedule(K, m, {.costs = op_costs, .max_stashes = {K}});
        weigh(kinds[k], m, std::vector<Remat>(S, policies[p]), op_costs, std::move(schedule));
        if (k < built_in.size())
          for (const DeviceMemoryPrediction& d : plan.candidates.back().memory)
            bound[k][p].push_back(d.total_bound());
      }
    }
    // a policy per device, where the mix differs from every uniform one; the searched schedule
    // under 1F1B's mix, searched again from the mix's costs
    std::vector<Remat> one_f_one_b_mix;
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      detail::PolicyMix mix;
      if (k < built_in.size()) {
        mix = detail::mix_policies(built_in[k], c, policies, bound[k], limit);
        if (one_chunk && k == 1 && mix.fits) one_f_one_b_mix = mix.policy;
      } else {
        mix.policy = one_f_one_b_mix;
      }
      if (mix.policy.empty() ||
          std::ranges::all_of(mix.policy, [&](Remat r) { return r == mix.policy.front(); }))
        continue;
      const std::vector<OpCosts> op_costs = detail::costs_of(c, std::span<const Remat>(mix.policy));
      Schedule schedule = k < built_in.size()
                              ? built_in[k]
                              : search_schedule(K, m, {.costs = op_costs, .max_stashes = {K}});
      weigh(kinds[k], m, mix.policy, op_costs, std::move(schedule));
    }
  }

  if (!best) {
    const auto smallest = std::min_element(
        plan.candidates.begin(), plan.candidates.end(),
        [](const PlanCandidate& a, const PlanCandidate& b) { return a.peak_bytes < b.peak_bytes; });
    throw Error("gpipe: plan: no candidate fits the memory limits; the smallest, " +
                smallest->schedule + " with M " + std::to_string(smallest->micro_batches) +
                " and remat " + smallest->policies() + ", needs up to " +
                std::to_string(smallest->peak_bytes) + " bytes on device " +
                std::to_string(smallest->peak_device) + " (" + smallest->verdict + ")");
  }
  const double fastest = plan.candidates[*best].predicted_us;
  for (std::size_t i = 0; i < plan.candidates.size(); ++i) {
    PlanCandidate& c = plan.candidates[i];
    if (i == *best)
      c.verdict = "chosen";
    else if (c.fits)
      c.verdict = "not faster: " + detail::format_fixed(c.predicted_us / fastest, 2) +
                  " times the chosen step";
  }
  plan.chosen = plan.candidates[*best];
  plan.schedule = schedules[*best];
  return plan;
}

/// Per micro-batch count in options.micro_batches (default: see PlanOptions), the op costs of
/// each stage of Model on `backend` with the batch (x, y), measured (measure_stage_costs) with a
/// 1F1B trainer, or an Interleaved<2> one where the model has twice as many stages as the
/// backend has devices (see the top of this file; `num_devices` of each entry says which),
/// under Remat::never and Remat::always, under Remat::selective where options.remat weighs it
/// and a stage of Model has cheap layers, and under Remat::offload where options.remat weighs it
/// and the backend supports it (one warm-up step, then options.measure_steps traced steps each;
/// offload's ops also carry what its copies add to the step beyond the others' overhead). Where
/// Remat::never runs out of memory (OutOfMemory), its B is taken as Remat::always's less the
/// forward it recomputes, and selective's (out of memory too) as Remat::always's; a count at
/// which Remat::always runs out of memory too is left out.
/// With several processes every process gets every stage's costs (each stage's from the
/// process that runs it). Throws gpipe::Error for a count of 0 or above the batch's samples,
/// or for a model of neither as many stages as devices or fewer, nor twice as many.
template <class Model, class Loss, class Precision = Fp32, class Backend, class X, class Y>
std::vector<PlanCosts> measure_plan_costs(Backend& backend, const X& x, const Y& y,
                                          const PlanOptions& options = {}) {
  constexpr std::size_t S = Model::num_stages;
  const std::size_t K = detail::plan_devices(S, backend.num_devices());
  const std::size_t rows = Model::is_token_model ? std::size(x) : std::size(x) / Model::in_features;
  const std::size_t samples = rows / Model::tokens_per_sample;
  std::vector<std::size_t> counts = options.micro_batches.empty()
                                        ? detail::default_micro_batches(samples)
                                        : options.micro_batches;
  for (std::size_t m : counts)
    detail::require(m >= 1 && m <= samples, [&] {
      return "plan: a micro-batch count of " + std::to_string(m) + " for a batch of " +
             std::to_string(samples) + " samples";
    });
  transport::Transport<Backend> transport(backend);
  // selective differs from never only where a stage has cheap layers
  const bool weighs_selective =
      std::ranges::find(options.remat, Remat::selective) !=
      options.remat.end()&& [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((Model::template stage_t<I>::cheap_stash_per_row > 0) || ...);
  }
  (std::make_index_sequence<S>{});
  const bool weighs_offload =
      detail::Offload<Backend>::supported &&
      std::ranges::find(options.remat, Remat::offload) != options.remat.end();
  std::vector<std::size_t> owner(S);  // [stage] the device that ran it while measuring
  std::vector<PlanCosts> out;
  for (std::size_t m : counts) {
    double overhead = -1;  // from the last configuration measured without running out
    // the trainer of `Kind` under `remat`: its costs per stage, and the overhead of its steps
    const auto measure_with = [&]<class Kind>(Kind, Remat remat) {
      Trainer<Model, Loss, Backend, Kind, Precision> trainer(backend,
                                                             {.micro_batches = m, .remat = remat});
      for (std::size_t st = 0; st < S; ++st) owner[st] = trainer.device_of_stage(st);
      trainer.forward_backward(x, y);  // warm-up: first allocations, thread start-up
      trainer.zero_grad();
      const std::size_t steps = std::max<std::size_t>(options.measure_steps, 1);
      const auto start = std::chrono::steady_clock::now();
      std::vector<OpCosts> measured = measure_stage_costs(trainer, x, y, steps);
      const double wall =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          static_cast<double>(steps);
      // per op slot of the critical path: (wall - simulated) / (simulated / mean op)
      const SimulationResult sim = simulate(trainer.schedule(), measured);
      double busy = 0;
      for (double b : sim.busy) busy += b;
      const double ops = 3.0 * static_cast<double>(m * S);
      if (busy > 0 && sim.makespan > 0)
        overhead = std::max(0.0, (wall - sim.makespan) / (sim.makespan / (busy / ops)));
      return measured;
    };
    const auto measure = [&](Remat remat) {
      if constexpr (S % 2 == 0)  // else Interleaved<2> does not compile, and K == S
        if (K != S) return measure_with(Interleaved<2>{}, remat);
      return measure_with(OneFOneB{}, remat);
    };
    PlanCosts c;
    c.micro_batches = m;
    c.num_devices = K;
    try {
      c.always = measure(Remat::always);
    } catch (const OutOfMemory&) {
      continue;
    }
    try {
      c.never = measure(Remat::never);
    } catch (const OutOfMemory&) {
      c.never = c.always;
      for (std::size_t st = 0; st < S; ++st)
        c.never[st].backward_input =
            std::max(0.0, c.always[st].backward_input - c.always[st].forward);
    }
    if (weighs_selective) {
      try {
        c.selective = measure(Remat::selective);
      } catch (const OutOfMemory&) {
        c.selective = c.always;
      }
    }
    c.overhead_us = std::max(overhead, 0.0);
    if (weighs_offload) {
      // Its B waits for its fetch outside the op's timing: what the copies add to the step
      // beyond the others' overhead goes into its ops, so that its prediction holds it.
      try {
        c.offload = measure(Remat::offload);
        const double stall = std::max(0.0, overhead - c.overhead_us);
        for (OpCosts& o : c.offload) {
          o.forward += stall;
          o.backward_input += stall;
          o.backward_weight += stall;
        }
      } catch (const OutOfMemory&) {
        c.offload = c.never;  // the same ops; the copies taken as hidden
      }
    }
    // each stage's costs as the process that runs it measured them (the overhead: rank 0's)
    for (std::size_t st = 0; st < S; ++st) {
      std::vector<std::vector<OpCosts>*> measured = {&c.never, &c.always};
      if (weighs_selective) measured.push_back(&c.selective);
      if (weighs_offload) measured.push_back(&c.offload);
      std::vector<double> v;
      for (const auto* costs : measured)
        v.insert(v.end(),
                 {(*costs)[st].forward, (*costs)[st].backward_input, (*costs)[st].backward_weight});
      transport.broadcast(owner[st], std::span<double>(v));
      for (std::size_t i = 0; i < measured.size(); ++i)
        (*measured[i])[st] = {
            .forward = v[3 * i], .backward_input = v[3 * i + 1], .backward_weight = v[3 * i + 2]};
    }
    transport.broadcast(0, std::span<double>(&c.overhead_us, 1));
    out.push_back(std::move(c));
  }
  return out;
}

/// The plan for training Model with Loss in Precision on `backend` with batches like (x, y):
/// measure_plan_costs, then choose_plan under options.device_limit (default: each device's cap
/// on the backend). One stage per device where the backend has at least as many devices as
/// Model has stages, two where it has half as many (see the top of this file). Every process
/// gets the same plan. Throws gpipe::Error when nothing fits (naming the smallest memory any
/// candidate needs), for options out of range, or for another stage count (naming the model's
/// stages and the backend's devices).
template <class Model, class Loss, class Precision = Fp32, class Backend, class X, class Y>
Plan plan(Backend& backend, const X& x, const Y& y, const PlanOptions& options = {}) {
  const std::size_t K = detail::plan_devices(Model::num_stages, backend.num_devices());
  std::vector<std::size_t> limits = options.device_limit;
  if (limits.empty()) {
    transport::Transport<Backend> transport(backend);
    for (std::size_t d = 0; d < K; ++d) {
      double cap =
          transport.is_local(d) ? static_cast<double>(backend.memory_stats(d).capacity) : 0;
      transport.broadcast(d, std::span<double>(&cap, 1));
      limits.push_back(static_cast<std::size_t>(cap));
    }
  }
  const std::vector<PlanCosts> costs =
      measure_plan_costs<Model, Loss, Precision>(backend, x, y, options);
  detail::require(!costs.empty(),
                  "plan: every micro-batch count ran out of memory while measuring");
  const std::size_t rows = Model::is_token_model ? std::size(x) : std::size(x) / Model::in_features;
  const std::size_t target_bytes_per_row = std::size(y) * sizeof(*std::data(y)) / rows;
  std::vector<Remat> policies = options.remat;
  if constexpr (!detail::Offload<Backend>::supported) std::erase(policies, Remat::offload);
  return choose_plan<Model, Precision>(rows, costs, limits, policies,
                                       options.optimizer_state_per_param, target_bytes_per_row);
}

}  // namespace gpipe
