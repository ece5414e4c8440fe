#pragma once
// Looped breadth-first (Lamy-Poirier, 2023, "Breadth-First Pipeline Parallelism"; PyTorch's
// ScheduleLoopedBFS): V stages per device placed round robin as in interleaved 1F1B (stage s on
// device s % K, chunk s / K), run breadth first: every micro-batch through a device's first
// chunk, then every micro-batch through its second, ..., then the backwards in the mirrored
// order. Device d runs
//   for c in 0..V-1:     for mb in 0..M-1:      [recv_activation] F(mb, c) [send_activation]
//   for c in V-1..0:     for mb in M-1..0:      [recv_gradient] B W(mb, c) [send_gradient]
// GPipe's order over the looped placement: with M >= K a device never waits between its chunks
// (micro-batch 0 comes back from device K-1 after K chunk-ops, by when the device has M >= K
// chunk-ops of the chunk before to run), so the pipeline fills and drains once per step on
// chunk-sized ops: bubble (K-1)/(VM+K-1) = ((K-1)/V)/(M+(K-1)/V), interleaved 1F1B's, at
// GPipe's memory (every device keeps all M micro-batches' stashes of all its chunks until their
// backwards). For M < K every chunk after the first waits K - M chunk-ops for its first
// micro-batch. Deadlock freedom: every device's list is ordered by (phase, chunk, micro-batch),
// a topological order of the step's dependencies, with buffered sends; under rendezvous sends
// order_for_rendezvous repairs the transfers as for interleaved 1F1B.

#include <cstddef>

#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {
/// (K, V, M) => device d: F(mb, c) for every chunk c in order, micro-batches in order within it;
/// then B W(mb, c) for every chunk from the last, micro-batches from the last. Throws Error when
/// K, V or M is 0.
constexpr Schedule make_looped_bfs_schedule(std::size_t num_devices, std::size_t num_chunks,
                                            std::size_t num_micro_batches) {
  Schedule schedule =
      detail::empty_schedule("a looped BFS schedule", num_devices, num_micro_batches, num_chunks);
  for (std::size_t device = 0; device < num_devices; ++device) {
    detail::Program program(schedule, device);
    for (std::size_t chunk = 0; chunk < num_chunks; ++chunk)
      for (std::size_t mb = 0; mb < num_micro_batches; ++mb) program.forward(mb, chunk);
    for (std::size_t chunk = num_chunks; chunk-- > 0;)
      for (std::size_t mb = num_micro_batches; mb-- > 0;) program.backward(mb, chunk);
  }
  return schedule;
}

namespace detail {
inline constexpr char looped_bfs_name_prefix[] = "looped-bfs-";
}  // namespace detail

/// Schedule tag for Trainer's schedule argument: looped breadth-first, V stages per device round
/// robin (as Interleaved<V>), so a model with V*K stages runs on K devices; name `"looped-bfs-V"`
/// with V's digits, make(K, M) = make_looped_bfs_schedule(K, V, M).
template <std::size_t V>
struct LoopedBFS
    : detail::RoundRobinScheduleKind<V, detail::looped_bfs_name_prefix, make_looped_bfs_schedule> {
  static_assert(V >= 1, "gpipe: LoopedBFS<V> needs at least one chunk per device");
};

}  // namespace gpipe
