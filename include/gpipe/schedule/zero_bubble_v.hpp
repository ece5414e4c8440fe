#pragma once
// ZB-V (Qi et al., 2024, "Pipeline Parallelism with Controllable Memory", the V-shaped zero
// bubble schedule; PyTorch's ScheduleZBVZeroBubble): 2K stages on K devices in a V
// (Placement::v_shape: device d holds stage d, its chunk 0, and stage 2K-1-d, its chunk 1), B
// and W split. Device d (F0/F1, B0/B1, W0/W1: the next op of that kind on chunk 0/1):
//   warm-up 1   2(K-d)-1 times        F0
//   warm-up 2   d times               F1 F0
//   warm-up 3   K-d times             F1 B1 W1
//   steady      until every F ran     [F0] B0 W0 F1 B1 W1   (F0 while chunk 0 has micro-batches)
//   cool-down   d times               B0 B1
//               K-d times             B0 W0
//               then the W1's, then the W0's left
// Chunk 1 of device K-1 takes its input from chunk 0 of the same device (the V's turn), so the
// pipeline fills with 2(K-d)-1 forwards on device d where 1F1B on 2K stages would need more, and
// the steady phase alternates the chunks' B's, whose W's follow at once. Peak stashes: 2K chunk
// stashes on every device (2(K-d)-1 + d of chunk 0 and chunk 1 after warm-up 2, then one F1 per
// W1), K whole-stage stashes: 1F1B's memory. For M < 2K-1 a phase stops where its micro-batches
// run out (an op is emitted only once the ops it depends on on this device are), and whatever
// is left runs at the end, B's before W's. The validator proves the lists (both send rules,
// after order_for_rendezvous) for every K and M the tests try.

#include <cstddef>
#include <string_view>

#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// (K, M) => ZB-V on K devices of 2 chunks each in a V (see the top of this file). Throws Error
/// when K or M is 0.
constexpr Schedule make_zb_v_schedule(std::size_t num_devices, std::size_t num_micro_batches) {
  Schedule schedule = detail::empty_schedule("a ZB-V schedule", num_devices, num_micro_batches, 2,
                                             Placement::v_shape);
  const std::size_t k = num_devices, m = num_micro_batches;
  for (std::size_t d = 0; d < k; ++d) {
    detail::Program program(schedule, d);
    std::size_t f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
    // Each emits its op when it may run here: an F while its chunk has micro-batches, a B after
    // its F, a W after its B.
    auto forward = [&](std::size_t c) {
      if (f[c] < m) program.forward(f[c]++, c);
    };
    auto backward = [&](std::size_t c) {
      if (b[c] < f[c]) program.backward_input(b[c]++, c);
    };
    auto weight = [&](std::size_t c) {
      if (w[c] < b[c]) program.backward_weight(w[c]++, c);
    };
    for (std::size_t i = 0; i + 1 < 2 * (k - d); ++i) forward(0);
    for (std::size_t i = 0; i < d; ++i) {
      forward(1);
      forward(0);
    }
    for (std::size_t i = 0; i < k - d; ++i) {
      forward(1);
      backward(1);
      weight(1);
    }
    while (f[1] < m || f[0] < m) {
      forward(0);
      backward(0);
      weight(0);
      forward(1);
      backward(1);
      weight(1);
    }
    for (std::size_t i = 0; i < d; ++i) {
      backward(0);
      backward(1);
    }
    for (std::size_t i = 0; i < k - d; ++i) {
      backward(0);
      weight(0);
    }
    while (b[1] < m || b[0] < m) {  // only where M < 2K-1 left B's over
      backward(1);
      backward(0);
    }
    while (w[1] < m) weight(1);
    while (w[0] < m) weight(0);
  }
  return schedule;
}

/// Schedule tag for Trainer's schedule argument: ZB-V, 2 stages per device in a V (device d runs
/// stages d and 2K-1-d), B and W split, 1F1B's memory; a model of 2K stages runs on K devices.
struct ZeroBubbleV {
  /// Stages per device: a model of S stages runs on S / 2 devices (S must be even).
  static constexpr std::size_t chunks_per_device = 2;
  /// Name in benchmark labels and test output.
  static constexpr std::string_view name = "zb-v";

  /// The schedule for K devices and M micro-batches: make_zb_v_schedule(K, M).
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return make_zb_v_schedule(num_devices, num_micro_batches);
  }
};

}  // namespace gpipe
