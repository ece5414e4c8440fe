#pragma once
// Interleaved 1F1B (Narayanan et al., 2021, Megatron-LM): each of the K devices holds V model
// chunks, placed round robin (stage s = c*K + d, so device d holds stages d, d+K, ...). A
// micro-batch visits every device V times, each visit 1/V of the work, so the fill and the
// drain shrink V-fold: with equal op costs the bubble is ((K-1)/V) / (M + (K-1)/V) for every
// M >= K, where 1F1B has (K-1)/(M+K-1). Peak live stashes on device d: min(MV, K-d + (V-1)G_0)
// chunk stashes, each 1/V of a stage's (G_0 below; on device 0 that is VK, K micro-batches'
// worth as in 1F1B, when K divides M).
//
// Order. Every device walks the same two tables of its N = M*V (chunk, micro-batch) pairs:
//   forward table T    micro-batches in q = max(1, floor(M/K)) consecutive groups; group g of
//                      size G_g lists chunk 0 for its micro-batches, then chunk 1, ..., chunk V-1
//   backward table T'  T with chunk c replaced by V-1-c (the last chunk's gradients come first)
// Group sizes differ by at most one, larger first (G_0 >= G_1 >= ...); each is >= K when M >= K
// and the single group is all of M when M < K. Device d, with w_d = min(N, (K-1-d) + (V-1)*G_0)
// warm-up forwards, runs
//   warm-up    F(T[0]) .. F(T[w_d - 1])
//   steady     F(T[w_d + j]), B W(T'[j])      for j = 0 .. N-w_d-1
//   cool-down  B W(T'[j])                     for j = N-w_d .. N-1
// with the transfers of schedule/op.hpp around each op; as in GPipe and 1F1B, B and W run back
// to back and the gradient leaves after W. V = 1 is exactly make_1f1b_schedule.
//
// Why these choices:
//   - Groups of >= K micro-batches: chunk c+1 of a micro-batch starts on device 0 only after
//     its chunk c crossed all K devices, K forward slots later; a group of K keeps device 0 busy
//     meanwhile. Megatron's last group holds the M mod K leftovers and stalls every device at
//     each chunk switch (K=4, V=2, M=5: bubble 0.375, not 0.231); spreading the leftovers over
//     the groups keeps the bubble at the formula above for every M >= K.
//   - Larger groups first: B(T'[j]) needs F of the same (chunk, mb) on its device, which sits at
//     most (V-1)*G_g entries later in T than j sits in T'; warm-up covers (V-1)*G_0 >= that.
//   - One warm-up forward per hop, K-1-d, as in 1F1B. Megatron warms up 2(K-1-d) + (V-1)K:
//     more stashes, no gain with buffered sends, and with its short last group it deadlocks
//     here (the validator finds it at K=4, V=3, M=5: device 0 waits for an activation that
//     device 3 sends only after a gradient that waits on device 0).
//   - M < K: one group of M. Devices d <= K-1-M only warm up (w_d = N), breadth first over the
//     V rounds; the pipeline cannot be full with fewer micro-batches than devices.
// With equal costs per op the makespan is (F+B+W) * (V*max(M, K) + min(M, K) - 1) for all K, V,
// M (tests/schedule/test_interleaved.cpp), so for M < K the bubble is
// (V(K-M) + M-1) / (VK + M-1).
//
// Deadlock freedom, for every K, V, M. Give each compute op the key (p, t), compared
// lexicographically, where p = i - w_d for F(T[i]) and p = j + 1/2 for B(T'[j]) on device d, and
// t = s for a forward and t = -s for a backward of stage s. Along each list p strictly increases
// (F(T[i]) precedes B(T'[j]) iff i - w_d <= j), so keys increase along every list. Each recv
// blocks only its compute op, on the compute op that feeds its send, and that op has a
// strictly smaller key:
//   F(T[i]) on d > 0   waits for F(T[i]) on d-1: w_{d-1} >= w_d, so p is not larger; t = s-1 < s
//   F(T[i]) on 0       waits for chunk c-1 on K-1, F(T[i - G_g]): w_0 <= w_{K-1} + G_g (G_g >= K-1
//                      when M >= K; w_0 = N = w_{K-1} + M when M < K); t = cK-1 < cK
//   B(T'[j]) on d < K-1  waits for B(T'[j]) on d+1: same p; t = -(s+1) < -s
//   B(T'[j]) on K-1      waits for chunk c+1 on 0, B(T'[j - G_g]): p is G_g smaller
// If the lists stalled, the stalled compute op with the smallest key would wait for an op with
// a smaller key that has not run, on a device whose next op has a key no larger: a stalled op
// with a smaller key, a contradiction. validate() checks the same for each schedule it is given.

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {
namespace detail {

struct ChunkMicroBatch {
  std::size_t chunk;
  std::size_t micro_batch;
};

// (K, V, M) => the forward table T above: M*V (chunk, micro-batch) pairs in groups of >= K
// micro-batches (one group when M < K), larger groups first, chunks in order within a group.
constexpr std::vector<ChunkMicroBatch> interleaved_forward_order(std::size_t num_devices,
                                                                 std::size_t num_chunks,
                                                                 std::size_t num_micro_batches) {
  const std::size_t groups = std::max<std::size_t>(1, num_micro_batches / num_devices);
  std::vector<ChunkMicroBatch> order;
  order.reserve(num_micro_batches * num_chunks);
  std::size_t begin = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t size = num_micro_batches / groups + (g < num_micro_batches % groups ? 1 : 0);
    for (std::size_t chunk = 0; chunk < num_chunks; ++chunk) {
      for (std::size_t mb = begin; mb < begin + size; ++mb) order.push_back({chunk, mb});
    }
    begin += size;
  }
  return order;
}

// (K, M) => G_0, the size of the first (largest) group of interleaved_forward_order.
constexpr std::size_t interleaved_first_group(std::size_t num_devices,
                                              std::size_t num_micro_batches) {
  const std::size_t groups = std::max<std::size_t>(1, num_micro_batches / num_devices);
  return (num_micro_batches + groups - 1) / groups;
}

}  // namespace detail

/// (K, V, M) => device d: w_d = min(MV, K-1-d + (V-1) G_0) x F(T[i]), then (F(T[w_d+j]),
/// B W(T'[j])) for each remaining j, then the remaining B W(T'[j]); T, T', G_0 as above.
/// Throws Error when K, V or M is 0.
constexpr Schedule make_interleaved_schedule(std::size_t num_devices, std::size_t num_chunks,
                                             std::size_t num_micro_batches) {
  Schedule schedule = detail::empty_schedule("an interleaved 1F1B schedule", num_devices,
                                             num_micro_batches, num_chunks);
  const std::vector<detail::ChunkMicroBatch> order =
      detail::interleaved_forward_order(num_devices, num_chunks, num_micro_batches);
  const std::size_t n = order.size();
  const std::size_t first_group = detail::interleaved_first_group(num_devices, num_micro_batches);
  for (std::size_t device = 0; device < num_devices; ++device) {
    detail::Program program(schedule, device);
    const auto forward = [&](std::size_t i) {
      program.forward(order[i].micro_batch, order[i].chunk);
    };
    const auto backward = [&](std::size_t j) {  // T'[j]: T[j] with its chunk mirrored
      program.backward(order[j].micro_batch, num_chunks - 1 - order[j].chunk);
    };
    const std::size_t warm_up =
        std::min(n, (num_devices - 1 - device) + (num_chunks - 1) * first_group);
    for (std::size_t i = 0; i < warm_up; ++i) forward(i);
    for (std::size_t j = 0; j + warm_up < n; ++j) {
      forward(warm_up + j);
      backward(j);
    }
    for (std::size_t j = n - warm_up; j < n; ++j) backward(j);
  }
  return schedule;
}

namespace detail {
inline constexpr char interleaved_name_prefix[] = "interleaved-";
}  // namespace detail

/// Schedule tag for Trainer's schedule argument: interleaved 1F1B with V stages per device, so a
/// model with V*K stages runs on K devices; name `"interleaved-V"` with V's digits, make(K, M) =
/// make_interleaved_schedule(K, V, M).
template <std::size_t V>
struct Interleaved : detail::RoundRobinScheduleKind<V, detail::interleaved_name_prefix,
                                                    make_interleaved_schedule> {
  static_assert(V >= 1, "gpipe: Interleaved<V> needs at least one chunk per device");
};

}  // namespace gpipe
