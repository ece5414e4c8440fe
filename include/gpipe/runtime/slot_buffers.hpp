#pragma once
// Buffer lifetimes as data: which of a (stage, micro-batch) slot's buffers each op allocates and
// frees, their size per row and their memory kind. The executor allocates and frees by this
// table and predict_memory replays it, so the two cannot disagree.
//
//   buffer       width per row      allocated by                          freed by
//   input        in_features        forward (stage 0) or recv_activation  backward_weight
//                                   (activations)                         (inference: forward)
//   stash        kept_stash_per_row forward; again by backward_input      forward when remat drops
//                                   when remat dropped it (activations;   it, else backward_weight
//                                   inference: workspace)                 (inference: forward)
//   cheap_stash  cheap_stash_per_row as stash; also dropped by forward    as stash, and by forward
//                                   and allocated again by backward_input under selective
//                                   under selective
//   output       out_features       forward (workspace), but the last     the last stage's forward
//                                   stage's in training with an in-place  (after the loss, or the
//                                   loss                                  download), else the
//                                                                         send once delivered
//   grad_output  out_features       forward of the last stage (the loss   backward_weight
//                                   gradient: activations; with an
//                                   in-place loss also the forward's y,
//                                   the loss writing dy over it), else
//                                   recv_gradient (workspace)
//   grad_input   in_features        backward_input (workspace), unless    the send once delivered;
//                                   stage 0 skips it                      stage 0: backward_input
//   grad_stash   grad_stash_per_row backward_input (workspace)            backward_weight
// Under Remat::offload a slot's stash and cheap_stash also leave the device after its F (the
// offload frees them) and come back ahead of its B (the fetch allocates them again, as
// activations): runtime/offload.hpp says which slots and when; offload_buffers, fetch_buffers.
// An op allocates its buffers before its kernels run and frees its own after them; a send hands
// its buffer to the transport, which frees it when the receiver has it (so that lifetime depends
// on timing). Besides the slot, an op takes scratch that lives for that op only: the stage's
// workspace_per_row, the recompute's output (backward_input under remat) and the last stage's
// targets.

#include <array>
#include <cstddef>
#include <cstdint>

#include "gpipe/backend/common.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe::detail {

/// The buffers of one (stage, micro-batch) slot; see the table at the top of this file.
enum class SlotBuffer : std::uint8_t {
  input,
  stash,
  output,
  grad_output,
  grad_input,
  grad_stash,
  cheap_stash
};
/// Number of SlotBuffer values.
inline constexpr std::size_t num_slot_buffers = 7;

/// A slot buffer's elements per row, of its stage's sizes.
enum class Width : std::uint8_t { in, out, stash, grad_stash, cheap_stash };

/// width_of(b): the width the table gives buffer b.
constexpr Width width_of(SlotBuffer b) {
  switch (b) {
    case SlotBuffer::input:
    case SlotBuffer::grad_input:
      return Width::in;
    case SlotBuffer::output:
    case SlotBuffer::grad_output:
      return Width::out;
    case SlotBuffer::stash:
      return Width::stash;
    case SlotBuffer::grad_stash:
      return Width::grad_stash;
    case SlotBuffer::cheap_stash:
      return Width::cheap_stash;
  }
  return Width::in;
}

/// The elements per row of buffer b of a stage whose sizes are `stage` (a StageProgram, or the
/// memory model's StageSizes: in_features, out_features, kept_stash_per_row,
/// cheap_stash_per_row, grad_stash_per_row).
template <class Sizes>
constexpr std::size_t elements_per_row(const Sizes& stage, SlotBuffer b) {
  switch (width_of(b)) {
    case Width::in:
      return stage.in_features;
    case Width::out:
      return stage.out_features;
    case Width::stash:
      return stage.kept_stash_per_row;
    case Width::grad_stash:
      return stage.grad_stash_per_row;
    case Width::cheap_stash:
      return stage.cheap_stash_per_row;
  }
  return 0;
}

/// The buffers of a (stage, micro-batch) slot, of a backend's Buffer type.
template <class Buffer>
struct SlotBuffers {
  std::array<Buffer, num_slot_buffers> buffers;
  /// Buffer b.
  Buffer& operator[](SlotBuffer b) { return buffers[static_cast<std::size_t>(b)]; }
};

/// A slot: its buffers, and the transport's mailboxes of its two messages (its output, its input
/// gradient).
template <class Buffer, class Mailbox>
struct Slot {
  SlotBuffers<Buffer> buffers;
  Mailbox activation, gradient;
  /// Buffer b.
  Buffer& operator[](SlotBuffer b) { return buffers[b]; }
};

/// One allocation of an op: the buffer and the memory kind it is counted as.
struct Allocation {
  SlotBuffer buffer = SlotBuffer::input;
  MemoryKind kind = MemoryKind::workspace;
};

/// Where an op runs, as far as its buffers depend on it.
struct OpSituation {
  bool first_stage = false;           ///< stage 0: its input comes from the caller
  bool last_stage = false;            ///< the last stage: the loss follows its forward
  bool forward_only = false;          ///< an inference program (Schedule::forward_only)
  bool recomputed = false;            ///< remat drops this micro-batch's stash after forward
  bool cheap_recomputed = false;      ///< remat drops only the cheap stash after forward
  bool has_stash = false;             ///< the stage stashes anything (kept or cheap)
  bool has_cheap_stash = false;       ///< the stage has a cheap stash (cheap_stash_per_row > 0)
  bool skips_input_gradient = false;  ///< stage 0's backward_input may leave dx out
  bool in_place_loss = false;         ///< the loss writes dy over y (loss_in_place)
};

/// The situation of stage s's ops on micro-batch mb of `schedule` under `remat` (stage s's
/// policy), for a stage whose sizes are `stage` (a StageProgram, or the memory model's
/// StageSizes: kept_stash_per_row, cheap_stash_per_row, skips_input_gradient), with a loss that
/// writes dy over y where in_place_loss: what the executor and the memory model both read
/// buffers_of with.
template <class Sizes>
constexpr OpSituation op_situation(const Schedule& schedule, Remat remat, std::size_t s,
                                   std::size_t mb, const Sizes& stage, bool in_place_loss) {
  return {.first_stage = s == 0,
          .last_stage = s + 1 == schedule.num_stages(),
          .forward_only = schedule.forward_only,
          .recomputed = recomputes(remat, mb, schedule.num_micro_batches),
          .cheap_recomputed = recomputes_cheap_part(remat, mb, schedule.num_micro_batches),
          .has_stash = stage.kept_stash_per_row + stage.cheap_stash_per_row > 0,
          .has_cheap_stash = stage.cheap_stash_per_row > 0,
          .skips_input_gradient = stage.skips_input_gradient,
          .in_place_loss = in_place_loss};
}

/// What one op does to its slot: allocations before its kernels, frees after them, each in
/// order. A send's free is the transport's, when the receiver has the data.
struct OpBuffers {
  std::array<Allocation, 6> allocates{};
  std::size_t num_allocates = 0;
  std::array<SlotBuffer, 6> frees{};
  std::size_t num_frees = 0;

  constexpr void allocate(SlotBuffer b, MemoryKind kind) { allocates[num_allocates++] = {b, kind}; }
  constexpr void free(SlotBuffer b) { frees[num_frees++] = b; }
};

/// The row of the table at the top of this file for an op of `kind` in situation `at`.
constexpr OpBuffers buffers_of(OpKind kind, const OpSituation& at) {
  constexpr MemoryKind activations = MemoryKind::activations, workspace = MemoryKind::workspace;
  OpBuffers b;
  switch (kind) {
    case OpKind::forward:
      if (at.first_stage) b.allocate(SlotBuffer::input, activations);
      if (at.forward_only) {  // nothing outlives the op but the output on its way on
        b.allocate(SlotBuffer::stash, workspace);
        b.allocate(SlotBuffer::cheap_stash, workspace);
        b.allocate(SlotBuffer::output, workspace);
        b.free(SlotBuffer::stash);
        b.free(SlotBuffer::cheap_stash);
        b.free(SlotBuffer::input);
        if (at.last_stage) b.free(SlotBuffer::output);
        return b;
      }
      b.allocate(SlotBuffer::stash, activations);
      b.allocate(SlotBuffer::cheap_stash, activations);
      if (at.last_stage && at.in_place_loss) {  // y, then dy over it
        b.allocate(SlotBuffer::grad_output, activations);
      } else {
        b.allocate(SlotBuffer::output, workspace);
        if (at.last_stage) {
          b.allocate(SlotBuffer::grad_output, activations);
          b.free(SlotBuffer::output);
        }
      }
      if (at.recomputed) b.free(SlotBuffer::stash);
      if (at.recomputed || at.cheap_recomputed) b.free(SlotBuffer::cheap_stash);
      return b;
    case OpKind::backward_input:
      if (at.recomputed && at.has_stash) {
        b.allocate(SlotBuffer::stash, activations);
        b.allocate(SlotBuffer::cheap_stash, activations);
      }
      if (at.cheap_recomputed && at.has_cheap_stash)
        b.allocate(SlotBuffer::cheap_stash, activations);
      if (!(at.first_stage && at.skips_input_gradient))
        b.allocate(SlotBuffer::grad_input, workspace);
      b.allocate(SlotBuffer::grad_stash, workspace);
      if (at.first_stage) b.free(SlotBuffer::grad_input);
      return b;
    case OpKind::backward_weight:
      b.free(SlotBuffer::input);
      b.free(SlotBuffer::stash);
      b.free(SlotBuffer::cheap_stash);
      b.free(SlotBuffer::grad_output);
      b.free(SlotBuffer::grad_stash);
      return b;
    case OpKind::recv_activation:
      b.allocate(SlotBuffer::input, activations);
      return b;
    case OpKind::recv_gradient:
      b.allocate(SlotBuffer::grad_output, workspace);
      return b;
    case OpKind::send_activation:
      b.free(SlotBuffer::output);
      return b;
    case OpKind::send_gradient:
      b.free(SlotBuffer::grad_input);
      return b;
  }
  return b;
}

// Remat::offload's move of a slot's stash to host memory, right after its F: it frees the stash
// and the cheap stash on the device (runtime/offload.hpp).
constexpr OpBuffers offload_buffers() {
  OpBuffers b;
  b.free(SlotBuffer::stash);
  b.free(SlotBuffer::cheap_stash);
  return b;
}

// Remat::offload's fetch of a slot's stash back ahead of its B: it allocates the stash and the
// cheap stash again, as activations, which W frees.
constexpr OpBuffers fetch_buffers() {
  OpBuffers b;
  b.allocate(SlotBuffer::stash, MemoryKind::activations);
  b.allocate(SlotBuffer::cheap_stash, MemoryKind::activations);
  return b;
}

}  // namespace gpipe::detail
