#pragma once
// validate(schedule) proves a schedule runnable under the contract of schedule/op.hpp before any
// device runs it: a schedule that passes has every op exactly once, each op's inputs produced
// earlier, and per-device lists that cannot deadlock with blocking recvs and buffered sends;
// validate(schedule, Sends::rendezvous) proves the lists deadlock-free when every send waits for
// its recv (transfers between processes, NCCL). It is constexpr, so a schedule generated for a
// compile-time M is checked in a static_assert; the same code checks run-time schedules.
//
// Checks run in this order and the first failure is reported, with the first offending op in
// (device, position) order within a check:
//   bad_shape       counts are 0, ops.size() != num_devices, or an op's kind, micro-batch or
//                   chunk is out of range
//   unexpected_op   an op its stage does not have (a recv_activation on stage 0, ...)
//   duplicate_op    the second occurrence of an op
//   unmatched_recv  a recv whose matching send is in no list
//   unmatched_send  a send whose matching recv is in no list
//   missing_op      a required op in no list (position: the end of its device's list)
//   dependency      an op whose same-device prerequisite comes later in the list
//   deadlock        no device can progress; the blocked recv (rendezvous: the first transfer
//                   of the blocked group whose partner is not posted) of the lowest unfinished
//                   device

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// The rule a schedule breaks, in the order validate() checks them.
enum class ValidationError : std::uint8_t {
  none,  ///< the schedule is valid
  /// Counts are 0, `ops.size() != num_devices`, or an op's kind, micro-batch or chunk is out
  /// of range.
  bad_shape,
  unexpected_op,   ///< an op its stage does not have (a recv_activation on stage 0, ...)
  duplicate_op,    ///< the second occurrence of an op
  unmatched_recv,  ///< a recv whose matching send is in no list
  unmatched_send,  ///< a send whose matching recv is in no list
  missing_op,      ///< a required op in no list
  dependency,      ///< an op whose same-device prerequisite comes later in its list
  /// No device can progress: the blocked recv of the lowest unfinished device (with rendezvous
  /// sends, the first transfer of its blocked group whose partner is not posted).
  deadlock,
};

/// The enumerator's name, e.g. `"deadlock"`; `"unknown"` for a value outside the enum.
constexpr std::string_view to_string(ValidationError error) {
  switch (error) {
    case ValidationError::none:
      return "none";
    case ValidationError::bad_shape:
      return "bad_shape";
    case ValidationError::unexpected_op:
      return "unexpected_op";
    case ValidationError::duplicate_op:
      return "duplicate_op";
    case ValidationError::unmatched_recv:
      return "unmatched_recv";
    case ValidationError::unmatched_send:
      return "unmatched_send";
    case ValidationError::missing_op:
      return "missing_op";
    case ValidationError::dependency:
      return "dependency";
    case ValidationError::deadlock:
      return "deadlock";
  }
  return "unknown";
}

/// What validate() found: `ok`, or the first broken rule with the offending op and, where there
/// is one, the op it conflicts with. describe() gives it as one line of text.
struct ValidationResult {
  /// The `device` and `position` of a bad_shape of the whole schedule, and the
  /// `other_position` of an op that is in no list.
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  bool ok = true;                                 ///< whether the schedule is valid
  ValidationError error = ValidationError::none;  ///< the broken rule; `none` when `ok`
  /// The offending op: ops[device][position] == op. For missing_op, op is the absent op and
  /// position == ops[device].size(). For a bad_shape of the whole schedule, device == position ==
  /// npos.
  std::size_t device = 0;
  std::size_t position = 0;  ///< the offending op's place in `ops[device]` (see `device`)
  Op op{};                   ///< the offending op (see `device`)
  /// The op it conflicts with, at ops[other_device][other_position]: the first copy
  /// (duplicate_op), the prerequisite that comes too late (dependency), the send a blocked recv
  /// waits for (deadlock); for unmatched_* the absent partner (other_position == npos).
  Op other{};
  std::size_t other_device = 0;    ///< the device of `other` (see `other`)
  std::size_t other_position = 0;  ///< the place of `other` in `ops[other_device]`, or `npos`
  std::string_view reason{};       ///< the broken rule, in words

  /// `ok`: true for a valid schedule.
  constexpr explicit operator bool() const { return ok; }
};

/// Where an op sits in a schedule: ops[device][position].
struct OpPlace {
  std::size_t device = 0;    ///< index into Schedule::ops
  std::size_t position = 0;  ///< index into `ops[device]`
};

namespace detail {

inline constexpr std::size_t no_position = ValidationResult::npos;

// (stage, micro-batch, kind) => position of that op in its device's list, or no_position.
// Size S * M * num_op_kinds.
class OpIndex {
 public:
  constexpr OpIndex() = default;
  constexpr OpIndex(std::size_t num_stages, std::size_t num_micro_batches)
      : num_micro_batches_(num_micro_batches),
        positions_(num_stages * num_micro_batches * num_op_kinds, no_position) {}

  constexpr std::size_t& at(std::size_t stage, std::size_t micro_batch, OpKind kind) {
    return positions_[slot(stage, micro_batch, kind)];
  }
  constexpr std::size_t at(std::size_t stage, std::size_t micro_batch, OpKind kind) const {
    return positions_[slot(stage, micro_batch, kind)];
  }

 private:
  constexpr std::size_t slot(std::size_t stage, std::size_t micro_batch, OpKind kind) const {
    return (stage * num_micro_batches_ + micro_batch) * num_op_kinds +
           static_cast<std::size_t>(kind);
  }

  std::size_t num_micro_batches_ = 0;
  std::vector<std::size_t> positions_;
};

// Whether stage `stage` of `num_stages` has an op of this kind (per micro-batch); a forward_only
// schedule's stages have no backward ops.
constexpr bool is_required(OpKind kind, std::size_t stage, std::size_t num_stages,
                           bool forward_only = false) {
  if (forward_only && kind != OpKind::forward && kind != OpKind::send_activation &&
      kind != OpKind::recv_activation)
    return false;
  switch (kind) {
    case OpKind::recv_activation:
    case OpKind::send_gradient:
      return stage > 0;
    case OpKind::send_activation:
    case OpKind::recv_gradient:
      return stage + 1 < num_stages;
    default:
      return true;
  }
}

constexpr std::string_view why_not_required(OpKind kind, bool forward_only = false) {
  if (forward_only && kind != OpKind::forward && kind != OpKind::send_activation &&
      kind != OpKind::recv_activation)
    return "a forward_only schedule runs no backward op";
  switch (kind) {
    case OpKind::recv_activation:
      return "the first stage receives no activation";
    case OpKind::send_gradient:
      return "the first stage sends no input gradient";
    case OpKind::send_activation:
      return "the last stage sends no activation";
    case OpKind::recv_gradient:
      return "the last stage receives no output gradient";
    default:
      return "";
  }
}

// The other end of a send or recv of stage `stage`: its stage and kind (same micro-batch).
struct Peer {
  std::size_t stage;
  OpKind kind;
};

constexpr Peer peer_of(OpKind kind, std::size_t stage) {
  switch (kind) {
    case OpKind::send_activation:
      return {stage + 1, OpKind::recv_activation};
    case OpKind::recv_activation:
      return {stage - 1, OpKind::send_activation};
    case OpKind::send_gradient:
      return {stage - 1, OpKind::recv_gradient};
    case OpKind::recv_gradient:
      return {stage + 1, OpKind::send_gradient};
    default:
      return {stage, kind};
  }
}

// Ops of the same (stage, micro-batch) that must come earlier on the device; at most two.
struct Prerequisites {
  OpKind kinds[2]{};
  std::size_t count = 0;
};

constexpr Prerequisites prerequisites_of(OpKind kind, std::size_t stage, std::size_t num_stages) {
  const bool first = stage == 0;
  const bool last = stage + 1 == num_stages;
  switch (kind) {
    case OpKind::forward:
      return first ? Prerequisites{} : Prerequisites{{OpKind::recv_activation}, 1};
    case OpKind::send_activation:
      return {{OpKind::forward}, 1};
    case OpKind::backward_input:
      return last ? Prerequisites{{OpKind::forward}, 1}
                  : Prerequisites{{OpKind::forward, OpKind::recv_gradient}, 2};
    case OpKind::send_gradient:
    case OpKind::backward_weight:
      return {{OpKind::backward_input}, 1};
    default:
      return {};
  }
}

// Where the partner of the transfer at ops[device][position] is: its device and position.
constexpr OpPlace partner_place(const Schedule& schedule, const OpIndex& index, std::size_t device,
                                const Op& op) {
  const Peer peer = peer_of(op.kind, schedule.stage_of(device, op.chunk));
  return {schedule.device_of_stage(peer.stage), index.at(peer.stage, op.micro_batch, peer.kind)};
}

// Runs the per-device lists with blocking recvs and buffered sends, calling visit(device,
// position) on every op that can run, in an order that respects both (a recv after its send).
// Returns, per device, how many leading ops ran: all of them unless the lists deadlock. Requires
// an index in which every recv's matching send is present.
template <class Visit>
constexpr std::vector<std::size_t> execute(const Schedule& schedule, const OpIndex& index,
                                           Visit&& visit) {
  std::vector<std::size_t> next(schedule.num_devices, 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t device = 0; device < schedule.num_devices; ++device) {
      const std::vector<Op>& ops = schedule.ops[device];
      for (; next[device] < ops.size(); ++next[device]) {
        const Op& op = ops[next[device]];
        if (is_recv(op.kind)) {
          const OpPlace sender = partner_place(schedule, index, device, op);
          if (sender.position >= next[sender.device]) break;
        }
        visit(device, next[device]);
        progressed = true;
      }
    }
  }
  return next;
}

// The end of the group of transfers that starts at ops[position] (position itself when the op
// there is a compute op or the list's end).
constexpr std::size_t group_end(const std::vector<Op>& ops, std::size_t position) {
  while (position < ops.size() && !is_compute(ops[position].kind)) ++position;
  return position;
}

// Under rendezvous sends, whether the transfer at ops[device][p], in the group the device has
// posted, is matched: its partner lies before the end of its own device's current group (posted
// now, or completed with this one earlier). A partner on the same device is a local copy,
// buffered: a send is always matched, a recv once its send comes earlier in the list.
constexpr bool rendezvous_matched(const Schedule& schedule, const OpIndex& index,
                                  const std::vector<std::size_t>& next, std::size_t device,
                                  std::size_t p) {
  const Op& op = schedule.ops[device][p];
  const OpPlace partner = partner_place(schedule, index, device, op);
  if (partner.device == device) return is_send(op.kind) || partner.position < p;
  return partner.position < group_end(schedule.ops[partner.device], next[partner.device]);
}

// The same as execute under rendezvous sends (schedule/op.hpp): compute ops run when reached;
// a device at a group of transfers moves past the whole group once every transfer in it is
// matched.
template <class Visit>
constexpr std::vector<std::size_t> execute_rendezvous(const Schedule& schedule,
                                                      const OpIndex& index, Visit&& visit) {
  std::vector<std::size_t> next(schedule.num_devices, 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t device = 0; device < schedule.num_devices; ++device) {
      const std::vector<Op>& ops = schedule.ops[device];
      while (next[device] < ops.size()) {
        if (is_compute(ops[next[device]].kind)) {
          visit(device, next[device]++);
          progressed = true;
          continue;
        }
        const std::size_t end = group_end(ops, next[device]);
        bool matched = true;
        for (std::size_t p = next[device]; p < end && matched; ++p)
          matched = rendezvous_matched(schedule, index, next, device, p);
        if (!matched) break;
        for (; next[device] < end; ++next[device]) visit(device, next[device]);
        progressed = true;
      }
    }
  }
  return next;
}

// The first transfer of the group that blocks `device` whose partner is not posted: the op
// the deadlock report names.
constexpr std::size_t first_unmatched(const Schedule& schedule, const OpIndex& index,
                                      const std::vector<std::size_t>& next, std::size_t device) {
  const std::size_t end = group_end(schedule.ops[device], next[device]);
  for (std::size_t p = next[device]; p < end; ++p)
    if (!rendezvous_matched(schedule, index, next, device, p)) return p;
  return next[device];
}

constexpr ValidationResult schedule_error(std::string_view reason) {
  return {.ok = false,
          .error = ValidationError::bad_shape,
          .device = no_position,
          .position = no_position,
          .reason = reason};
}

constexpr ValidationResult op_error(ValidationError error, std::size_t device, std::size_t position,
                                    Op op, std::string_view reason) {
  return {.ok = false,
          .error = error,
          .device = device,
          .position = position,
          .op = op,
          .reason = reason};
}

// The rules of validate_into, in its order; each returns the first op that breaks it.

// The schedule's shape: its sizes, and every op's kind, micro-batch and chunk in range.
constexpr ValidationResult check_shape(const Schedule& schedule) {
  if (schedule.num_devices == 0) return schedule_error("num_devices is 0");
  if (schedule.num_micro_batches == 0) return schedule_error("num_micro_batches is 0");
  if (schedule.num_chunks == 0) return schedule_error("num_chunks is 0");
  if (schedule.ops.size() != schedule.num_devices) {
    return schedule_error("ops.size() differs from num_devices");
  }
  const std::size_t num_devices = schedule.num_devices;
  for (std::size_t d = 0; d < num_devices; ++d) {
    for (std::size_t p = 0; p < schedule.ops[d].size(); ++p) {
      const Op& op = schedule.ops[d][p];
      if (static_cast<std::size_t>(op.kind) >= num_op_kinds) {
        return op_error(ValidationError::bad_shape, d, p, op, "unknown op kind");
      }
      if (op.micro_batch >= schedule.num_micro_batches) {
        return op_error(ValidationError::bad_shape, d, p, op,
                        "micro_batch is not below num_micro_batches");
      }
      if (op.chunk >= schedule.num_chunks) {
        return op_error(ValidationError::bad_shape, d, p, op, "chunk is not below num_chunks");
      }
    }
  }
  return {};
}

// Every op where it may run (is_required) and at most once; fills `index`.
constexpr ValidationResult index_ops(const Schedule& schedule, OpIndex& index) {
  const std::size_t num_devices = schedule.num_devices;
  const std::size_t num_stages = schedule.num_stages();
  index = OpIndex(num_stages, schedule.num_micro_batches);
  for (std::size_t d = 0; d < num_devices; ++d) {
    for (std::size_t p = 0; p < schedule.ops[d].size(); ++p) {
      const Op& op = schedule.ops[d][p];
      const std::size_t stage = schedule.stage_of(d, op.chunk);
      if (!is_required(op.kind, stage, num_stages, schedule.forward_only)) {
        return op_error(ValidationError::unexpected_op, d, p, op,
                        why_not_required(op.kind, schedule.forward_only));
      }
      std::size_t& seen = index.at(stage, op.micro_batch, op.kind);
      if (seen != no_position) {
        ValidationResult result =
            op_error(ValidationError::duplicate_op, d, p, op, "every op runs exactly once");
        result.other = op;
        result.other_device = d;
        result.other_position = seen;
        return result;
      }
      seen = p;
    }
  }
  return {};
}

// Every send has its recv and every recv its send.
constexpr ValidationResult check_pairs(const Schedule& schedule, const OpIndex& index) {
  const std::size_t num_devices = schedule.num_devices;
  for (std::size_t d = 0; d < num_devices; ++d) {
    for (std::size_t p = 0; p < schedule.ops[d].size(); ++p) {
      const Op& op = schedule.ops[d][p];
      if (!is_send(op.kind) && !is_recv(op.kind)) continue;
      const Peer peer = peer_of(op.kind, schedule.stage_of(d, op.chunk));
      if (index.at(peer.stage, op.micro_batch, peer.kind) != no_position) continue;
      ValidationResult result =
          is_recv(op.kind)
              ? op_error(ValidationError::unmatched_recv, d, p, op, "a recv needs its send")
              : op_error(ValidationError::unmatched_send, d, p, op, "a send needs its recv");
      result.other = {peer.kind, op.micro_batch,
                      static_cast<std::uint32_t>(schedule.chunk_of_stage(peer.stage))};
      result.other_device = schedule.device_of_stage(peer.stage);
      result.other_position = no_position;
      return result;
    }
  }
  return {};
}

// Every required op is there.
constexpr ValidationResult check_complete(const Schedule& schedule, const OpIndex& index) {
  const std::size_t num_stages = schedule.num_stages();
  for (std::size_t stage = 0; stage < num_stages; ++stage) {
    const std::size_t d = schedule.device_of_stage(stage);
    const auto chunk = static_cast<std::uint32_t>(schedule.chunk_of_stage(stage));
    for (std::size_t mb = 0; mb < schedule.num_micro_batches; ++mb) {
      for (std::size_t k = 0; k < num_op_kinds; ++k) {
        const auto kind = static_cast<OpKind>(k);
        if (!is_required(kind, stage, num_stages, schedule.forward_only)) continue;
        if (index.at(stage, mb, kind) != no_position) continue;
        return op_error(ValidationError::missing_op, d, schedule.ops[d].size(),
                        {kind, static_cast<std::uint32_t>(mb), chunk},
                        "every required op runs exactly once");
      }
    }
  }
  return {};
}

// Every op's inputs are produced earlier on its device.
constexpr ValidationResult check_dependencies(const Schedule& schedule, const OpIndex& index) {
  const std::size_t num_devices = schedule.num_devices;
  const std::size_t num_stages = schedule.num_stages();
  for (std::size_t d = 0; d < num_devices; ++d) {
    for (std::size_t p = 0; p < schedule.ops[d].size(); ++p) {
      const Op& op = schedule.ops[d][p];
      const std::size_t stage = schedule.stage_of(d, op.chunk);
      const Prerequisites needs = prerequisites_of(op.kind, stage, num_stages);
      for (std::size_t i = 0; i < needs.count; ++i) {
        const std::size_t at = index.at(stage, op.micro_batch, needs.kinds[i]);
        if (at < p) continue;
        ValidationResult result = op_error(ValidationError::dependency, d, p, op,
                                           "an op's inputs are produced earlier on its device");
        result.other = {needs.kinds[i], op.micro_batch, op.chunk};
        result.other_device = d;
        result.other_position = at;
        return result;
      }
    }
  }
  return {};
}

// The schedule runs to its end with `sends` (no device waits forever).
constexpr ValidationResult check_progress(const Schedule& schedule, const OpIndex& index,
                                          Sends sends) {
  const std::size_t num_devices = schedule.num_devices;
  const auto ignore = [](std::size_t, std::size_t) {};
  std::vector<std::size_t> ran;
  if (sends == Sends::buffered) {
    ran = execute(schedule, index, ignore);
  } else {
    ran = execute_rendezvous(schedule, index, ignore);
  }
  for (std::size_t d = 0; d < num_devices; ++d) {
    if (ran[d] == schedule.ops[d].size()) continue;
    const std::size_t at =
        sends == Sends::buffered ? ran[d] : first_unmatched(schedule, index, ran, d);
    const Op& op = schedule.ops[d][at];
    const Peer peer = peer_of(op.kind, schedule.stage_of(d, op.chunk));
    ValidationResult result =
        op_error(ValidationError::deadlock, d, at, op,
                 sends == Sends::buffered
                     ? "no device can progress"
                     : "no device can progress (rendezvous sends: each send waits for its recv)");
    result.other = {peer.kind, op.micro_batch,
                    static_cast<std::uint32_t>(schedule.chunk_of_stage(peer.stage))};
    result.other_device = schedule.device_of_stage(peer.stage);
    result.other_position = index.at(peer.stage, op.micro_batch, peer.kind);
    return result;
  }
  return {};
}

// validate(), leaving the filled index behind for the simulator.
constexpr ValidationResult validate_into(const Schedule& schedule, OpIndex& index,
                                         Sends sends = Sends::buffered) {
  if (ValidationResult r = check_shape(schedule); !r) return r;
  if (ValidationResult r = index_ops(schedule, index); !r) return r;
  if (ValidationResult r = check_pairs(schedule, index); !r) return r;
  if (ValidationResult r = check_complete(schedule, index); !r) return r;
  if (ValidationResult r = check_dependencies(schedule, index); !r) return r;
  return check_progress(schedule, index, sends);
}

inline std::string describe_op(const Op& op) {
  return std::string(to_string(op.kind)) + "(micro-batch " + std::to_string(op.micro_batch) +
         ", chunk " + std::to_string(op.chunk) + ")";
}

inline std::string describe_place(std::size_t device, std::size_t position) {
  return "device " + std::to_string(device) + ", position " + std::to_string(position);
}

}  // namespace detail

/// Checks `schedule` against the contract of schedule/op.hpp, with sends completing as `sends`
/// says; see the top of this file.
constexpr ValidationResult validate(const Schedule& schedule, Sends sends = Sends::buffered) {
  detail::OpIndex index;
  return detail::validate_into(schedule, index, sends);
}

/// One line for a person: the broken rule, where (device, position) and which op (kind,
/// micro-batch, chunk), and the op it conflicts with.
inline std::string describe(const ValidationResult& result) {
  using detail::describe_op;
  using detail::describe_place;
  if (result.ok) return "valid schedule";
  std::string text = "invalid schedule (" + std::string(to_string(result.error)) + "): ";
  if (result.error == ValidationError::bad_shape && result.position == ValidationResult::npos) {
    return text + std::string(result.reason);
  }
  text += describe_place(result.device, result.position) + ", " + describe_op(result.op) + ": ";
  switch (result.error) {
    case ValidationError::missing_op:
      return text + "missing (the position is the end of the device's list); " +
             std::string(result.reason);
    case ValidationError::duplicate_op:
      return text + "appears again; first at position " + std::to_string(result.other_position) +
             "; " + std::string(result.reason);
    case ValidationError::unmatched_recv:
    case ValidationError::unmatched_send:
      return text + "no matching " + describe_op(result.other) + " on device " +
             std::to_string(result.other_device) + "; " + std::string(result.reason);
    case ValidationError::dependency:
      return text + "needs " + describe_op(result.other) + " earlier on its device, found " +
             (result.other_position == ValidationResult::npos
                  ? std::string("nowhere")
                  : "at position " + std::to_string(result.other_position));
    case ValidationError::deadlock:
      return text + "blocks forever; " + std::string(result.reason) + " and its " +
             describe_op(result.other) + " at " +
             describe_place(result.other_device, result.other_position) + " is never reached";
    default:
      return text + std::string(result.reason);
  }
}

/// Throws Error(describe(validate(schedule, sends))) unless the schedule is valid.
inline void require_valid(const Schedule& schedule, Sends sends = Sends::buffered) {
  const ValidationResult result = validate(schedule, sends);
  if (!result) throw Error("gpipe: " + describe(result));
}

}  // namespace gpipe
