#pragma once
// ZB-H1 and ZB-H2 (Qi et al., 2023, "Zero Bubble Pipeline Parallelism", section 3.1; ZB-H2 at the
// end of this file). ZB-H1: the backward is
// split into B (input gradient, on the critical path) and W (weight gradient, needed only by
// the optimizer). The gradient leaves right after B, so the backward wave crosses a hop in T_B
// instead of T_B + T_W, and W's are postponed into the time devices would otherwise wait. Per
// device the bubble shrinks from 1F1B's (K-1)(T_F + T_B + T_W) to the paper's
// (K-1)(T_F + T_B - T_W): a third of it when T_F = T_B = T_W, at 1F1B's peak memory (K stashes).
//
// Device d (= stage d, one chunk), with w = min(K - 1 - d, M) warm-up forwards as in 1F1B, runs
//   warm-up    F_0 .. F_{w-1}
//   steady     F_{w+j}, B_j, [W_{j-d}]       for j = 0 .. M-w-1
//   cool-down  B_j, [W_{j-d}]                for j = M-w .. M-1
//   tail       the d postponed W's, oldest first
// where [W_{j-d}] exists when j >= d, each F and B with its transfers ([recv_activation] F
// [send_activation], [recv_gradient] B [send_gradient]). Why W_j runs d slots late: once the
// first gradient arrives, device d's forwards arrive one per F + B of its predecessor, so it
// runs F, B pairs without W and hands each gradient upstream as early as the upstream device
// can use it; the d postponed W's fill the drain, where device d would otherwise wait for
// gradients (timeline for K = 4, M = 8, F = B = W, in test_zero_bubble.cpp). The d postponed
// stashes are paid for by the d fewer warm-up forwards than device 0 has: at most
// (K-1-d) + d + 1 = K live stashes on every device (min(M, K)).
//
// With T_W <= T_F the makespan is (M+K-1)(T_F+T_B) + max(M-K+1, 1) T_W: for M >= K exactly the
// paper's bubble (K-1)(T_F+T_B-T_W) per device (tests/schedule/test_zero_bubble.cpp). For M < K
// that is the fill, the last device's M (F, B) pairs, the drain and one W: no order is faster.
// Deadlock freedom: F and B (and their transfers) are in 1F1B's order and W's never
// wait, so the proof in schedule/interleaved.hpp (V = 1) applies unchanged.

#include <cstddef>
#include <string_view>
#include <vector>

#include "gpipe/schedule/detail/list_schedule.hpp"
#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/one_f_one_b.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// (K, M) => device d: 1F1B's F/B order with B and W split, W_{j-d} right after B_j, the last d
/// W's at the end. Throws Error when K or M is 0.
constexpr Schedule make_zb_h1_schedule(std::size_t num_devices, std::size_t num_micro_batches) {
  Schedule schedule = detail::empty_schedule("a ZB-H1 schedule", num_devices, num_micro_batches, 1);
  const std::size_t m = num_micro_batches;
  for (std::size_t device = 0; device < num_devices; ++device) {
    detail::Program program(schedule, device);
    std::size_t weights_done = 0;
    detail::one_f_one_b_order(program, num_devices, device, m, [&](std::size_t j) {
      program.backward_input(j);
      if (j >= device) program.backward_weight(weights_done++);
    });
    while (weights_done < m) program.backward_weight(weights_done++);
  }
  return schedule;
}

/// Schedule tag for Trainer's schedule argument: ZB-H1, one stage per device, B and W split.
struct ZeroBubbleH1 {
  /// Stages per device: a model of S stages runs on S devices.
  static constexpr std::size_t chunks_per_device = 1;
  /// Name in benchmark labels and test output.
  static constexpr std::string_view name = "zb-h1";

  /// The schedule for K devices and M micro-batches: make_zb_h1_schedule(K, M).
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return make_zb_h1_schedule(num_devices, num_micro_batches);
  }
};

/// (K, M) => ZB-H2's order: list scheduling (schedule/detail/list_schedule.hpp, the Zero Bubble
/// paper's heuristic) with equal F, B and W times, priority B, F, W, and ZB-H2's memory, 2K - 1
/// stashes a device: the extra stashes let device d run more forwards ahead than ZB-H1's
/// K - d, which fill the wait for the first gradient. With equal times it ties ZB-H1 (both reach
/// (K-1) T_F + M (T_F + T_B + T_W), the least a synchronous step can take); where T_B > T_W
/// ZB-H1 loses (K-1)(T_B - T_W) to that bound and ZB-H2 little. Throws Error when K or M is 0.
constexpr Schedule make_zb_h2_schedule(std::size_t num_devices, std::size_t num_micro_batches) {
  const Schedule shape =
      detail::empty_schedule("a ZB-H2 schedule", num_devices, num_micro_batches, 1);
  Schedule schedule =
      detail::list_schedule(shape, std::vector<OpCosts>(num_devices, OpCosts{}),
                            std::vector<std::size_t>(num_devices, 2 * num_devices - 1),
                            {OpKind::backward_input, OpKind::forward, OpKind::backward_weight});
  return schedule;
}

/// Schedule tag for Trainer's schedule argument: ZB-H2, one stage per device, B and W split, up
/// to 2K - 1 stashes a device (ZB-H1 and 1F1B: K).
struct ZeroBubbleH2 {
  /// Stages per device: a model of S stages runs on S devices.
  static constexpr std::size_t chunks_per_device = 1;
  /// Name in benchmark labels and test output.
  static constexpr std::string_view name = "zb-h2";

  /// The schedule for K devices and M micro-batches: make_zb_h2_schedule(K, M).
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return make_zb_h2_schedule(num_devices, num_micro_batches);
  }
};

}  // namespace gpipe
