#pragma once
// The schedule IR: a schedule is data, per device an ordered list of ops {kind, micro_batch,
// chunk}. Generators produce it, the validator proves it runnable, the simulator times it and the
// runtime walks it; all of them agree on the contract below, which is the only place it is stated.
//
// Stages. S = num_devices * num_chunks stages 0..S-1 form the pipeline; the schedule's
// placement says which device holds which (K = num_devices):
//   round_robin  stage s = chunk * K + device: device d holds stages d, d + K, d + 2K, ...
//                (GPipe, 1F1B, ZB-H1/H2 with num_chunks == 1, where stage == device;
//                Interleaved and LoopedBFS)
//   v_shape      the chunks zigzag: chunk c of device d is stage c * K + d for even c and
//                c * K + K-1-d for odd c, so with 2 chunks device d holds stages d and 2K-1-d
//                (ZB-V, DualPipeV): the pipeline runs down the devices and back up, device K-1
//                hands stage K-1's output to its own stage K, and device 0 holds the first
//                stage and the last (the loss)
// Either way chunk c of a device is its c-th stage in pipeline order (chunk_of_stage(s) =
// s / K), and no device holds two chunks of one stage. An op's chunk names the stage it works
// on *on its own device*: the stage of op (d, op) is stage_of(d, op.chunk), also for sends and
// recvs.
//
// Ops of stage s for micro-batch mb (every one exactly once, no others; a forward_only schedule,
// an inference program, has only the forwards and the activations' sends and recvs):
//   forward          (all s)    runs stage s; on s == S-1 it also computes the loss and the
//                               gradient of the loss with respect to the stage's output
//   backward_input   (all s)    B: gradient with respect to stage s's input
//   backward_weight  (all s)    W: gradient with respect to stage s's parameters (accumulated)
//   recv_activation  (s > 0)    receives stage s's input from stage s-1
//   send_activation  (s < S-1)  hands stage s's output to stage s+1
//   recv_gradient    (s < S-1)  receives the gradient of stage s's output from stage s+1
//   send_gradient    (s > 0)    hands the gradient of stage s's input to stage s-1
// recv_activation(s, mb) matches send_activation(s-1, mb) and recv_gradient(s, mb) matches
// send_gradient(s+1, mb); each op carries its own stage's chunk, so the two ops of a pair carry
// different chunks when s-1 and s lie on different rounds of the round robin.
//
// Execution. Each device runs its list in order. Sends never block (the data is buffered); a recv
// blocks until its matching send has executed. Dependencies inside a device, each required to
// appear earlier in the same list:
//   forward(s, mb)         after recv_activation(s, mb)                      (s > 0)
//   send_activation(s, mb) after forward(s, mb)
//   backward_input(s, mb)  after forward(s, mb) and recv_gradient(s, mb)     (s < S-1)
//   send_gradient(s, mb)   after backward_input(s, mb)
//   backward_weight(s, mb) after backward_input(s, mb)
// The activations stashed for (s, mb) are live from forward(s, mb) to backward_weight(s, mb).
//
// Rendezvous sends (Sends::rendezvous). Between processes, or between GPUs over NCCL, a send
// cannot be buffered: it completes only together with its matching recv. A device then posts
// the whole run of consecutive sends and recvs at the head of its list as one group (one
// ncclGroupStart/End, or MPI nonblocking calls completed together) and moves past the group
// once the partner of every op in it has been posted by the partner's device (or has already
// completed with it). Compute ops between two transfers split them into separate groups. A
// transfer between two stages of the same device is a local copy and stays buffered.
// Generated schedules are valid under both rules; validate(schedule, Sends::rendezvous) checks
// a schedule for the second.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace gpipe {

/// What an op does for one stage and micro-batch; which stages have which kinds, and the order
/// they must run in, is the contract at the top of schedule/op.hpp.
enum class OpKind : std::uint8_t {
  /// F: runs the stage; on the last stage also the loss and the gradient of the loss with
  /// respect to the stage's output.
  forward,
  backward_input,   ///< B: gradient with respect to the stage's input
  backward_weight,  ///< W: gradient with respect to the stage's parameters, accumulated
  send_activation,  ///< hands the stage's output to the next stage (not on the last)
  recv_activation,  ///< receives the stage's input from the previous stage (not on stage 0)
  send_gradient,    ///< hands the gradient of its input to the previous stage (not on stage 0)
  recv_gradient,    ///< receives the gradient of its output from the next stage (not on the last)
};

/// Number of OpKind values.
inline constexpr std::size_t num_op_kinds = 7;

/// How a send completes (see "Execution" and "Rendezvous sends" at the top of schedule/op.hpp).
enum class Sends : std::uint8_t {
  buffered,    ///< a send never blocks: one process, the data stays where the receiver reads it
  rendezvous,  ///< a send completes with its recv; consecutive transfers are posted as a group
};

/// `"buffered"` or `"rendezvous"`.
constexpr std::string_view to_string(Sends sends) {
  return sends == Sends::buffered ? "buffered" : "rendezvous";
}

/// The enumerator's name, e.g. `"backward_input"`; `"unknown"` for a value outside the enum.
constexpr std::string_view to_string(OpKind kind) {
  switch (kind) {
    case OpKind::forward:
      return "forward";
    case OpKind::backward_input:
      return "backward_input";
    case OpKind::backward_weight:
      return "backward_weight";
    case OpKind::send_activation:
      return "send_activation";
    case OpKind::recv_activation:
      return "recv_activation";
    case OpKind::send_gradient:
      return "send_gradient";
    case OpKind::recv_gradient:
      return "recv_gradient";
  }
  return "unknown";
}

/// Compute ops occupy the device; sends and recvs only move data between stages.
constexpr bool is_compute(OpKind kind) {
  return kind == OpKind::forward || kind == OpKind::backward_input ||
         kind == OpKind::backward_weight;
}
/// send_activation or send_gradient.
constexpr bool is_send(OpKind kind) {
  return kind == OpKind::send_activation || kind == OpKind::send_gradient;
}
/// recv_activation or recv_gradient.
constexpr bool is_recv(OpKind kind) {
  return kind == OpKind::recv_activation || kind == OpKind::recv_gradient;
}

/// One entry of a device's list: an op of kind `kind` for micro-batch `micro_batch` on the
/// device's stage `chunk`, i.e. on stage Schedule::stage_of(device, chunk).
struct Op {
  OpKind kind = OpKind::forward;  ///< what the op does
  std::uint32_t micro_batch = 0;  ///< which micro-batch, less than Schedule::num_micro_batches
  std::uint32_t chunk = 0;        ///< which of the device's stages; see stage_of

  /// Equal when kind, micro-batch and chunk are.
  friend constexpr bool operator==(const Op&, const Op&) = default;
};

/// Which device holds which stage (see "Stages" at the top of schedule/op.hpp).
enum class Placement : std::uint8_t {
  round_robin,  ///< stage = chunk * K + device
  v_shape,      ///< chunks zigzag: stage = chunk * K + (chunk even ? device : K - 1 - device)
};

/// `"round_robin"` or `"v_shape"`.
constexpr std::string_view to_string(Placement placement) {
  return placement == Placement::round_robin ? "round_robin" : "v_shape";
}

/// ops[device] is that device's program, run in order. Invariant of a valid schedule (see
/// validate): ops.size() == num_devices, every op's micro_batch < num_micro_batches and
/// chunk < num_chunks, and the contract at the top of this file holds.
struct Schedule {
  std::size_t num_devices = 0;                   ///< K: devices, one list in `ops` each
  std::size_t num_micro_batches = 0;             ///< M: micro-batches per step
  std::size_t num_chunks = 1;                    ///< virtual stages per device
  std::vector<std::vector<Op>> ops{};            ///< `ops[device]`: that device's ops, in order
  Placement placement = Placement::round_robin;  ///< which device holds which stage
  /// An inference program: only forward, send_activation and recv_activation ops, and the last
  /// stage's forward computes no loss (see "Ops" at the top of this file).
  bool forward_only = false;

  /// S = K * num_chunks: the stages of the pipeline.
  constexpr std::size_t num_stages() const { return num_devices * num_chunks; }
  /// (device, chunk) => chunk * K + device (round robin), or with device mirrored to K-1-device
  /// on odd chunks (v_shape)
  constexpr std::size_t stage_of(std::size_t device, std::size_t chunk) const {
    return chunk * num_devices + (mirrored(chunk) ? num_devices - 1 - device : device);
  }
  /// stage => the device that holds it: stage % K, mirrored on odd chunks of a v_shape
  constexpr std::size_t device_of_stage(std::size_t stage) const {
    const std::size_t position = stage % num_devices;
    return mirrored(stage / num_devices) ? num_devices - 1 - position : position;
  }
  /// stage => stage / K, under either placement
  constexpr std::size_t chunk_of_stage(std::size_t stage) const { return stage / num_devices; }

  /// Equal when the counts, the placement and every device's list, in order, are.
  friend constexpr bool operator==(const Schedule&, const Schedule&) = default;

 private:
  constexpr bool mirrored(std::size_t chunk) const {
    return placement == Placement::v_shape && chunk % 2 == 1;
  }
};

}  // namespace gpipe
