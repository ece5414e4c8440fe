#pragma once
// DualPipeV (DeepSeek's "cut-in-half" DualPipe, from the DeepSeek-V3 report's DualPipe): 2K
// stages on K devices in a V (Placement::v_shape: device d holds stage d, its chunk 0, and stage
// 2K-1-d, its chunk 1), so every micro-batch goes down the devices through the chunk 0's and
// back up through the chunk 1's, and device 0 holds both the first stage and the loss. Its
// order pairs a forward of one chunk with a backward of the other (DeepSeek's implementation
// runs each such pair overlapped, to hide the pair's communication behind the other's compute;
// here they run one after the other on the device's stream) and splits B and W where W's can
// fill the warm-up and the drain. Device d (F0/F1: the next forward of chunk 0/1, B0/B1 the
// next backward, B-only when "zb", else B with its W right after; W: the oldest postponed W):
//   1  (K-1-d)*2 times                          F0
//   2  d+1 times                                F0 F1
//   3  K-1-d times                              B1(zb) W F1
//   4  M-2K+d+1 times                           F0 B1 F1 B0
//   5  K-1-d times                              B1 F1 B0
//   6  d+1 times                                B1 B0; from the middle on (from B1 on odd d,
//                                               from B0 on even d) zb, so d+1 W's are postponed
//   7  K-1-d times                              W B0(zb)
//   8  d+1 times                                W
// which counts M of each op on both chunks and needs M >= 2K (step 4 at least d+1 times).
// Peak stashes per device: 2K chunk stashes after step 2 (2K-1-d of chunk 0, d+1 of chunk 1),
// and one more at step 4's first F0, before its B1's W frees one: at most 2K+1 chunk stashes,
// K + 1/2 whole-stage ones (DeepSeek's PP+1; tests/schedule/test_v_schedules.cpp). Every op
// carries its transfers (Program), and the validator proves the lists under both send rules.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {
namespace detail {

// One device's list for DualPipeV: each chunk's F's, B's and W's in micro-batch order, and the W's
// of the B's run zero-bubble ("zb") kept back, to run oldest first when the table says W.
class DualPipeVProgram {
 public:
  constexpr DualPipeVProgram(Schedule& schedule, std::size_t device) : program_(schedule, device) {}

  constexpr void forward(std::size_t chunk) { program_.forward(forwards_[chunk]++, chunk); }
  // B, then its W right away, or later (weight()) when `zb`.
  constexpr void backward(std::size_t chunk, bool zb) {
    program_.backward_input(backwards_[chunk]++, chunk);
    if (zb)
      postponed_.push_back(chunk);
    else
      program_.backward_weight(weights_[chunk]++, chunk);
  }
  // The oldest postponed W.
  constexpr void weight() {
    const std::size_t chunk = postponed_[oldest_++];
    program_.backward_weight(weights_[chunk]++, chunk);
  }
  constexpr void remaining_weights() {
    while (oldest_ < postponed_.size()) weight();
  }

 private:
  Program program_;
  std::size_t forwards_[2] = {0, 0}, backwards_[2] = {0, 0}, weights_[2] = {0, 0};
  std::vector<std::size_t> postponed_;  // chunks whose B ran without its W, oldest first
  std::size_t oldest_ = 0;              // postponed_[oldest_] is the next W's
};

}  // namespace detail

/// (K, M) => DualPipeV on K devices of 2 chunks each in a V (see the top of this file). Throws
/// Error when K is 0 or M < 2K.
constexpr Schedule make_dual_pipe_v_schedule(std::size_t num_devices,
                                             std::size_t num_micro_batches) {
  Schedule schedule = detail::empty_schedule("a DualPipeV schedule", num_devices, num_micro_batches,
                                             2, Placement::v_shape);
  const std::size_t k = num_devices, m = num_micro_batches;
  if (m < 2 * k) {
    throw Error("gpipe: DualPipeV needs at least 2K micro-batches (2 per stage of its V): K = " +
                std::to_string(k) + " devices need M >= " + std::to_string(2 * k) +
                ", got M = " + std::to_string(m));
  }
  for (std::size_t d = 0; d < k; ++d) {
    detail::DualPipeVProgram program(schedule, d);
    for (std::size_t i = 0; i < (k - 1 - d) * 2; ++i) program.forward(0);  // 1
    for (std::size_t i = 0; i < d + 1; ++i) {                              // 2
      program.forward(0);
      program.forward(1);
    }
    for (std::size_t i = 0; i < k - 1 - d; ++i) {  // 3
      program.backward(1, true);
      program.weight();
      program.forward(1);
    }
    for (std::size_t i = 0; i < m - 2 * k + d + 1; ++i) {  // 4
      program.forward(0);
      program.backward(1, false);
      program.forward(1);
      program.backward(0, false);
    }
    for (std::size_t i = 0; i < k - 1 - d; ++i) {  // 5
      program.backward(1, false);
      program.forward(1);
      program.backward(0, false);
    }
    bool zb = false;
    for (std::size_t i = 0; i < d + 1; ++i) {  // 6
      if (i == (d + 1) / 2 && d % 2 == 1) zb = true;
      program.backward(1, zb);
      if (i == (d + 1) / 2 && d % 2 == 0) zb = true;
      program.backward(0, zb);
    }
    for (std::size_t i = 0; i < k - 1 - d; ++i) {  // 7
      program.weight();
      program.backward(0, true);
    }
    program.remaining_weights();  // 8
  }
  return schedule;
}

/// Schedule tag for Trainer's schedule argument: DualPipeV, 2 stages per device in a V (device d
/// runs stages d and 2K-1-d), so a model of 2K stages runs on K devices; M >= 2K micro-batches.
struct DualPipeV {
  /// Stages per device: a model of S stages runs on S / 2 devices (S must be even).
  static constexpr std::size_t chunks_per_device = 2;
  /// Name in benchmark labels and test output.
  static constexpr std::string_view name = "dualpipe-v";

  /// The schedule for K devices and M micro-batches: make_dual_pipe_v_schedule(K, M).
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return make_dual_pipe_v_schedule(num_devices, num_micro_batches);
  }
};

}  // namespace gpipe
