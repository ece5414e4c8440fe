#pragma once
// A training step's timing as the trainer measures it (Trainer::last_step()), and what its
// bubble is made of (Trainer::bubble_breakdown()): pure functions of the devices' timings and the
// schedule, so that they can be checked with timings that did not come from a clock.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"

namespace gpipe {

/// What a forward_backward measured: busy time per device (compute ops only) and the makespan
/// from the first compute start to the last compute end, over all devices. The bubble is the
/// idle fraction of the devices' time in between, 1 - busy / (K makespan).
struct StepStats {
  double makespan_us = 0;      ///< microseconds, first compute start to last compute end
  double busy_us = 0;          ///< summed over devices
  double bubble_fraction = 0;  ///< 1 - busy_us / (num_devices makespan_us); 0 when untimed
  /// [device] each pipeline device's busy time, first start and last end (microseconds) and
  /// compute-op count; empty when the backend does not time work.
  std::vector<ComputeTiming> devices;
};

/// The StepStats of a pipeline of `num_devices` devices from its devices' timings (those past
/// num_devices are dropped; an empty list is an untimed step).
inline StepStats step_stats(std::vector<ComputeTiming> devices, std::size_t num_devices) {
  StepStats stats;
  double first = 0, last = 0;
  bool any = false;
  for (std::size_t d = 0; d < devices.size() && d < num_devices; ++d) {
    const ComputeTiming& t = devices[d];
    if (t.ops == 0) continue;
    first = any ? std::min(first, t.first_start_us) : t.first_start_us;
    last = any ? std::max(last, t.last_end_us) : t.last_end_us;
    any = true;
    stats.busy_us += t.busy_us;
  }
  devices.resize(std::min(devices.size(), num_devices));
  stats.devices = std::move(devices);
  if (!any) return stats;
  stats.makespan_us = last - first;
  if (stats.makespan_us > 0)
    stats.bubble_fraction =
        1 - stats.busy_us / (static_cast<double>(num_devices) * stats.makespan_us);
  return stats;
}

/// What a step's measured bubble is made of: measured = schedule + imbalance + overhead.
struct BubbleBreakdown {
  double measured = 0;  ///< the step's bubble_fraction: 1 - busy / (devices x makespan)
  /// The schedule's own bubble: its simulation with every op taking the step's mean op time;
  /// what remains at zero executor cost on a balanced pipeline ((K-1)/(M+K-1) for GPipe and
  /// 1F1B).
  double schedule = 0;
  /// What uneven stages add: the simulation with each device's ops taking that device's mean op
  /// time (device_op_us), minus `schedule`. A device with more work per op keeps the others
  /// waiting; the executor is not the cause.
  double imbalance = 0;
  /// measured - schedule - imbalance: what the executor adds (hand-overs between devices, waiting
  /// for a worker to wake), and devices waiting for a core when they outnumber the cores. Per op
  /// it is some microseconds on a host (BENCHMARKS.md), so it matters for ops below a millisecond.
  double overhead = 0;
  double mean_op_us = 0;             ///< the step's busy time / its compute ops
  std::vector<double> device_op_us;  ///< [device] its busy time / its compute ops (0: none ran)
  std::size_t busy_devices = 0;      ///< devices of the pipeline that computed in the step
  /// host: busy devices x threads_per_device outnumber the hardware threads
  bool devices_share_cores = false;
};

/// The breakdown of `step`, a step of `schedule` (runs the schedule's simulator twice); all zero
/// but `measured` when the step was not timed. devices_share_cores is left false: it is the
/// backend's to say (Trainer::bubble_breakdown() does).
inline BubbleBreakdown bubble_breakdown(const Schedule& schedule, const StepStats& step) {
  BubbleBreakdown out;
  out.measured = step.bubble_fraction;
  std::size_t ops = 0;
  for (const ComputeTiming& t : step.devices) {
    ops += t.ops;
    if (t.ops > 0) ++out.busy_devices;
    out.device_op_us.push_back(t.ops > 0 ? t.busy_us / static_cast<double>(t.ops) : 0.0);
  }
  if (ops == 0) return out;
  out.mean_op_us = step.busy_us / static_cast<double>(ops);
  const double t = out.mean_op_us;
  out.schedule = simulate(schedule, {t, t, t}).bubble_fraction;
  if (out.device_op_us.size() == schedule.num_devices) {
    std::vector<OpCosts> per_device;
    for (const double d : out.device_op_us) per_device.push_back({d, d, d});
    out.imbalance = simulate(schedule, per_device).bubble_fraction - out.schedule;
  }
  out.overhead = out.measured - out.schedule - out.imbalance;
  return out;
}

}  // namespace gpipe
