#pragma once
// search_schedule: from measured op costs (per device F, B, W and the transfer time) and a limit
// on the activation stashes a device may hold at once, the one-stage-per-device schedule with
// the smallest simulated makespan that the search finds; never worse than the best built-in
// schedule (GPipe, 1F1B, ZB-H1) that fits the limit, since those are candidates too.
//
// The candidates besides the built-ins come from list scheduling, the heuristic of the Zero
// Bubble paper's automatic scheduler (Qi et al., 2023, section 4): time runs on every device at
// once, and whenever a device is free it starts, among the ops whose data are there, the first
// by a priority order: B (it is on the critical path: the gradient waits for it upstream), F
// while the device holds fewer than its limit of stashes (a stash lives from F to W), W; a
// device with nothing ready waits for the earliest op that becomes ready. W's are never needed
// by another device, so they fill the gaps. The search runs every priority order of F, B and W
// and every stash limit from the least that lets the step finish up to the given one (a lower
// limit holds back forwards, which can shorten the wait for a gradient), and keeps the best by
// simulate() of the generated lists (which the validator proves). Deterministic: ties go to the
// earlier candidate in that order, the built-ins first.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/gpipe.hpp"
#include "gpipe/schedule/one_f_one_b.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/schedule/validator.hpp"
#include "gpipe/schedule/zero_bubble.hpp"

namespace gpipe {

/// What search_schedule searches under: per device its op costs (one entry: the same on every
/// device) and the most activation stashes it may hold at once (one entry: the same limit for
/// every device; a micro-batch's stash of the device's stage counts one).
struct ScheduleSearch {
  std::vector<OpCosts> costs;            ///< [device] or one for all
  std::vector<std::size_t> max_stashes;  ///< [device] or one for all; each >= 1
};

namespace detail {

// The three compute kinds in a priority order.
using Priority = std::array<OpKind, 3>;

// List scheduling (see the top of this file) of K devices, M micro-batches, one stage each:
// the per-device compute order, or an empty schedule when the limits let no order finish.
constexpr Schedule list_schedule(std::size_t k, std::size_t m, const std::vector<OpCosts>& costs,
                                 const std::vector<std::size_t>& limit, const Priority& priority) {
  constexpr double never = std::numeric_limits<double>::infinity();
  // done[kind][d][mb]: when that op finished (never: not yet)
  std::array<std::vector<std::vector<double>>, 3> done;
  for (auto& kind : done) kind.assign(k, std::vector<double>(m, never));
  std::vector<double> free(k, 0);
  std::vector<std::size_t> next_f(k, 0), next_b(k, 0), next_w(k, 0), live(k, 0);
  std::vector<std::vector<std::array<std::size_t, 2>>> order(k);  // (kind index, mb)
  auto index = [](OpKind kind) {
    return kind == OpKind::forward ? 0 : kind == OpKind::backward_input ? 1 : 2;
  };
  auto cost = [&](std::size_t d, std::size_t kind) {
    const OpCosts& c = costs[d];
    return kind == 0 ? c.forward : kind == 1 ? c.backward_input : c.backward_weight;
  };
  // When device d's next op of `kind` may start (its data are there), or never.
  auto ready = [&](std::size_t d, std::size_t kind) -> double {
    if (kind == 0) {
      const std::size_t mb = next_f[d];
      if (mb >= m || live[d] >= limit[d]) return never;
      return d == 0 ? 0 : done[0][d - 1][mb] + costs[d - 1].transfer;
    }
    if (kind == 1) {
      const std::size_t mb = next_b[d];
      if (mb >= m || mb >= next_f[d]) return never;
      return d + 1 == k ? done[0][d][mb] : done[1][d + 1][mb] + costs[d + 1].transfer;
    }
    const std::size_t mb = next_w[d];
    return mb < m && mb < next_b[d] ? done[1][d][mb] : never;
  };
  std::size_t remaining = 3 * k * m;
  while (remaining > 0) {
    // the device that can start an op earliest, and which op: the first by priority among those
    // ready by then
    std::size_t best_d = k, best_kind = 3;
    double best_t = never;
    for (std::size_t d = 0; d < k; ++d) {
      double earliest = never;
      for (std::size_t kind = 0; kind < 3; ++kind) earliest = std::min(earliest, ready(d, kind));
      if (earliest == never) continue;
      const double t = std::max(free[d], earliest);
      if (t < best_t) {
        best_t = t;
        best_d = d;
        for (OpKind p : priority)
          if (std::max(free[d], ready(d, index(p))) <= t) {
            best_kind = index(p);
            break;
          }
      }
    }
    if (best_d == k) return Schedule{};  // stalled: the limits let nothing run
    const std::size_t d = best_d, kind = best_kind;
    std::size_t& next = kind == 0 ? next_f[d] : kind == 1 ? next_b[d] : next_w[d];
    const std::size_t mb = next++;
    done[kind][d][mb] = best_t + cost(d, kind);
    free[d] = done[kind][d][mb];
    if (kind == 0) ++live[d];
    if (kind == 2) --live[d];
    order[d].push_back({kind, mb});
    --remaining;
  }
  Schedule schedule = empty_schedule("a searched schedule", k, m, 1);
  for (std::size_t d = 0; d < k; ++d) {
    Program program(schedule, d);
    for (const auto& [kind, mb] : order[d]) {
      if (kind == 0) program.forward(mb);
      if (kind == 1) program.backward_input(mb);
      if (kind == 2) program.backward_weight(mb);
    }
  }
  return schedule;
}

}  // namespace detail

/// The schedule with the smallest simulated makespan that the search finds for K devices and M
/// micro-batches, one stage per device, under `search`'s costs and stash limits (see the top of
/// this file): never worse than GPipe's, 1F1B's or ZB-H1's where those fit the limits. Throws
/// gpipe::Error for K or M of 0, costs or limits of another length than 1 or K, a limit of 0, or
/// limits that no schedule fits.
constexpr Schedule search_schedule(std::size_t num_devices, std::size_t num_micro_batches,
                                   const ScheduleSearch& search) {
  const std::size_t k = num_devices, m = num_micro_batches;
  (void)detail::empty_schedule("search_schedule", k, m, 1);  // checks K and M
  auto per_device = [&](const auto& values, const char* what) {
    if (values.size() != 1 && values.size() != k)
      throw Error(std::string("gpipe: search_schedule needs ") + what + " for 1 or " +
                  std::to_string(k) + " devices, got " + std::to_string(values.size()));
    using T = typename std::decay_t<decltype(values)>::value_type;
    return values.size() == 1 ? std::vector<T>(k, values[0]) : values;
  };
  const std::vector<OpCosts> costs = per_device(search.costs, "costs");
  const std::vector<std::size_t> limit = per_device(search.max_stashes, "max_stashes");
  for (std::size_t l : limit)
    if (l == 0) throw Error("gpipe: search_schedule: a device must hold at least one stash");

  Schedule best;
  double best_makespan = std::numeric_limits<double>::infinity();
  auto consider = [&](Schedule candidate) {
    if (candidate.ops.empty()) return;
    const SimulationResult r = simulate(candidate, costs);
    for (std::size_t d = 0; d < k; ++d)
      if (r.peak_live_activations[d] > limit[d]) return;
    if (r.makespan < best_makespan) {
      best_makespan = r.makespan;
      best = std::move(candidate);
    }
  };
  consider(make_gpipe_schedule(k, m));
  consider(make_1f1b_schedule(k, m));
  consider(make_zb_h1_schedule(k, m));
  const std::size_t most = *std::max_element(limit.begin(), limit.end());
  for (const detail::Priority& p :
       {detail::Priority{OpKind::backward_input, OpKind::forward, OpKind::backward_weight},
        detail::Priority{OpKind::backward_input, OpKind::backward_weight, OpKind::forward},
        detail::Priority{OpKind::forward, OpKind::backward_input, OpKind::backward_weight},
        detail::Priority{OpKind::forward, OpKind::backward_weight, OpKind::backward_input},
        detail::Priority{OpKind::backward_weight, OpKind::backward_input, OpKind::forward},
        detail::Priority{OpKind::backward_weight, OpKind::forward, OpKind::backward_input}})
    for (std::size_t cap = 1; cap <= most; ++cap) {
      std::vector<std::size_t> capped(k);
      for (std::size_t d = 0; d < k; ++d) capped[d] = std::min(cap, limit[d]);
      consider(detail::list_schedule(k, m, costs, capped, p));
    }
  if (best.ops.empty()) throw Error("gpipe: search_schedule: no schedule fits the stash limits");
  return best;
}

/// Schedule tag for Trainer's schedule argument: one stage per device, a schedule chosen by
/// search_schedule. Its own make(K, M) searches with equal op costs and 1F1B's memory (K stashes
/// a device), which gives ZB-H1's makespan; give the trainer a schedule searched from measured
/// costs (gpipe::measure_op_costs) in Options::schedule.
struct SearchedSchedule {
  /// Stages per device: a model of S stages runs on S devices.
  static constexpr std::size_t chunks_per_device = 1;
  /// Name in benchmark labels and test output.
  static constexpr std::string_view name = "searched";

  /// search_schedule(K, M) with equal costs and K stashes a device.
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return search_schedule(num_devices, num_micro_batches,
                           {.costs = {OpCosts{}}, .max_stashes = {num_devices}});
  }
};

}  // namespace gpipe
