#pragma once
// 1F1B, PipeDream-Flush (Narayanan et al., 2021): as soon as a device has sent enough forwards
// to keep its successors busy it alternates one forward with one backward, so a micro-batch's
// activations are freed K - d micro-batches after they were stashed instead of after all M. The
// bubble stays GPipe's (K-1)/(M+K-1); the peak of live stashes on device d drops from M to
// min(M, K - d).
//
// Device d (= stage d, one chunk), with w = min(K - 1 - d, M) warm-up forwards, runs
//   warm-up    F_0 .. F_{w-1}
//   steady     F_{w+j}, B_j W_j           for j = 0 .. M-w-1
//   cool-down  B_j W_j                    for j = M-w .. M-1
// each op with its transfers ([recv_activation] F [send_activation], [recv_gradient] B W
// [send_gradient]). B and W run back to back and the gradient leaves after W, as in GPipe and the
// paper, so equal op costs give the textbook bubble; make_zb_h1_schedule separates them.
//
// Why it cannot deadlock, also for M < K: w drops by one per device (or is M on both), so when
// device d waits for the gradient of micro-batch j it has already sent device d+1 every forward
// that device runs before B_j. The proof for the general case is in schedule/interleaved.hpp;
// this schedule is its V = 1.

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

namespace detail {

// 1F1B's order on device `device` of K, one chunk, M micro-batches: w = min(K-1-d, M) warm-up
// forwards, then (F_{w+j}, backward(j)) for each remaining j, then the remaining backward(j);
// `backward(j)` emits micro-batch j's backward ops (ZB-H1 emits its own).
template <class Backward>
constexpr void one_f_one_b_order(Program& program, std::size_t num_devices, std::size_t device,
                                 std::size_t num_micro_batches, Backward backward) {
  const std::size_t m = num_micro_batches;
  const std::size_t warm_up = std::min(num_devices - 1 - device, m);
  for (std::size_t i = 0; i < warm_up; ++i) program.forward(i);
  for (std::size_t j = 0; j + warm_up < m; ++j) {
    program.forward(warm_up + j);
    backward(j);
  }
  for (std::size_t j = m - warm_up; j < m; ++j) backward(j);
}

}  // namespace detail

/// (K, M) => device d: min(K-1-d, M) x F, then (F_{w+j}, B_j W_j) for each remaining j, then the
/// remaining B W. Throws Error when K or M is 0.
constexpr Schedule make_1f1b_schedule(std::size_t num_devices, std::size_t num_micro_batches) {
  Schedule schedule = detail::empty_schedule("a 1F1B schedule", num_devices, num_micro_batches, 1);
  for (std::size_t device = 0; device < num_devices; ++device) {
    detail::Program program(schedule, device);
    detail::one_f_one_b_order(program, num_devices, device, num_micro_batches,
                              [&](std::size_t j) { program.backward(j); });
  }
  return schedule;
}

/// Schedule tag for Trainer's schedule argument: 1F1B (PipeDream-Flush), one stage per device.
struct OneFOneB {
  /// Stages per device: a model of S stages runs on S devices.
  static constexpr std::size_t chunks_per_device = 1;
  /// Name in benchmark labels and test output.
  static constexpr std::string_view name = "1f1b";

  /// The schedule for K devices and M micro-batches: make_1f1b_schedule(K, M).
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return make_1f1b_schedule(num_devices, num_micro_batches);
  }
};

}  // namespace gpipe
