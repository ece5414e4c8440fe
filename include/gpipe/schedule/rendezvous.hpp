#pragma once
// order_for_rendezvous(schedule): the same schedule with transfers moved where rendezvous sends
// (schedule/op.hpp: a send completes only with its recv, as between processes and over NCCL)
// would otherwise deadlock. The result is valid under both rules; compute ops keep their order.
//
// Why a schedule can need it: the generators place a send right after the op that makes its
// data and a recv right before the op that needs it, which is best with buffered sends. Under
// rendezvous a send whose receiver is not ready stops its device. GPipe, 1F1B and ZB-H1 never do
// that (every send meets its recv in the receiver's posted group) and come back unchanged;
// interleaved 1F1B does from K = 2, V = 2, M = 3 on: a device that warms up with more forwards
// than its neighbour sends an activation that the neighbour takes only after a gradient that
// waits for the sender (tests/schedule/test_rendezvous.cpp).
//
// How: run the lists under rendezvous; while they stall, take the lowest stalled device whose
// posted group holds a send whose recv is not posted, and either delay that send past the next
// compute op of its list, or post its recv early, in the group where the receiving device is
// stalled. Both only move transfers (no dependency breaks: nothing on a device waits for its own
// send, and a recv only moves ahead of the op that needs it), each move takes one transfer
// strictly one way, so the loop ends. An early recv can leave the lists deadlocked even with
// buffered sends; that repair then gives up. order_for_rendezvous tries both and keeps the
// valid one the simulator times faster.
//
// What it costs (simulated, equal op costs, free transfers; bubble buffered -> rendezvous):
// K = 2, V = 2, M = 8: 0.059 -> 0.158; K = 4, V = 2, M = 8: 0.158 -> 0.294; K = 8, V = 2,
// M = 16: 0.179 -> 0.333; fewer micro-batches than about 2K lose nothing (K = 8, V = 3, M = 8:
// 0.226 both). 1F1B has 0.111, 0.273 and 0.304 there: with rendezvous sends, interleaving keeps
// its advantage only for M up to about 2K until a generator orders the exchanges of the steady
// state for rendezvous itself (Megatron-LM posts each step's sends and next recvs as one group).

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

/// `schedule` (valid with buffered sends), reordered to run with rendezvous sends; unchanged when
/// it already does. Compute ops keep their order; only sends and recvs move. Of the two repairs
/// (delay each blocking send past the next compute op of its list, or post its recv early), the
/// one whose result keeps `messages_in_order` if only one does, else the one the simulator times
/// faster with equal op costs. Throws Error for an invalid schedule, or one neither repair saves.
constexpr Schedule order_for_rendezvous(const Schedule& schedule) {
  if (const ValidationResult buffered = validate(schedule); !buffered.ok)
    throw Error("gpipe: order_for_rendezvous needs a valid schedule; " + describe(buffered));
  const ValidationResult as_is = validate(schedule, Sends::rendezvous);
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
