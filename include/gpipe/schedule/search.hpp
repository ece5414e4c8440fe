#pragma once
// search_schedule: from measured op costs (per device F, B, W and the transfer time) and a limit
// on the activation stashes a device may hold at once, the one-stage-per-device schedule with
// the smallest simulated makespan that the search finds; never worse than the best built-in
// schedule of one stage per device (GPipe, 1F1B, ZB-H1, ZB-H2) that fits the limit, since those
// are candidates too.
//
// The candidates besides the built-ins come from list scheduling (schedule/detail/
// list_schedule.hpp), the heuristic of the Zero Bubble paper's automatic scheduler (Qi et al.,
// 2023, section 4): whenever a device is free it starts, among the ops whose data are there,
// the first by a priority order, e.g. B (it is on the critical path: the gradient waits for it
// upstream), F while the device holds fewer than its limit of stashes, W (never needed by another
// device, so W's fill the gaps). The search runs every priority order of F, B and W
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
#include "gpipe/schedule/detail/list_schedule.hpp"
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

/// The schedule with the smallest simulated makespan that the search finds for K devices and M
/// micro-batches, one stage per device, under `search`'s costs and stash limits (see the top of
/// this file): never worse than GPipe's, 1F1B's, ZB-H1's or ZB-H2's where those fit the limits.
/// Throws gpipe::Error for K or M of 0, costs or limits of another length than 1 or K, a limit of
/// 0, or limits that no schedule fits.
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
  consider(make_zb_h2_schedule(k, m));
  const std::size_t most = *std::max_element(limit.begin(), limit.end());
  const Schedule shape = detail::empty_schedule("search_schedule", k, m, 1);
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
      consider(detail::list_schedule(shape, costs, capped, p));
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
