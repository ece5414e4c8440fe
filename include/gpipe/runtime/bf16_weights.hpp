#pragma once
// gpipe::MixedBf16's copy of each stage's parameters in bf16, which the GEMMs read: kept between
// steps, so that a step whose optimizer wrote it (the fused AdamW update) rounds nothing first.
//
// Invariant: a stage's copy is `current` only while it equals its float master rounded to bf16.
// It becomes current by a write of the whole copy from the master (a rounding before a step's
// ops, or an optimizer's fused update) once that work has completed, and stops being current at
// any other write of the master: every writer of the parameters (runtime/parameter_store.hpp,
// runtime/optimizer_state.hpp) clears it before its write is issued. A copy that is not current is
// never read: the step's first use rounds it again.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::detail {

template <class Backend>
class Bf16Weights {
 public:
  using Buffer = typename Backend::template Buffer<bf16>;

  // Whether copies are kept (a MixedBf16 trainer's store).
  bool kept() const { return !copies_.empty(); }
  // Allocates stage s's copy of n parameters on device d (2 bytes a parameter, counted as
  // parameters), not current; stages are added in order, those of other processes with n = 0.
  void keep(Backend& backend, std::size_t s, std::size_t d, std::size_t n) {
    copies_.resize(s + 1);
    current_.resize(s + 1, false);
    if (n > 0) copies_[s] = backend.template allocate<bf16>(d, n, MemoryKind::parameters);
  }
  bf16* data(std::size_t s) { return copies_[s].data(); }

  bool current(std::size_t s) const { return kept() && current_[s]; }
  // After the work that wrote stage s's whole copy from its master has completed.
  void mark_current(std::size_t s) {
    if (kept()) current_[s] = true;
  }
  // Before any other write of stage s's master (or of every stage's) is issued.
  void invalidate(std::size_t s) {
    if (kept()) current_[s] = false;
  }
  void invalidate() { std::fill(current_.begin(), current_.end(), false); }

 private:
  std::vector<Buffer> copies_;  // per stage, on its device; empty where another process runs it
  std::vector<bool> current_;   // per stage: the copy equals the master rounded to bf16
};

}  // namespace gpipe::detail
