#pragma once
// GPipe fill-drain (Huang et al., 2019): all forwards, then all backwards. Simple and the
// reference order, at the price of a bubble of (K-1)/(M+K-1) of the step and M live activation
// stashes per device (K devices, M micro-batches).
//
// Device d (= stage d, one chunk) runs
//   for mb in 0..M-1:    [recv_activation] forward [send_activation]
//   for mb in M-1..0:    [recv_gradient] backward_input backward_weight [send_gradient]
// where the bracketed transfers exist only where the stage has that neighbour. Backwards run in
// reverse micro-batch order so the last forward's activations are consumed first. B and W run
// back to back as the one backward op of the paper; schedules that send the gradient before W
// (zero-bubble) are separate generators.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// (K, M) => per device: M x (recv, F, send), then M x (recv, B, W, send) in reverse order.
/// Throws Error when K or M is 0 or M does not fit an Op's micro_batch.
constexpr Schedule make_gpipe_schedule(std::size_t num_devices, std::size_t num_micro_batches) {
  if (num_devices == 0) throw Error("gpipe: a GPipe schedule needs at least one device, got 0");
  if (num_micro_batches == 0) {
    throw Error("gpipe: a GPipe schedule needs at least one micro-batch, got 0");
  }
  if (num_micro_batches > std::numeric_limits<std::uint32_t>::max()) {
    throw Error("gpipe: too many micro-batches for a schedule (more than 2^32 - 1)");
  }
  Schedule schedule{.num_devices = num_devices,
                    .num_micro_batches = num_micro_batches,
                    .num_chunks = 1,
                    .ops = std::vector<std::vector<Op>>(num_devices)};
  for (std::size_t device = 0; device < num_devices; ++device) {
    const bool first = device == 0;
    const bool last = device + 1 == num_devices;
    std::vector<Op>& ops = schedule.ops[device];
    ops.reserve(num_micro_batches * (3 + (first ? 0 : 2) + (last ? 0 : 2)));
    for (std::size_t i = 0; i < num_micro_batches; ++i) {
      const auto mb = static_cast<std::uint32_t>(i);
      if (!first) ops.push_back({OpKind::recv_activation, mb});
      ops.push_back({OpKind::forward, mb});
      if (!last) ops.push_back({OpKind::send_activation, mb});
    }
    for (std::size_t i = num_micro_batches; i-- > 0;) {
      const auto mb = static_cast<std::uint32_t>(i);
      if (!last) ops.push_back({OpKind::recv_gradient, mb});
      ops.push_back({OpKind::backward_input, mb});
      ops.push_back({OpKind::backward_weight, mb});
      if (!first) ops.push_back({OpKind::send_gradient, mb});
    }
  }
  return schedule;
}

/// Schedule tag for Trainer's schedule argument: fill-drain, one stage per device.
struct GPipe {
  /// Stages per device: a model of S stages runs on S devices.
  static constexpr std::size_t chunks_per_device = 1;
  /// Name in benchmark labels and test output.
  static constexpr std::string_view name = "gpipe";

  /// The schedule for K devices and M micro-batches: make_gpipe_schedule(K, M).
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return make_gpipe_schedule(num_devices, num_micro_batches);
  }
};

}  // namespace gpipe
