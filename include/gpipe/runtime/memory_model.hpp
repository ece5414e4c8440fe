#pragma once
// The memory model: what each device holds during a step, predicted from the model's types, the
// batch, the schedule and the remat policy of each stage, by replaying in each device's op order
// the table of what each op allocates and frees (runtime/slot_buffers.hpp), the one the executor
// allocates by.
//
// Activations (a stage's input and stash per micro-batch, and the loss gradient on the last
// stage) are allocated and freed only by the device's own ops, so their peak is exact. Workspace
// also holds outputs waiting for the next stage to receive them, which depends on timing; it is
// given as an upper bound. A step with packed documents also holds each live (stage,
// micro-batch)'s document ids, 4 bytes a row from its F to its W (MemoryKind::other), exactly.
//
// GPipe's claim in these terms, for a stage of L layers of width d, micro-batch size n = N/M:
//   never:  M n (d + L d) = N (L + 1) d                      O(N L)
//   always: M n d + n L d = N d + (N/M) L d                   O(N + L N / M)
// so `always` keeps about (M + L) / (M L) of `never` when L and M are large. `selective` keeps
// the stash less its cheap part c per row, and rebuilds c for one micro-batch at a time between
// its B and its W (several where a zero-bubble schedule delays W):
//   selective: N (d + L d - c) + (N/M) c  (fill-drain)
// `offload` keeps what `never` keeps, but a micro-batch's stash only from its F to the offload and
// from its fetch (ahead of the op before its B) to its W: in fill-drain about N d + 2 (N/M) L d
// on the device, and the stashes of the offloaded micro-batches in pinned host memory.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/micro_batch.hpp"
#include "gpipe/runtime/offload.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/slot_buffers.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// What one device holds during a step, as `predict_memory` predicts it, in bytes. Parameters,
/// gradients and optimizer state are those of the device's stages; activations are the stage
/// inputs and stashes per micro-batch (and the last stage's loss gradient) at their peak.
struct DeviceMemoryPrediction {
  std::size_t parameters = 0;        ///< bytes: float masters, and under MixedBf16 their bf16 copy
  std::size_t gradients = 0;         ///< bytes
  std::size_t optimizer_state = 0;   ///< bytes, for the given floats of state per parameter
  std::size_t activations_peak = 0;  ///< bytes, exact
  std::size_t workspace_bound = 0;   ///< bytes, an upper bound on the workspace peak
  /// bytes, exact: the packed documents' ids (MemoryKind::other) at their peak; 0 without them
  std::size_t documents_peak = 0;
  /// bytes of pinned host memory, exact: under Remat::offload the device's offloaded stashes, a
  /// block per offloaded (stage, micro-batch) (cuda::Backend::host_memory_stats); host memory,
  /// so not in total_bound(); 0 under other policies
  std::size_t offloaded = 0;

  /// An upper bound on the device's total peak.
  std::size_t total_bound() const {
    return parameters + gradients + optimizer_state + activations_peak + workspace_bound +
           documents_peak;
  }
};

namespace detail {

// Per-stage sizes in elements per row (named as StageProgram names them), from the stage types.
struct StageSizes {
  std::size_t in_features = 0, out_features = 0, kept_stash_per_row = 0, cheap_stash_per_row = 0,
              grad_stash_per_row = 0, workspace_per_row = 0, num_params = 0;
  bool skips_input_gradient = false;
};

template <class S>
StageSizes stage_size() {
  return {S::in_features,         S::out_features,        S::stash_per_row - S::cheap_stash_per_row,
          S::cheap_stash_per_row, S::grad_stash_per_row,  workspace_per_row_v<S>,
          S::num_params,          skips_input_gradient<S>};
}

template <class Model>
std::vector<StageSizes> stage_sizes() {
  std::vector<StageSizes> out;
  [&]<std::size_t... S>(std::index_sequence<S...>) {
    (out.push_back(stage_size<typename Model::template stage_t<S>>()), ...);
  }
  (std::make_index_sequence<Model::num_stages>{});
  return out;
}

// The peak of device d's slot buffers of memory kind `kind`, in bytes of `a` an element: its
// ops' allocations and frees replayed in list order, as the executor makes them. Exact for
// activations; for the workspace, a send's buffer is freed here at the send, where the executor
// frees it once the receiver has copied it (workspace_bound adds them back).
inline std::size_t slot_peak(const Schedule& schedule, std::size_t d,
                             const std::vector<StageSizes>& st, const MicroBatchSplit& split,
                             std::span<const Remat> remat, std::size_t a, bool in_place_loss,
                             MemoryKind kind) {
  const std::size_t S = schedule.num_stages(), M = schedule.num_micro_batches;
  std::size_t current = 0, peak = 0;
  // the bytes of `kind` each slot buffer holds now, as the executor allocates them
  std::vector<std::array<std::size_t, num_slot_buffers>> held(S * M);
  const auto apply = [&](const OpBuffers& ops, std::size_t s, std::size_t mb) {
    auto& slot = held[s * M + mb];
    for (std::size_t i = 0; i < ops.num_allocates; ++i) {
      const Allocation& alloc = ops.allocates[i];
      if (alloc.kind != kind) continue;
      const std::size_t bytes = split.size(mb) * elements_per_row(st[s], alloc.buffer) * a;
      slot[static_cast<std::size_t>(alloc.buffer)] = bytes;
      peak = std::max(peak, current += bytes);
    }
    for (std::size_t i = 0; i < ops.num_frees; ++i)
      current -= std::exchange(slot[static_cast<std::size_t>(ops.frees[i])], 0);
  };
  // Remat::offload: a slot's stash leaves after its F and comes back ahead of an op (offload.hpp)
  const OffloadPlan offload = offload_plan(schedule, remat, st);
  for (std::size_t p = 0; p < schedule.ops[d].size(); ++p) {
    const Op& op = schedule.ops[d][p];
    for (const std::size_t slot : offload.fetches(d, p)) apply(fetch_buffers(), slot / M, slot % M);
    const std::size_t s = schedule.stage_of(d, op.chunk), mb = op.micro_batch;
    apply(buffers_of(op.kind, op_situation(schedule, remat[s], s, mb, st[s], in_place_loss)), s,
          mb);
    if (op.kind == OpKind::forward && offload.offloads(s, mb)) apply(offload_buffers(), s, mb);
  }
  return peak;
}

// The pinned host memory device d's offloaded stashes take under Remat::offload, in bytes of `a`
// an element: a block per offloaded (stage, micro-batch), for the whole step (offload.hpp).
inline std::size_t offloaded_bytes(const Schedule& schedule, std::size_t d,
                                   const std::vector<StageSizes>& st, const MicroBatchSplit& split,
                                   std::span<const Remat> remat, std::size_t a) {
  const OffloadPlan offload = offload_plan(schedule, remat, st);
  std::size_t bytes = 0;
  for (std::size_t s = 0; s < schedule.num_stages(); ++s) {
    if (schedule.device_of_stage(s) != d) continue;
    for (std::size_t mb = 0; mb < schedule.num_micro_batches; ++mb)
      if (offload.offloads(s, mb)) bytes += split.size(mb) * offloaded_per_row(st[s]) * a;
  }
  return bytes;
}

// The peak of device d's document ids, in bytes: 4 a row of each (stage, micro-batch) from its F
// to its W (to the F's end in an inference program), replayed in list order as the executor
// holds them.
inline std::size_t documents_peak(const Schedule& schedule, std::size_t d,
                                  const MicroBatchSplit& split) {
  std::size_t current = 0, peak = 0;
  for (const Op& op : schedule.ops[d]) {
    const std::size_t bytes = split.size(op.micro_batch) * sizeof(std::int32_t);
    if (op.kind == OpKind::forward) peak = std::max(peak, current + bytes);
    if (op.kind == OpKind::forward && !schedule.forward_only) current += bytes;
    if (op.kind == OpKind::backward_weight) current -= bytes;
  }
  return peak;
}

// An upper bound on device d's workspace, in bytes, for the batch's split and activations of
// `a` bytes an element (bf16 when a < 4): the slot buffers counted as workspace replayed in list
// order (outputs and input gradients until their send, gradient stashes and received gradients
// until backward_weight, which zero-bubble schedules run long after B), plus what the replay
// leaves out.
inline std::size_t workspace_bound(const Schedule& schedule, std::size_t d,
                                   const std::vector<StageSizes>& st, const MicroBatchSplit& split,
                                   std::span<const Remat> remat, std::size_t a, bool in_place_loss,
                                   std::size_t target_bytes_per_row) {
  constexpr std::size_t f = sizeof(float);
  const std::size_t rows = split.rows, max_rows = split.size(0);
  const std::size_t replayed =
      slot_peak(schedule, d, st, split, remat, a, in_place_loss, MemoryKind::workspace);
  // Within one op at most an output or recompute scratch, the input and output gradients, the
  // grad stash, the stage's scratch and the targets.
  std::size_t within_op = 0;
  for (const Op& op : schedule.ops[d]) {
    const StageSizes& z = st[schedule.stage_of(d, op.chunk)];
    within_op = std::max(within_op, max_rows *
                                            (z.out_features + z.in_features + z.out_features +
                                             z.grad_stash_per_row + z.workspace_per_row) *
                                            a +
                                        max_rows * target_bytes_per_row);
  }
  // After their send, outputs and input gradients waiting for the neighbour to copy them (at most
  // every micro-batch of every stage on the device; the last stage's output goes to the loss
  // within its forward, and the first stage's input gradient, if any, is freed within its
  // backward_input) and the per-micro-batch losses.
  std::size_t waiting = 0;
  for (std::size_t s = 0; s < schedule.num_stages(); ++s) {
    if (schedule.device_of_stage(s) != d) continue;
    const bool sends_output = s + 1 < schedule.num_stages();
    const bool sends_gradient = s > 0;
    waiting +=
        rows *
        ((sends_output ? st[s].out_features : 0) + (sends_gradient ? st[s].in_features : 0)) * a;
  }
  return replayed + within_op + waiting + schedule.num_micro_batches * f;
}

}  // namespace detail

/// Prediction for every device of `schedule` running Model on a batch of `rows` rows (tokens, in
/// a token model: samples times Model::tokens_per_sample), each stage s under the remat policy
/// stage_remat[s] (one entry per stage: Trainer::Options::stage_remat; a device's memory depends
/// on its own stages' policies only), in `Precision` (`Fp32`, or `MixedBf16`:
/// activations, stashes, hand-overs and scratch of 2 bytes an element, and the stages' parameters
/// kept in bf16 beside their float masters, 2 more bytes a parameter, counted as parameters).
/// target_bytes_per_row: bytes of the loss's targets per row (4 for class ids, 4 * out for MSE).
/// in_place_loss: the loss writes its gradient over the last stage's output (loss_in_place: both
/// built-in losses), which then holds one (rows, out_features) buffer where another loss needs two.
/// document_ids: the step packs documents (forward_backward's third argument), whose ids each
/// device holds per live (stage, micro-batch) (DeviceMemoryPrediction::documents_peak).
/// Throws gpipe::Error for stage_remat of another length than the model's stages.
template <class Model, class Precision = Fp32>
std::vector<DeviceMemoryPrediction> predict_memory(const Schedule& schedule, std::size_t rows,
                                                   const std::vector<Remat>& stage_remat,
                                                   std::size_t optimizer_state_per_param = 0,
                                                   std::size_t target_bytes_per_row = 4,
                                                   bool in_place_loss = true,
                                                   bool document_ids = false) {
  constexpr std::size_t f = sizeof(float);                                // master arrays
  constexpr std::size_t a = sizeof(typename Precision::activation_type);  // activations
  const std::vector<detail::StageSizes> st = detail::stage_sizes<Model>();
  const std::size_t S = schedule.num_stages(), M = schedule.num_micro_batches;
  detail::require(stage_remat.size() == S, [&] {
    return "predict_memory: " + std::to_string(stage_remat.size()) +
           " remat policies, expected one per stage: " + std::to_string(S);
  });
  const MicroBatchSplit split{rows, M, Model::tokens_per_sample};
  const std::span<const Remat> remat(stage_remat);

  std::vector<DeviceMemoryPrediction> out(schedule.num_devices);
  for (std::size_t s = 0; s < S; ++s) {
    DeviceMemoryPrediction& p = out[schedule.device_of_stage(s)];
    p.parameters += st[s].num_params * (a == f ? f : f + a);  // MixedBf16: the bf16 copy too
    p.gradients += st[s].num_params * f;
    p.optimizer_state += st[s].num_params * optimizer_state_per_param * f;
  }

  for (std::size_t d = 0; d < schedule.num_devices; ++d) {
    out[d].activations_peak =
        detail::slot_peak(schedule, d, st, split, remat, a, in_place_loss, MemoryKind::activations);
    out[d].workspace_bound = detail::workspace_bound(schedule, d, st, split, remat, a,
                                                     in_place_loss, target_bytes_per_row);
    if (document_ids) out[d].documents_peak = detail::documents_peak(schedule, d, split);
    out[d].offloaded = detail::offloaded_bytes(schedule, d, st, split, remat, a);
  }
  return out;
}

/// predict_memory with `remat` the policy of every stage (Trainer::Options::remat).
template <class Model, class Precision = Fp32>
std::vector<DeviceMemoryPrediction> predict_memory(const Schedule& schedule, std::size_t rows,
                                                   Remat remat,
                                                   std::size_t optimizer_state_per_param = 0,
                                                   std::size_t target_bytes_per_row = 4,
                                                   bool in_place_loss = true,
                                                   bool document_ids = false) {
  return predict_memory<Model, Precision>(
      schedule, rows, std::vector<Remat>(schedule.num_stages(), remat), optimizer_state_per_param,
      target_bytes_per_row, in_place_loss, document_ids);
}

}  // namespace gpipe
