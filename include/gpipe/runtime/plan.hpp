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
// Two halves: measure_plan_costs (runtime/plan_costs.hpp) times F, B and W per stage for each
// micro-batch count, with and without recompute, and with selective recompute where the model
// has cheap layers (a 1F1B trainer per configuration, or an Interleaved<2> one for two stages
// per device, measure_stage_costs); choose_plan, a pure function of those costs, weighs every
// candidate (one stage per device: GPipe, 1F1B, ZB-H1, ZB-H2 and a schedule searched from the
// costs; two: Interleaved<2>, LoopedBFS<2>, ZB-V and DualPipeV; each with every micro-batch count
// and remat policy, with a policy per device and, with two stages per device, a policy per
// stage): predict_memory's bound (total_bound: exact parameters, gradients, optimizer state and
// activations, a bound on the workspace) against the limit, simulate's makespan with each stage's
// measured costs for the time (simulate_on_cores' where the devices share cores:
// PlanCosts::cores).
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
// uniform ones where it differs from them. With two stages per device there are two mixes: one
// where a device's two stages share its policy, and one where each stage has its own (the
// earlier chunk recomputes, the later keeps its activations, say): there a device picks a
// pattern, a policy per chunk, and each pattern's bounds are predict_memory's with that pattern
// on every device (exact as for a uniform policy, since a device's memory is its own stages').
// Because memory is judged by a bound, a plan never exceeds a limit when run; a candidate whose
// true peak would just fit may be turned away.

#include <algorithm>
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
#include "gpipe/runtime/memory_model.hpp"
#include "gpipe/runtime/offload.hpp"
#include "gpipe/runtime/plan_costs.hpp"
#include "gpipe/runtime/remat.hpp"
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

/// One configuration the planner weighed, and its verdict.
struct PlanCandidate {
  /// The schedule tag's name: "gpipe", "1f1b", "zb-h1", "zb-h2" or "searched" (one stage per
  /// device); "interleaved-2", "looped-bfs-2", "zb-v" or "dualpipe-v" (two)
  std::string schedule;
  std::size_t micro_batches = 0;  ///< M
  /// The remat policy of every stage where they share one; for a policy per device or per stage
  /// (`uniform()` false), the first stage's: `stage_remat` has them all.
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

// A policy per stage for `schedule` at costs.micro_batches, chosen per device among
// `patterns`: a pattern is one policy per chunk (stage s under pattern[chunk_of_stage(s)]), and
// bound[p][d] is device d's memory bound under patterns[p] on every device (a device's memory
// depends on its own stages' policies only, so any choice of a pattern per device has each
// device's bound of its own pattern). Each device takes its cheapest pattern (least F + B + W over
// its stages, the earlier on a tie) among those within its limit, then one device at a time moves
// to another of its fitting patterns while the simulated step gets shorter. Where a device has
// none within its limit, every device's smallest pattern instead (`fits` false). Deterministic.
// With one chunk the patterns are the policies; with two, the uniform pairs give a policy per
// device, and all pairs a policy per stage.
struct PolicyMix {
  std::vector<Remat> policy;  // [stage]
  bool fits = true;
};
inline PolicyMix mix_policies(const Schedule& schedule, const PlanCosts& costs,
                              std::span<const std::vector<Remat>> patterns,
                              const std::vector<std::vector<std::size_t>>& bound,
                              std::span<const std::size_t> limit) {
  const std::size_t K = schedule.num_devices, S = schedule.num_stages();
  // [device] pattern index => [stage] policy
  const auto per_stage = [&](const std::vector<std::size_t>& per_device) {
    std::vector<Remat> out;
    for (std::size_t s = 0; s < S; ++s)
      out.push_back(patterns[per_device[schedule.device_of_stage(s)]][schedule.chunk_of_stage(s)]);
    return out;
  };
  const auto step_of = [&](const std::vector<std::size_t>& per_device) {
    const std::vector<Remat> policy = per_stage(per_device);
    return simulate_step(schedule, costs_of(costs, std::span<const Remat>(policy)), costs.cores)
        .makespan;
  };
  std::vector<std::vector<std::size_t>> fitting(K);  // [device] indices into patterns
  std::vector<std::size_t> choice;                   // [device] index into patterns
  PolicyMix mix;
  for (std::size_t d = 0; d < K; ++d) {
    for (std::size_t p = 0; p < patterns.size(); ++p)
      if (limit[d] == 0 || bound[p][d] <= limit[d]) fitting[d].push_back(p);
    mix.fits = mix.fits && !fitting[d].empty();
  }
  if (!mix.fits) {
    for (std::size_t d = 0; d < K; ++d) {
      std::size_t smallest = 0;
      for (std::size_t p = 1; p < patterns.size(); ++p)
        if (bound[p][d] < bound[smallest][d]) smallest = p;
      choice.push_back(smallest);
    }
    mix.policy = per_stage(choice);
    return mix;
  }
  for (std::size_t d = 0; d < K; ++d) {
    // F + B + W of device d's stages under pattern p
    const auto work = [&](std::size_t p) {
      double sum = 0;
      for (std::size_t s = 0; s < S; ++s)
        if (schedule.device_of_stage(s) == d) {
          const OpCosts c = costs_of(costs, patterns[p][schedule.chunk_of_stage(s)])[s];
          sum += c.forward + c.backward_input + c.backward_weight;
        }
      return sum;
    };
    std::size_t cheapest = fitting[d].front();
    for (const std::size_t p : fitting[d])
      if (work(p) < work(cheapest)) cheapest = p;
    choice.push_back(cheapest);
  }
  double step = step_of(choice);
  // each accepted move shortens the step, so the descent ends; a bound on the passes anyway
  for (std::size_t pass = 0, moved = 1; moved != 0 && pass < K * patterns.size(); ++pass) {
    moved = 0;
    for (std::size_t d = 0; d < K; ++d)
      for (const std::size_t p : fitting[d]) {
        if (p == choice[d]) continue;
        std::vector<std::size_t> trial = choice;
        trial[d] = p;
        const double t = step_of(trial);
        if (t < step) {
          step = t;
          choice = std::move(trial);
          ++moved;
        }
      }
  }
  mix.policy = per_stage(choice);
  return mix;
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
/// LoopedBFS<2>, ZB-V and, where M >= 2K, DualPipeV in their place, none searched, each then
/// with a policy per device and with a policy per stage).
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
  double cores = 0;  // the costs' cores, of the entry being weighed
  const auto weigh = [&](std::string name, std::size_t m, std::vector<Remat> stage_remat,
                         const std::vector<OpCosts>& op_costs, Schedule schedule) {
    PlanCandidate cand;
    cand.schedule = std::move(name);
    cand.micro_batches = m;
    cand.remat = stage_remat.front();
    cand.stage_remat = std::move(stage_remat);
    cand.predicted_us = detail::simulate_step(schedule, op_costs, cores).makespan;
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
    cores = c.cores;
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
    // the patterns of a policy per chunk (detail::mix_policies): first each policy on
    // every chunk, then, with two chunks, every pair of two policies
    const std::size_t chunks = one_chunk ? 1 : 2;
    std::vector<std::vector<Remat>> patterns;
    for (const Remat r : policies) patterns.emplace_back(chunks, r);
    if (!one_chunk)
      for (const Remat first : policies)
        for (const Remat second : policies)
          if (first != second) patterns.push_back({first, second});
    // [kind][pattern][device]: the bound of each built-in schedule under each pattern
    std::vector<std::vector<std::vector<std::size_t>>> bound(
        built_in.size(), std::vector<std::vector<std::size_t>>(patterns.size()));
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
    for (std::size_t k = 0; k < built_in.size(); ++k)
      for (std::size_t p = policies.size(); p < patterns.size(); ++p) {
        std::vector<Remat> stage_remat;
        for (std::size_t s = 0; s < S; ++s)
          stage_remat.push_back(patterns[p][built_in[k].chunk_of_stage(s)]);
        for (const DeviceMemoryPrediction& d : predict_memory<Model, Precision>(
                 built_in[k], rows, stage_remat, optimizer_state_per_param, target_bytes_per_row))
          bound[k][p].push_back(d.total_bound());
      }
    // the mixes, each where it differs from every uniform policy and from the mixes before it: a
    // policy per device (the uniform patterns) and, with two chunks, a policy per stage (every
    // pattern); the searched schedule under 1F1B's mix, searched again from the mix's costs
    const std::span<const std::vector<Remat>> uniform_patterns(patterns.data(), policies.size());
    std::vector<Remat> one_f_one_b_mix;
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      std::vector<detail::PolicyMix> mixes(1);
      if (k < built_in.size()) {
        mixes[0] = detail::mix_policies(built_in[k], c, uniform_patterns, bound[k], limit);
        if (one_chunk && k == 1 && mixes[0].fits) one_f_one_b_mix = mixes[0].policy;
        if (!one_chunk)
          mixes.push_back(detail::mix_policies(built_in[k], c, patterns, bound[k], limit));
      } else {
        mixes[0].policy = one_f_one_b_mix;
      }
      for (std::size_t i = 0; i < mixes.size(); ++i) {
        const std::vector<Remat>& policy = mixes[i].policy;
        if (policy.empty() ||
            std::ranges::all_of(policy, [&](Remat r) { return r == policy.front(); }) ||
            std::any_of(mixes.begin(), mixes.begin() + static_cast<std::ptrdiff_t>(i),
                        [&](const detail::PolicyMix& before) { return before.policy == policy; }))
          continue;
        const std::vector<OpCosts> op_costs = detail::costs_of(c, std::span<const Remat>(policy));
        Schedule schedule = k < built_in.size()
                                ? built_in[k]
                                : search_schedule(K, m, {.costs = op_costs, .max_stashes = {K}});
        weigh(kinds[k], m, policy, op_costs, std::move(schedule));
      }
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

/// The step of `schedule` under a policy per stage (`stage_remat`, [stage]) that the planner
/// predicts from `costs` (measured at the schedule's micro-batch count), in microseconds: the
/// simulated makespan of the op costs with the executor's overhead per op, as choose_plan weighs
/// each candidate (PlanCandidate::predicted_us). With costs measured again later, the same plan's
/// prediction then. Throws gpipe::Error for costs of another micro-batch count or stage count, or
/// a policy list of another length.
inline double predict_step_us(const Schedule& schedule, const PlanCosts& costs,
                              std::span<const Remat> stage_remat) {
  const std::size_t S = schedule.num_stages();
  detail::require(costs.micro_batches == schedule.num_micro_batches, [&] {
    return "predict_step_us: costs measured at " + std::to_string(costs.micro_batches) +
           " micro-batches for a schedule of " + std::to_string(schedule.num_micro_batches);
  });
  detail::require(costs.never.size() == S && costs.always.size() == S &&
                      (costs.selective.empty() || costs.selective.size() == S) &&
                      (costs.offload.empty() || costs.offload.size() == S) &&
                      stage_remat.size() == S,
                  [&] {
                    return "predict_step_us: costs and policies for a schedule of " +
                           std::to_string(S) + " stages";
                  });
  return detail::simulate_step(schedule, detail::costs_of(costs, stage_remat), costs.cores)
      .makespan;
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
