#pragma once
// The inference program: the forward half of a pipeline, what Trainer::predict runs. A schedule
// like the others (forward_only: no backward ops, the last stage computes no loss), so the
// validator proves it and the runtime walks it as it walks a training step.
//
// Every device runs its stages' ops in (micro-batch, stage) order:
//   for mb in 0..M-1:  for each stage s of the device, ascending:  [recv_activation] F
//   [send_activation]
// Deadlock freedom, under both send rules: an op of (mb, s) depends only on ops of (mb, s-1),
// which come earlier in the lexicographic order of (mb, s); every device's list follows that
// order, so the least unfinished op of all devices always stands at the head of its list with
// its partner posted or done.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// (K, M, chunks, placement) => the forward_only program of a pipeline of K * chunks stages
/// placed as `placement` says: per device, for each micro-batch, its stages in pipeline order,
/// each as [recv_activation] forward [send_activation]. Throws Error when K, M or chunks is 0
/// or M does not fit an Op's micro_batch.
constexpr Schedule make_inference_schedule(std::size_t num_devices, std::size_t num_micro_batches,
                                           std::size_t num_chunks = 1,
                                           Placement placement = Placement::round_robin) {
  if (num_devices == 0 || num_micro_batches == 0 || num_chunks == 0)
    throw Error("gpipe: an inference program needs at least one device, micro-batch and chunk");
  if (num_micro_batches > std::numeric_limits<std::uint32_t>::max())
    throw Error("gpipe: too many micro-batches for a schedule (more than 2^32 - 1)");
  Schedule schedule{.num_devices = num_devices,
                    .num_micro_batches = num_micro_batches,
                    .num_chunks = num_chunks,
                    .ops = std::vector<std::vector<Op>>(num_devices),
                    .placement = placement,
                    .forward_only = true};
  const std::size_t S = schedule.num_stages();
  for (std::size_t d = 0; d < num_devices; ++d) {
    std::vector<Op>& ops = schedule.ops[d];
    ops.reserve(num_micro_batches * num_chunks * 3);
    for (std::size_t i = 0; i < num_micro_batches; ++i) {
      const auto mb = static_cast<std::uint32_t>(i);
      // chunk c of a device is its c-th stage in pipeline order, under either placement
      for (std::uint32_t c = 0; c < num_chunks; ++c) {
        const std::size_t s = schedule.stage_of(d, c);
        if (s > 0) ops.push_back({OpKind::recv_activation, mb, c});
        ops.push_back({OpKind::forward, mb, c});
        if (s + 1 < S) ops.push_back({OpKind::send_activation, mb, c});
      }
    }
  }
  return schedule;
}

/// The inference program for the stages and placement of `training` (any schedule of the same
/// pipeline) and `num_micro_batches` micro-batches.
constexpr Schedule inference_schedule_for(const Schedule& training, std::size_t num_micro_batches) {
  return make_inference_schedule(training.num_devices, num_micro_batches, training.num_chunks,
                                 training.placement);
}

}  // namespace gpipe
