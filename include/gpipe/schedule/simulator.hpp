#pragma once
// simulate(schedule, costs) predicts what a schedule costs before running it (costs the same on
// every device, one OpCosts per device, or one per stage): makespan, bubble fraction and peak live
// activation stashes per device, plus every op's start and finish for timelines. It is constexpr,
// so schedules are compared in static_asserts, and it models exactly the execution rules of
// schedule/op.hpp:
//   - each device runs its list in order; an op starts at max(device free, its data ready);
//   - forward, backward_input, backward_weight take their cost and keep the device busy;
//   - sends and recvs take no device time; a recv's data is ready at its send's time + transfer
//     (so a recv starts and finishes at max(device free, send time + transfer)).
// bubble_fraction = 1 - sum(busy) / (num_devices * makespan), 0 when the makespan is 0.
// A stash (stage, micro-batch) is live from its forward to its backward_weight; peaks follow
// list order, independent of costs. issue_order(schedule) is the order in which the runtime
// issues the ops: by their simulated start. simulate_on_cores(schedule, costs, C) is the same with
// the devices sharing C cores (more device threads than cores on a host): n > C devices computing
// at once each advance at C / n of their rate.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/validator.hpp"

namespace gpipe {

/// Duration of each op kind, in any unit of time; all >= 0.
struct OpCosts {
  double forward = 1;          ///< duration of a forward
  double backward_input = 1;   ///< duration of a backward_input (B)
  double backward_weight = 1;  ///< duration of a backward_weight (W)
  double transfer = 0;         ///< from a send to its recv's data being ready
};

/// What simulate() predicts, in the time unit of the OpCosts; the clock starts at 0.
struct SimulationResult {
  double makespan = 0;  ///< when the last op of any device finishes
  /// `1 - sum(busy) / (num_devices * makespan)`: the idle share of the devices' time; 0 when
  /// the makespan is 0.
  double bubble_fraction = 0;
  std::vector<double> busy;                        ///< [device] sum of compute op durations
  std::vector<std::size_t> peak_live_activations;  ///< [device] max stashes alive at once
  /// [device][position]: when `ops[device][position]` starts.
  std::vector<std::vector<double>> start, finish;  ///< [device][position]: when the op ends
};

namespace detail {

[[noreturn]] inline void throw_invalid_schedule(const ValidationResult& result) {
  throw Error("gpipe: cannot simulate an " + describe(result));
}

constexpr double duration(OpKind kind, const OpCosts& costs) {
  switch (kind) {
    case OpKind::forward:
      return costs.forward;
    case OpKind::backward_input:
      return costs.backward_input;
    case OpKind::backward_weight:
      return costs.backward_weight;
    default:
      return 0;
  }
}

// Throws Error unless there is one OpCosts per device or one per stage, and every cost is a
// number >= 0 (NaN fails every comparison, so it is caught too).
constexpr void check_op_costs(std::span<const OpCosts> given, std::size_t num_devices,
                              std::size_t num_stages) {
  if (given.size() != num_devices && given.size() != num_stages) {
    throw Error("gpipe: simulate got op costs for " + std::to_string(given.size()) +
                " devices; the schedule has " + std::to_string(num_devices) +
                (num_stages == num_devices
                     ? std::string()
                     : " devices and " + std::to_string(num_stages) +
                           " stages (one OpCosts per device, or one per stage)"));
  }
  for (const OpCosts& costs : given) {
    if (!(costs.forward >= 0 && costs.backward_input >= 0 && costs.backward_weight >= 0 &&
          costs.transfer >= 0)) {
      throw Error("gpipe: op costs must be non-negative numbers");
    }
  }
}

// The most stashes alive at once in one device's list: a stash lives from its forward to its
// backward_weight, so this depends on the order alone, not on the costs.
constexpr std::size_t peak_live_stashes(const std::vector<Op>& ops) {
  std::size_t live = 0, peak = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::forward) {
      peak = std::max(peak, ++live);
    } else if (op.kind == OpKind::backward_weight) {
      --live;
    }
  }
  return peak;
}

}  // namespace detail

/// Times `schedule` with the costs of each device's ops: per_device[d] for device d (a recv's
/// transfer is its receiving device's), e.g. the op times measured per device of an unbalanced
/// pipeline. With several chunks per device, one OpCosts per stage instead
/// (`schedule.num_stages()` entries) gives each op its own stage's costs, [stage]: the two
/// stages a device runs under ZB-V may differ (the embedding and the loss). With one chunk per
/// device the two readings are the same. Throws Error (and fails constant evaluation) when the
/// schedule is invalid, there is neither one OpCosts per device nor one per stage, or a cost is
/// negative or NaN.
constexpr SimulationResult simulate(const Schedule& schedule, std::span<const OpCosts> per_device) {
  detail::OpIndex index;
  const ValidationResult check = detail::validate_into(schedule, index);
  if (!check) detail::throw_invalid_schedule(check);
  detail::check_op_costs(per_device, schedule.num_devices, schedule.num_stages());
  const std::size_t num_devices = schedule.num_devices;
  const bool per_stage = per_device.size() != num_devices;

  SimulationResult result;
  result.busy.assign(num_devices, 0.0);
  result.peak_live_activations.assign(num_devices, 0);
  result.start.resize(num_devices);
  result.finish.resize(num_devices);
  std::vector<double> free_at(num_devices, 0.0);
  for (std::size_t d = 0; d < num_devices; ++d) {
    result.start[d].assign(schedule.ops[d].size(), 0.0);
    result.finish[d].assign(schedule.ops[d].size(), 0.0);
  }

  // A valid schedule runs to completion, and execute() visits a recv only after its send.
  detail::execute(schedule, index, [&](std::size_t device, std::size_t position) {
    const Op& op = schedule.ops[device][position];
    const std::size_t stage = schedule.stage_of(device, op.chunk);
    const OpCosts& costs = per_device[per_stage ? stage : device];
    double start = free_at[device];
    if (is_recv(op.kind)) {
      const detail::Peer peer = detail::peer_of(op.kind, stage);
      const std::size_t sent_at = index.at(peer.stage, op.micro_batch, peer.kind);
      const double sent = result.finish[schedule.device_of_stage(peer.stage)][sent_at];
      start = std::max(start, sent + costs.transfer);
    }
    const double cost = detail::duration(op.kind, costs);
    result.start[device][position] = start;
    result.finish[device][position] = start + cost;
    result.busy[device] += cost;
    free_at[device] = start + cost;
  });

  double total_busy = 0;
  for (std::size_t d = 0; d < num_devices; ++d) {
    result.makespan = std::max(result.makespan, free_at[d]);
    total_busy += result.busy[d];
    result.peak_live_activations[d] = detail::peak_live_stashes(schedule.ops[d]);
  }
  if (result.makespan > 0) {
    result.bubble_fraction =
        1.0 - total_busy / (static_cast<double>(num_devices) * result.makespan);
  }
  return result;
}

/// Times `schedule` with the same costs on every device. Throws Error (and fails constant
/// evaluation) when the schedule is invalid or a cost is negative or NaN.
constexpr SimulationResult simulate(const Schedule& schedule, const OpCosts& costs = {}) {
  const std::vector<OpCosts> per_device(schedule.num_devices, costs);
  return simulate(schedule, std::span<const OpCosts>(per_device));
}

/// simulate()'s rules on devices that share `cores` cores (a host backend with more device threads
/// than cores): an op's cost is its work on a core of its own, and while n devices compute at
/// once, n > cores, each advances at cores / n of that rate (the OS shares the cores evenly), so
/// its duration stretches. `cores` of 0, or at least the schedule's devices, gives simulate()'s
/// result. start, finish and busy are the stretched times, as a trace of the step records them;
/// peaks as simulate()'s. Costs per device or per stage as simulate()'s. Throws Error (and fails
/// constant evaluation) when the schedule is invalid, the costs are not one per device or one
/// per stage, a cost is negative or NaN, or `cores` is negative or NaN.
constexpr SimulationResult simulate_on_cores(const Schedule& schedule,
                                             std::span<const OpCosts> costs, double cores) {
  detail::OpIndex index;
  const ValidationResult check = detail::validate_into(schedule, index);
  if (!check) detail::throw_invalid_schedule(check);
  detail::check_op_costs(costs, schedule.num_devices, schedule.num_stages());
  if (!(cores >= 0)) throw Error("gpipe: simulate_on_cores needs cores >= 0");
  const std::size_t K = schedule.num_devices;
  const bool per_stage = costs.size() != K;
  const auto costs_at = [&](std::size_t d, const Op& op) -> const OpCosts& {
    return costs[per_stage ? schedule.stage_of(d, op.chunk) : d];
  };

  SimulationResult result;
  result.busy.assign(K, 0.0);
  result.peak_live_activations.assign(K, 0);
  result.start.resize(K);
  result.finish.resize(K);
  for (std::size_t d = 0; d < K; ++d) {
    result.start[d].assign(schedule.ops[d].size(), 0.0);
    result.finish[d].assign(schedule.ops[d].size(), 0.0);
  }
  // next[d]: the first op of d not yet started; left[d]: the work its running op still has
  // (< 0: none runs, so next[d] waits for its data or d is done)
  std::vector<std::size_t> next(K, 0);
  std::vector<double> left(K, -1.0);
  double now = 0;
  for (;;) {
    // start what can start at `now`: transfers take no time, so follow them until a compute op
    // starts or a recv's data is not there yet (wake: when the earliest such data arrives)
    double wake = -1;
    for (bool moved = true; moved;) {
      moved = false;
      for (std::size_t d = 0; d < K; ++d) {
        const std::vector<Op>& ops = schedule.ops[d];
        while (left[d] < 0 && next[d] < ops.size()) {
          const Op& op = ops[next[d]];
          if (is_recv(op.kind)) {
            const OpPlace sender = detail::partner_place(schedule, index, d, op);
            if (sender.position >= next[sender.device]) break;  // its send has not run
            const double ready =
                result.finish[sender.device][sender.position] + costs_at(d, op).transfer;
            if (ready > now) {
              wake = wake < 0 ? ready : std::min(wake, ready);
              break;
            }
          }
          const std::size_t p = next[d]++;
          result.start[d][p] = now;
          result.finish[d][p] = now;
          const double work = detail::duration(op.kind, costs_at(d, op));
          if (work > 0) left[d] = work;
          moved = true;
        }
      }
    }
    std::size_t running = 0;
    for (std::size_t d = 0; d < K; ++d) running += left[d] >= 0 ? 1 : 0;
    if (running == 0 && wake < 0) break;  // every list is done (a valid schedule cannot stall)
    const double n = static_cast<double>(running);
    const double rate = cores > 0 && n > cores ? cores / n : 1.0;
    // the next event: the first running op to end, or the first awaited data to arrive
    double step = wake < 0 ? -1 : wake - now;
    for (std::size_t d = 0; d < K; ++d)
      if (left[d] >= 0) step = step < 0 ? left[d] / rate : std::min(step, left[d] / rate);
    now += step;
    for (std::size_t d = 0; d < K; ++d) {
      if (left[d] < 0) continue;
      left[d] -= step * rate;
      const std::size_t p = next[d] - 1;
      const double cost =
          detail::duration(schedule.ops[d][p].kind, costs_at(d, schedule.ops[d][p]));
      if (left[d] <= cost * 1e-12) {  // this op ends now (rounding aside)
        left[d] = -1.0;
        result.finish[d][p] = now;
        result.busy[d] += now - result.start[d][p];
      }
    }
  }

  double total_busy = 0;
  for (std::size_t d = 0; d < K; ++d) {
    for (const double f : result.finish[d]) result.makespan = std::max(result.makespan, f);
    total_busy += result.busy[d];
    result.peak_live_activations[d] = detail::peak_live_stashes(schedule.ops[d]);
  }
  if (result.makespan > 0)
    result.bubble_fraction = 1.0 - total_busy / (static_cast<double>(K) * result.makespan);
  return result;
}

/// (device, position) of every op of a valid schedule, in the order in which to issue them to
/// the devices' streams: by simulated start time under `costs` (ties: the lower device first),
/// each device's list in order, every recv after its matching send (a stream's event wait must
/// follow its record, as CUDA's must). So the ops reach their streams about when their devices get
/// to them: a device's work is never held back behind another device's whole list (a fill-drain
/// schedule issued device by device would hand device 1 its first op only after device 0's M
/// forwards). Throws Error for an invalid schedule.
///
/// The start times along the order never decrease: the op with the earliest start among the
/// devices' next ops is a recv whose send is not issued yet only if that send, which starts no
/// later, is the next op of its own device; following such sends ends at an op that can be
/// issued (a valid schedule has no cycle of them), with the same earliest start.
constexpr std::vector<OpPlace> issue_order(const Schedule& schedule, const OpCosts& costs = {}) {
  const SimulationResult timed = simulate(schedule, costs);  // validates, else throws
  detail::OpIndex index;
  (void)detail::validate_into(schedule, index);
  std::size_t total = 0;
  for (const std::vector<Op>& ops : schedule.ops) total += ops.size();
  std::vector<OpPlace> order;
  order.reserve(total);
  std::vector<std::size_t> next(schedule.num_devices, 0);
  while (order.size() < total) {
    OpPlace pick{schedule.num_devices, 0};
    for (std::size_t d = 0; d < schedule.num_devices; ++d) {
      const std::size_t p = next[d];
      if (p == schedule.ops[d].size()) continue;
      const Op& op = schedule.ops[d][p];
      if (is_recv(op.kind)) {
        const OpPlace sender = detail::partner_place(schedule, index, d, op);
        if (sender.position >= next[sender.device]) continue;  // its send is not issued yet
      }
      if (pick.device == schedule.num_devices ||
          timed.start[d][p] < timed.start[pick.device][pick.position])
        pick = {d, p};
    }
    // unreachable for a valid schedule: some device can always go on
    if (pick.device == schedule.num_devices) throw Error("gpipe: issue_order found no op to issue");
    order.push_back(pick);
    ++next[pick.device];
  }
  return order;
}

}  // namespace gpipe
