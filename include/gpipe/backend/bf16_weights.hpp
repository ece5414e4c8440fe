#pragma once
// The bf16 copy of a stage's float parameters that a backend's bf16 kernel context reads GEMM
// operands from: under gpipe::MixedBf16 the runtime rounds each stage's parameters to bf16 once
// per step and names the copy to the context before each of the stage's ops
// (runtime/stage_ops.hpp); a float operand inside the named parameters is then read from the
// copy instead of being rounded at each use. The same for every backend.

#include <cstddef>

#include "gpipe/model/precision.hpp"

namespace gpipe::detail {

/// The named copy (see the top of this file): a pointer range of float master parameters and
/// their bf16 rounding, element for element.
class Bf16WeightCopy {
 public:
  /// Names `copy`, the bf16 rounding of master(n); a null master forgets the last one.
  void use(const float* master, const bf16* copy, std::size_t n) {
    master_ = master;
    copy_ = copy;
    count_ = master == nullptr ? 0 : n;
  }
  /// The copy of p(n) when p(n) lies within the named master, else nullptr.
  const bf16* find(const float* p, std::size_t n) const {
    if (master_ == nullptr || p < master_ || p + n > master_ + count_) return nullptr;
    return copy_ + (p - master_);
  }

 private:
  const float* master_ = nullptr;
  const bf16* copy_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace gpipe::detail
