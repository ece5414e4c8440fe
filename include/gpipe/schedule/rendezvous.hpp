#pragma once
// order_for_rendezvous(schedule): the same schedule with transfers moved where rendezvous sends
// (schedule/op.hpp: a send completes only with its recv, as between processes and over NCCL)
// would otherwise deadlock or wait. The result is valid under both rules; compute ops keep their
// order.
//
// Why a schedule can need it: the generators place a send right after the op that makes its
// data and a recv right before the op that needs it, which is best with buffered sends. Under
// rendezvous a send whose receiver is not ready stops its device. GPipe and 1F1B never do that
// (every send meets its recv in the receiver's posted group) and come back unchanged; ZB-H1 runs
// but waits at some sends (K = 2, M = 3: device 1's gradient of micro-batch 1 until device 0 ends
// a forward; rendezvous_waits finds it); interleaved 1F1B deadlocks from K = 2, V = 2, M = 3 on:
// a device that warms up with more forwards than its neighbour sends an activation that the
// neighbour takes only after a gradient that waits for the sender
// (tests/schedule/test_rendezvous.cpp).
//
// How, first: by the buffered timeline (place_transfers_by_time). Simulate the schedule with
// equal op costs; each message then has a time, when its send runs. Post its recv in the gap
// between the receiver's compute ops that holds that time: both ends of every message are posted
// in the groups their devices reach at the same moment, so each step's sends and the next recvs
// form one batched exchange, as Megatron-LM pairs them by hand for interleaved 1F1B, and nothing
// waits that did not wait buffered. With equal op costs the lists then run under rendezvous
// exactly as buffered: the same makespan. For every generator here (interleaved V = 2, 3,
// looped BFS, ZB-V, DualPipeV, K <= 8, M <= 16) the result is valid under both rules with each
// pair's messages in order, and it is what order_for_rendezvous returns.
//
// Otherwise (a schedule of another origin where that placement fails): run the lists under
// rendezvous; while they stall, take the lowest stalled device whose posted group holds a send
// whose recv is not posted, and either delay that send past the next compute op of its list, or
// post its recv early, in the group where the receiving device is stalled. Both only move
// transfers (no dependency breaks: nothing on a device waits for its own send, and a recv only
// moves ahead of the op that needs it), each move takes one transfer strictly one way, so the
// loop ends. An early recv can leave the lists deadlocked even with buffered sends; that repair
// then gives up. order_for_rendezvous tries both and keeps the valid one the simulator times
// faster. These one-transfer-at-a-time repairs cost bubble (simulated, equal op costs, buffered
// -> rendezvous): interleaved V = 2, K = 2, M = 8: 0.059 -> 0.158; K = 4, M = 8: 0.158 ->
// 0.294; K = 8, M = 16: 0.179 -> 0.333; ZB-V up to +0.45 (K = 6, M = 16). The placement by time
// loses nothing in all of these.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/schedule/validator.hpp"

namespace gpipe {
namespace detail {

// How order_for_rendezvous unblocks a send whose recv is not posted.
enum class RendezvousRepair : std::uint8_t {
  delay_send,  // move the send past the next compute op of its own list
  post_recv,   // move the recv earlier, into the group its (stalled) device has posted
};

// A repair's outcome (not std::optional: nvcc's front end takes an optional of a class with a
// vector for a non-literal type in constexpr code).
struct Repaired {
  bool ok = false;
  Schedule schedule{};
};

// `schedule` (valid with buffered sends) repaired for rendezvous sends; not ok when the repair
// cannot: a send that no later position saves, lists that stall at recvs alone, or a move that
// leaves the lists invalid with buffered sends (an early recv can).
constexpr Repaired repair_for_rendezvous(Schedule schedule, RendezvousRepair repair) {
  for (;;) {
    OpIndex index;
    if (!validate_into(schedule, index).ok) return {};
    const std::vector<std::size_t> next =
        execute_rendezvous(schedule, index, [](std::size_t, std::size_t) {});
    bool finished = true, moved = false;
    for (std::size_t d = 0; d < schedule.num_devices && !moved; ++d) {
      std::vector<Op>& ops = schedule.ops[d];
      if (next[d] == ops.size()) continue;
      finished = false;
      const std::size_t end = group_end(ops, next[d]);
      for (std::size_t p = next[d]; p < end && !moved; ++p) {
        if (!is_send(ops[p].kind) || rendezvous_matched(schedule, index, next, d, p)) continue;
        if (repair == RendezvousRepair::delay_send) {
          if (end == ops.size()) return {};
          const Op send = ops[p];
          ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(p));
          // the compute op that ended the group is now at end - 1: the send goes right after it
          ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(end), send);
        } else {
          // The recv's device is stalled too, at a group of its own before the recv (a stalled
          // device waits at transfers, and the recv is not posted).
          const OpPlace recv = partner_place(schedule, index, d, ops[p]);
          std::vector<Op>& peer_ops = schedule.ops[recv.device];
          const std::size_t posted_end = group_end(peer_ops, next[recv.device]);
          const Op op = peer_ops[recv.position];
          peer_ops.erase(peer_ops.begin() + static_cast<std::ptrdiff_t>(recv.position));
          peer_ops.insert(peer_ops.begin() + static_cast<std::ptrdiff_t>(posted_end), op);
        }
        moved = true;
      }
    }
    if (finished) return {true, schedule};
    if (!moved) return {};
  }
}

// Whether, run under rendezvous, `schedule` (valid with buffered sends) would keep a device at a
// group of transfers longer than its buffered timeline of equal op costs does: a device reaches a
// group at the end of the compute op before it and leaves it, buffered, once the group's recvs
// have their data; under rendezvous it also waits until each of its sends' recvs is posted, i.e.
// until the receiver reaches the recv's group. A schedule without such a wait runs under
// rendezvous exactly as the simulator times it; one with a wait is slower than simulate says.
constexpr bool rendezvous_waits(const Schedule& schedule) {
  const SimulationResult timeline = simulate(schedule);
  OpIndex index;
  if (!validate_into(schedule, index).ok) return true;
  const std::size_t k = schedule.num_devices;
  // [device][position] of a transfer: when its device reaches its group, and leaves it buffered
  std::vector<std::vector<double>> reached(k), left(k);
  for (std::size_t d = 0; d < k; ++d) {
    const std::vector<Op>& ops = schedule.ops[d];
    reached[d].assign(ops.size(), 0);
    left[d].assign(ops.size(), 0);
    double at = 0;
    for (std::size_t p = 0; p < ops.size();) {
      if (is_compute(ops[p].kind)) {
        at = timeline.finish[d][p++];
        continue;
      }
      const std::size_t end = group_end(ops, p);
      double leaves = at;
      for (std::size_t q = p; q < end; ++q) leaves = std::max(leaves, timeline.finish[d][q]);
      for (; p < end; ++p) {
        reached[d][p] = at;
        left[d][p] = leaves;
      }
    }
  }
  for (std::size_t d = 0; d < k; ++d) {
    for (std::size_t p = 0; p < schedule.ops[d].size(); ++p) {
      const Op& op = schedule.ops[d][p];
      if (!is_send(op.kind)) continue;
      const OpPlace recv = partner_place(schedule, index, d, op);
      if (recv.device != d && reached[recv.device][recv.position] > left[d][p]) return true;
    }
  }
  return false;
}

// A transfer of place_transfers_by_time: its message's time tau and the gap it goes in.
struct TimedTransfer {
  double tau;
  std::size_t gap;  // the gap between compute ops: before the gap-th compute op of the list
  bool recv;
  std::size_t stage;
  Op op;
};

// Gap by gap, and within a gap in place_transfers_by_time's order of a group.
constexpr bool timed_before(const TimedTransfer& a, const TimedTransfer& b) {
  if (a.gap != b.gap) return a.gap < b.gap;
  if (a.recv != b.recv) return !a.recv;
  if (a.tau != b.tau) return a.tau < b.tau;
  if (a.stage != b.stage) return a.stage < b.stage;
  if (a.op.micro_batch != b.op.micro_batch) return a.op.micro_batch < b.op.micro_batch;
  return a.op.kind < b.op.kind;
}

// Device d's list as place_transfers_by_time builds it from `timeline` (schedule's, unit costs):
// its compute ops in order, each gap holding the transfers placed in it.
constexpr std::vector<Op> list_by_time(const Schedule& schedule, const OpIndex& index,
                                       const SimulationResult& timeline, std::size_t d) {
  const std::vector<Op>& ops = schedule.ops[d];
  std::vector<double> compute_starts;
  for (std::size_t p = 0; p < ops.size(); ++p)
    if (is_compute(ops[p].kind)) compute_starts.push_back(timeline.start[d][p]);
  std::vector<Op> compute;
  std::vector<TimedTransfer> transfers;
  for (std::size_t p = 0; p < ops.size(); ++p) {
    const Op& op = ops[p];
    if (is_compute(op.kind)) {
      compute.push_back(op);
      continue;
    }
    const std::size_t own_gap = compute.size();
    const std::size_t stage = schedule.stage_of(d, op.chunk);
    if (is_send(op.kind)) {
      transfers.push_back({timeline.start[d][p], own_gap, false, stage, op});
      continue;
    }
    const OpPlace sender = partner_place(schedule, index, d, op);
    const double tau = timeline.start[sender.device][sender.position];
    std::size_t gap = 0;
    while (gap < own_gap && compute_starts[gap] < tau) ++gap;
    transfers.push_back({tau, gap, true, stage, op});
  }
  std::sort(transfers.begin(), transfers.end(), timed_before);
  // the groups in order: gap g's transfers, then compute op g
  std::vector<Op> list;
  std::size_t t = 0;
  for (std::size_t g = 0; g <= compute.size(); ++g) {
    for (; t < transfers.size() && transfers[t].gap == g; ++t) list.push_back(transfers[t].op);
    if (g < compute.size()) list.push_back(compute[g]);
  }
  return list;
}

// `schedule` (valid with buffered sends) with its transfers where its buffered timeline puts them,
// for rendezvous sends by construction: simulated with unit op costs, every message has a time
// tau, when its send runs (the end of the compute op before it); both the send and its recv are
// posted in the group their devices reach at tau: the send where it was, right after the op that
// makes its data, the recv in the gap between the receiver's compute ops that holds tau (the
// first gap that ends at or after tau), which is at or before its own. Every device then posts
// at tau exactly the messages that its partners post at tau, so with those costs the lists run
// under rendezvous as they ran buffered: no send waits, no op starts later, the makespan is the
// buffered one. This is how Megatron-LM pairs a step's sends with the next recvs in one batched
// exchange, derived for any schedule. Within a group the sends come first, then the recvs, each
// by (tau, stage, micro-batch), so every pair of devices posts its messages of each direction in
// the same order (messages_in_order). Not ok when the result is not valid under both rules or
// keeps a device waiting (rendezvous_waits).
constexpr Repaired place_transfers_by_time(const Schedule& schedule) {
  const SimulationResult timeline = simulate(schedule);
  OpIndex index;
  if (!validate_into(schedule, index).ok) return {};
  Schedule out = schedule;
  for (std::size_t d = 0; d < schedule.num_devices; ++d)
    out.ops[d] = list_by_time(schedule, index, timeline, d);
  if (!validate(out).ok || !validate(out, Sends::rendezvous).ok || rendezvous_waits(out)) return {};
  return {true, out};
}

}  // namespace detail

/// Where `messages_in_order` finds a pair of devices whose messages of one direction are posted
/// in different orders: `ok`, or the sender, the receiver and whether they are gradients.
struct MessageOrder {
  bool ok = true;            ///< every pair posts its messages in the same order
  std::size_t sender = 0;    ///< the first pair that does not: its sending device
  std::size_t receiver = 0;  ///< ... and its receiving device
  bool gradients = false;    ///< ... in the gradient (backward) direction, else activations
};

/// Whether, between every two devices and in each direction (activations flow to the next stage,
/// gradients to the previous one), the sender posts its sends in the order in which the receiver
/// posts the matching recvs. NCCL matches the point-to-point messages of a pair of ranks on one
/// communicator in the order they are posted, without tags, so a rendezvous transport with one
/// communicator per direction (mpi::CudaBackend) needs this. Transfers within one device are
/// local and not counted. GPipe, 1F1B and ZB-H1 always have it; interleaved schedules as
/// generated too, and order_for_rendezvous keeps it where a reordering that has it exists.
constexpr MessageOrder messages_in_order(const Schedule& schedule) {
  const std::size_t k = schedule.num_devices;
  // per (device, direction, peer): the messages, each (sending stage, micro-batch)
  struct Message {
    std::size_t stage, micro_batch;
    constexpr bool operator==(const Message&) const = default;
  };
  std::vector<std::vector<Message>> sent(2 * k * k), received(2 * k * k);
  const auto at = [k](std::size_t device, bool gradient, std::size_t peer) {
    return (device * 2 + (gradient ? 1 : 0)) * k + peer;
  };
  for (std::size_t d = 0; d < k; ++d) {
    for (const Op& op : schedule.ops[d]) {
      const std::size_t s = schedule.stage_of(d, op.chunk);
      const bool gradient = op.kind == OpKind::send_gradient || op.kind == OpKind::recv_gradient;
      if (is_send(op.kind)) {
        const std::size_t to = schedule.device_of_stage(gradient ? s - 1 : s + 1);
        if (to != d) sent[at(d, gradient, to)].push_back({s, op.micro_batch});
      } else if (is_recv(op.kind)) {
        const std::size_t from_stage = gradient ? s + 1 : s - 1;
        const std::size_t from = schedule.device_of_stage(from_stage);
        if (from != d) received[at(d, gradient, from)].push_back({from_stage, op.micro_batch});
      }
    }
  }
  for (std::size_t a = 0; a < k; ++a)
    for (const bool gradient : {false, true})
      for (std::size_t b = 0; b < k; ++b)
        if (a != b && sent[at(a, gradient, b)] != received[at(b, gradient, a)])
          return {false, a, b, gradient};
  return {};
}

/// `schedule` (valid with buffered sends), reordered to run with rendezvous sends as fast as with
/// buffered ones; unchanged when it already does (GPipe, 1F1B, ZB-H1). Compute ops keep their
/// order; only sends and recvs move: first each recv to where its receiver stands when the send
/// runs in the buffered timeline (see the top of this file), which for every generated schedule
/// runs under rendezvous with no wait the buffered one lacks and with each pair's messages in
/// order. Failing that, the schedule unchanged if it runs, else of the two repairs (delay each
/// blocking send past the next compute op of its list, or post its recv early), the one whose
/// result keeps `messages_in_order` if only one does, else the one the simulator times faster
/// with equal op costs. Throws Error for an invalid schedule, or one no reordering saves.
constexpr Schedule order_for_rendezvous(const Schedule& schedule) {
  if (const ValidationResult buffered = validate(schedule); !buffered.ok)
    throw Error("gpipe: order_for_rendezvous needs a valid schedule; " + describe(buffered));
  const ValidationResult as_is = validate(schedule, Sends::rendezvous);
  if (as_is.ok && !detail::rendezvous_waits(schedule)) return schedule;
  // By the buffered timeline: as fast as buffered with equal op costs, messages in order.
  if (const detail::Repaired timed = detail::place_transfers_by_time(schedule);
      timed.ok && messages_in_order(timed.schedule).ok &&
      simulate(timed.schedule).makespan <= simulate(schedule).makespan)
    return timed.schedule;
  if (as_is.ok) return schedule;
  const detail::Repaired delayed =
      detail::repair_for_rendezvous(schedule, detail::RendezvousRepair::delay_send);
  const detail::Repaired posted =
      detail::repair_for_rendezvous(schedule, detail::RendezvousRepair::post_recv);
  if (delayed.ok && posted.ok) {
    const bool delayed_in_order = messages_in_order(delayed.schedule).ok;
    if (delayed_in_order != messages_in_order(posted.schedule).ok)
      return delayed_in_order ? delayed.schedule : posted.schedule;
    return simulate(posted.schedule).makespan < simulate(delayed.schedule).makespan
               ? posted.schedule
               : delayed.schedule;
  }
  if (delayed.ok) return delayed.schedule;
  if (posted.ok) return posted.schedule;
  throw Error("gpipe: no reordering of transfers runs this schedule with rendezvous sends: " +
              describe(as_is));
}

}  // namespace gpipe
