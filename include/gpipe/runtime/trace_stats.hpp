#pragma once
// What a trace says about a step, without writing it anywhere: which records are schedule ops,
// how busy each device was, and the measured bubble fraction
//   bubble = 1 - busy / (K * makespan)
// (K devices, busy = total duration of compute ops, makespan = first compute start to last
// compute end). It is the simulator's bubble_fraction applied to what ran, so the two compare
// directly. trace_of() goes the other way: it turns a simulated schedule into trace records, so
// that a prediction and a measurement are drawn by the same exporters (io/svg_timeline.hpp,
// io/chrome_trace.hpp).
//
// Records are matched to ops by WorkLabel::what, which the executor sets to to_string(OpKind);
// work outside the schedule (an optimizer step, zero_grad, inference) is neither busy nor part of
// the makespan, so a trace of a whole training step measures the pipeline's bubble only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"

namespace gpipe {

/// "backward_input" => OpKind::backward_input; nullopt for work that is not a schedule op.
constexpr std::optional<OpKind> op_kind_of(std::string_view what) {
  for (std::size_t k = 0; k < num_op_kinds; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (to_string(kind) == what) return kind;
  }
  return std::nullopt;
}

/// Work that keeps a device busy: what the executor labels compute (forward, backward_input,
/// backward_weight, and the forwards of predict()), where `is_compute(OpKind)` names the
/// schedule's compute ops. The same flag feeds the trainer's per-step timing, so a trace and
/// last_step() agree on what is busy.
constexpr bool is_busy_work(const WorkLabel& label) { return label.compute; }

/// What a trace measures; all times in microseconds.
struct TraceStats {
  double begin_us = 0;            ///< first compute start
  double end_us = 0;              ///< last compute end
  double makespan_us = 0;         ///< end_us - begin_us; 0 when there is no compute op
  std::vector<double> busy_us{};  ///< [device] total duration of compute ops
  double bubble_fraction = 0;     ///< 1 - sum(busy_us) / (K * makespan_us); 0 when makespan is 0
};

/// Statistics of `events` on devices 0..num_devices-1. Throws Error when an event names a device
/// outside that range or has a non-finite time or an end before its start.
inline TraceStats trace_stats(std::span<const TraceEvent> events, std::size_t num_devices) {
  TraceStats stats;
  stats.busy_us.assign(num_devices, 0.0);
  bool any = false;
  for (const TraceEvent& e : events) {
    if (e.device >= num_devices) {
      throw Error("gpipe: trace event on device " + std::to_string(e.device) + ", but only " +
                  std::to_string(num_devices) + " devices were given");
    }
    if (!std::isfinite(e.start_us) || !std::isfinite(e.end_us) || e.end_us < e.start_us) {
      throw Error("gpipe: trace event '" + describe(e.label, e.device) +
                  "' has an invalid time span [" + std::to_string(e.start_us) + ", " +
                  std::to_string(e.end_us) + "] us");
    }
    if (!is_busy_work(e.label)) continue;
    stats.busy_us[e.device] += e.end_us - e.start_us;
    stats.begin_us = any ? std::min(stats.begin_us, e.start_us) : e.start_us;
    stats.end_us = any ? std::max(stats.end_us, e.end_us) : e.end_us;
    any = true;
  }
  stats.makespan_us = stats.end_us - stats.begin_us;
  if (stats.makespan_us > 0 && num_devices > 0) {
    double busy = 0;
    for (const double b : stats.busy_us) busy += b;
    stats.bubble_fraction = 1.0 - busy / (static_cast<double>(num_devices) * stats.makespan_us);
  }
  return stats;
}

/// 1 - busy / (K * makespan) of `events` on K = num_devices devices; see trace_stats.
inline double measured_bubble(std::span<const TraceEvent> events, std::size_t num_devices) {
  return trace_stats(events, num_devices).bubble_fraction;
}

/// (schedule, simulate(schedule, costs), unit_us) => one record per op, every device, in each
/// device's list order, with times = simulated times * unit_us (so costs in milliseconds and
/// unit_us = 1000 give a trace in microseconds). Sends and recvs are included (they take no
/// simulated time). Throws Error when `result` does not belong to `schedule`.
inline std::vector<TraceEvent> trace_of(const Schedule& schedule, const SimulationResult& result,
                                        double unit_us = 1.0) {
  const std::size_t K = schedule.num_devices;
  bool shapes_match = result.start.size() == K && result.finish.size() == K;
  for (std::size_t d = 0; shapes_match && d < K; ++d) {
    shapes_match = result.start[d].size() == schedule.ops[d].size() &&
                   result.finish[d].size() == schedule.ops[d].size();
  }
  if (!shapes_match || schedule.ops.size() != K) {
    throw Error("gpipe: trace_of: the simulation result does not match the schedule's op lists");
  }
  std::vector<TraceEvent> events;
  for (std::size_t d = 0; d < K; ++d) {
    for (std::size_t i = 0; i < schedule.ops[d].size(); ++i) {
      const Op& op = schedule.ops[d][i];
      events.push_back({.device = d,
                        .label = {.what = to_string(op.kind),
                                  .stage = schedule.stage_of(d, op.chunk),
                                  .micro_batch = op.micro_batch,
                                  .compute = is_compute(op.kind)},
                        .start_us = result.start[d][i] * unit_us,
                        .end_us = result.finish[d][i] * unit_us});
    }
  }
  return events;
}

}  // namespace gpipe
