#pragma once
// Re-materialization policy: which micro-batches keep their stage activations from forward to
// backward, and which keep only the stage input (or, under selective, all but the cheap part of
// the stash) and recompute the rest before backward.
//
//   never        keep everything: no recompute; stash of every micro-batch alive until its W
//   always       keep only each stage's input; recompute the stage's forward before its B
//   except_last  as always, but the last micro-batch (whose backward runs right after its
//                forward in fill-drain) keeps its activations
//   selective    keep the input and the stash but its cheap part (the outputs and stashes of the
//                layers marked cheap_to_recompute: norms, activations); recompute those before B
//   offload      keep everything, but move a micro-batch's stash to pinned host memory after its F
//                and back before its B, overlapped with compute (runtime/offload.hpp; backends
//                with a copy stream: cuda::Backend, mpi::CudaBackend)

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/error.hpp"

namespace gpipe {

/// Re-materialization policy (`Trainer::Options::remat`, or one per stage:
/// `Trainer::Options::stage_remat`): which micro-batches keep their stage activations from
/// forward to backward, and which keep only the stage input (or, under `selective`, all but the
/// cheap part) and recompute the rest before backward. Gradients are the same under every policy
/// and any mix of them; memory and compute differ.
enum class Remat {
  never,        ///< keep everything: no recompute; every micro-batch's stash lives until its W
  always,       ///< keep only each stage's input; recompute the stage's forward before its B
  except_last,  ///< as `always`, but the last micro-batch (backward right after its forward in
                ///< fill-drain) keeps its activations
  /// Megatron's selective recomputation: keep the GEMM outputs and drop only the stash's cheap
  /// part, the outputs (and statistics) of the layers marked `cheap_to_recompute` (LayerNorm,
  /// RMSNorm, ReLU, GELU, GELUTanh, SwiGLU) inside a stage; recompute just those before B
  /// (README, "Memory and re-materialization").
  selective,
  /// Activation offload: nothing is recomputed; each micro-batch's stash (kept and cheap part)
  /// goes to pinned host memory on the device's copy stream after its F and comes back ahead of
  /// its B, overlapped with the device's other ops, where two compute ops or more run between
  /// the two (else it keeps its stash: the copies would have nothing to hide behind). Needs a
  /// backend with a copy
  /// stream (cuda::Backend, mpi::CudaBackend); a Trainer on another backend throws gpipe::Error
  /// (README, "Activation offload").
  offload
};

/// The policy's name as written in code: "never", "always", "except_last", "selective",
/// "offload".
constexpr std::string_view to_string(Remat policy) {
  switch (policy) {
    case Remat::never:
      return "never";
    case Remat::always:
      return "always";
    case Remat::except_last:
      return "except_last";
    case Remat::selective:
      return "selective";
    case Remat::offload:
      return "offload";
  }
  return "unknown";
}

/// Whether micro-batch mb of M drops all its activations after forward and recomputes the
/// stage's whole forward before its backward (`selective` drops only the cheap part:
/// recomputes_cheap_part; `offload` recomputes nothing).
constexpr bool recomputes(Remat policy, std::size_t micro_batch, std::size_t num_micro_batches) {
  switch (policy) {
    case Remat::never:
    case Remat::selective:
    case Remat::offload:
      return false;
    case Remat::always:
      return true;
    case Remat::except_last:
      return micro_batch + 1 != num_micro_batches;
  }
  return false;
}

/// Whether micro-batch mb of M drops only the cheap part of its stash after forward and
/// recomputes that part (the cheap layers' forward) before its backward: `selective`.
constexpr bool recomputes_cheap_part(Remat policy, std::size_t /*micro_batch*/,
                                     std::size_t /*num_micro_batches*/) {
  return policy == Remat::selective;
}

namespace detail {

// Every stage's policy, [stage]: stage_remat where it is given (one entry per stage), else
// `remat` for each of num_stages stages. Throws gpipe::Error for stage_remat of another length,
// or given beside a `remat` other than its default (Remat::never), which it would override.
inline std::vector<Remat> stage_policies(Remat remat, std::span<const Remat> stage_remat,
                                         std::size_t num_stages) {
  if (stage_remat.empty()) return std::vector<Remat>(num_stages, remat);
  require(stage_remat.size() == num_stages, [&] {
    return "stage_remat has " + std::to_string(stage_remat.size()) +
           " policies, expected one per stage: " + std::to_string(num_stages) +
           " (or none: remat for every stage)";
  });
  require(remat == Remat::never, [&] {
    return "stage_remat gives every stage's policy, and remat is " + std::string(to_string(remat)) +
           ": set one of them (remat: the same policy for every stage)";
  });
  return {stage_remat.begin(), stage_remat.end()};
}

// Stage s's policy of a step's per-stage policies, [stage]; none (an inference program):
// Remat::never.
constexpr Remat policy_of(std::span<const Remat> stage_remat, std::size_t s) {
  return stage_remat.empty() ? Remat::never : stage_remat[s];
}

}  // namespace detail

}  // namespace gpipe
