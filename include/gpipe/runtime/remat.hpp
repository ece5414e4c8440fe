#pragma once
// Re-materialization policy: which micro-batches keep their stage activations from forward to
// backward, and which keep only the stage input and recompute the rest before backward.
//
//   never        keep everything: no recompute; stash of every micro-batch alive until its W
//   always       keep only each stage's input; recompute the stage's forward before its B
//   except_last  as always, but the last micro-batch (whose backward runs right after its
//                forward in fill-drain) keeps its activations

#include <cstddef>
#include <string_view>

namespace gpipe {

/// Re-materialization policy (`Trainer::Options::remat`): which micro-batches keep their stage
/// activations from forward to backward, and which keep only the stage input and recompute the
/// rest before backward. Gradients are the same under every policy; memory and compute differ.
enum class Remat {
  never,       ///< keep everything: no recompute; every micro-batch's stash lives until its W
  always,      ///< keep only each stage's input; recompute the stage's forward before its B
  except_last  ///< as `always`, but the last micro-batch (backward right after its forward in
               ///< fill-drain) keeps its activations
};

/// The policy's name as written in code: "never", "always", "except_last".
constexpr std::string_view to_string(Remat policy) {
  switch (policy) {
    case Remat::never:
      return "never";
    case Remat::always:
      return "always";
    case Remat::except_last:
      return "except_last";
  }
  return "unknown";
}

/// Whether micro-batch mb of M drops its activations after forward and recomputes them.
constexpr bool recomputes(Remat policy, std::size_t micro_batch, std::size_t num_micro_batches) {
  switch (policy) {
    case Remat::never:
      return false;
    case Remat::always:
      return true;
    case Remat::except_last:
      return micro_batch + 1 != num_micro_batches;
  }
  return false;
}

}  // namespace gpipe
