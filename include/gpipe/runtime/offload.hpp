#pragma once
// Activation offload (Remat::offload) as data, and the seam through which a backend moves the
// bytes. Which (stage, micro-batch) slots send their stash (kept and cheap part) to pinned host
// memory after F, and ahead of which op each comes back, is one OffloadPlan: the executor issues
// by it and predict_memory replays it, so that the two cannot disagree.
//
// The rule, per device d and its op list: slot (s, mb)'s stash comes back ahead of the last
// compute op of d before its B, so that the copy to the device runs beside that op; it offloads
// when two compute ops of d or more run between its F and its B, so that it is away during one
// at least (with none, B would wait for a round trip with nothing to hide it behind; with one,
// it would come back as soon as it left). GPipe on device 0 of K 2, M 3 (W right after its B):
//
//   op:        F0  F1  F2  B2  W2  B1  W1  B0  W0
//   offload:   0   1   -                              (F2: B2 follows at once)
//   fetch:                     1       0              (ahead of W2: mb 1; ahead of W1: mb 0)
//
// A slot's stash leaves the device (is freed, in the copy stream's order) right after its F, is
// allocated again by the fetch, and is freed by W as without offload (runtime/slot_buffers.hpp:
// offload_buffers, fetch_buffers). The host side holds one block per offloaded slot for the
// whole step, at fixed addresses (a CUDA graph replays the copies), as DeviceMemoryPrediction::
// offloaded counts it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe::detail {

// The elements per row a slot of a stage whose sizes are `stage` (StageProgram or StageSizes)
// moves to host memory: its stash, kept and cheap part (offload_buffers' buffers).
template <class Sizes>
constexpr std::size_t offloaded_per_row(const Sizes& stage) {
  return stage.kept_stash_per_row + stage.cheap_stash_per_row;
}

// Which slots of a step offload, and where each comes back (see the top of this file).
struct OffloadPlan {
  std::size_t micro_batches = 0;
  std::vector<char> offloaded;  // [s M + mb]
  // [d][position in schedule.ops[d]]: the slots (s M + mb) fetched ahead of that op
  std::vector<std::vector<std::vector<std::size_t>>> fetched_before;

  bool offloads(std::size_t s, std::size_t mb) const {
    return !offloaded.empty() && offloaded[s * micro_batches + mb] != 0;
  }
  // The slots fetched ahead of op `position` of device d.
  std::span<const std::size_t> fetches(std::size_t d, std::size_t position) const {
    if (fetched_before.empty()) return {};
    return fetched_before[d][position];
  }
  bool empty() const { return fetched_before.empty(); }
};

// The plan of `schedule` under the stages' policies `stage_remat` ([stage]; empty: none
// offloads), for stages whose sizes are `stages` (StageProgram or the memory model's StageSizes:
// kept_stash_per_row, cheap_stash_per_row): empty unless a stage's policy is Remat::offload and
// the schedule trains. Only the slots of the stages under Remat::offload offload; the rule reads
// the device's op list alone, whatever its other stages' policies.
template <class Stages>
OffloadPlan offload_plan(const Schedule& schedule, std::span<const Remat> stage_remat,
                         const Stages& stages) {
  OffloadPlan plan;
  const bool any =
      std::find(stage_remat.begin(), stage_remat.end(), Remat::offload) != stage_remat.end();
  if (!any || schedule.forward_only) return plan;
  const std::size_t M = schedule.num_micro_batches;
  plan.micro_batches = M;
  plan.offloaded.assign(schedule.num_stages() * M, 0);
  plan.fetched_before.resize(schedule.num_devices);
  for (std::size_t d = 0; d < schedule.num_devices; ++d) {
    const std::vector<Op>& ops = schedule.ops[d];
    plan.fetched_before[d].resize(ops.size());
    constexpr std::size_t none = static_cast<std::size_t>(-1);
    // per slot of this device: the compute ops before its F, `none` before it
    std::vector<std::size_t> forward_at(schedule.num_stages() * M, none);
    std::size_t computes = 0;      // the compute ops so far
    std::size_t last_compute = 0;  // the latest one's position
    for (std::size_t p = 0; p < ops.size(); ++p) {
      const Op& op = ops[p];
      const std::size_t s = schedule.stage_of(d, op.chunk), slot = s * M + op.micro_batch;
      if (op.kind == OpKind::forward) forward_at[slot] = computes;
      if (op.kind == OpKind::backward_input && stage_remat[s] == Remat::offload &&
          forward_at[slot] != none && computes >= forward_at[slot] + 3 &&  // F, then two or more
          offloaded_per_row(stages[s]) > 0) {
        plan.offloaded[slot] = 1;
        plan.fetched_before[d][last_compute].push_back(slot);
      }
      if (is_compute(op.kind)) {
        ++computes;
        last_compute = p;
      }
    }
  }
  return plan;
}

// The plan under one policy for every stage.
template <class Stages>
OffloadPlan offload_plan(const Schedule& schedule, Remat remat, const Stages& stages) {
  const std::vector<Remat> each(schedule.num_stages(), remat);
  return offload_plan(schedule, std::span<const Remat>(each), stages);
}

// The seam: how a backend moves an offloaded slot's stash to host memory and back. This primary
// template is every backend without a copy stream: it does not support Remat::offload, which the
// trainer refuses (check_offload). backend/cuda/offload.cuh specializes it for cuda::Backend.
template <class Backend>
class Offload {
 public:
  static constexpr bool supported = false;
  explicit Offload(Backend&) {}
};

// Throws gpipe::Error for Remat::offload, on any stage of stage_remat ([stage]), on a backend
// whose Offload does not support it.
template <class Backend>
void check_offload(std::span<const Remat> stage_remat) {
  const bool any =
      std::find(stage_remat.begin(), stage_remat.end(), Remat::offload) != stage_remat.end();
  require(!any || Offload<Backend>::supported, [&] {
    return "Remat::offload moves activations to pinned host memory over a device's copy "
           "stream, and the " +
           std::string(Backend::name) +
           " backend has none: use Remat::never, selective, except_last or always";
  });
}

}  // namespace gpipe::detail
