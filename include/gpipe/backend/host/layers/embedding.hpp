#pragma once
// Embedding on the host: rows gather a row of wte and of wpe; W adds each row's dy into the
// rows it read, in row order (deterministic: the same sums in the same order every step).

#include <cmath>
#include <cstddef>
#include <string>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/simd.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/embedding.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {

/// Embedding on the host, on rows = samples * tokens rows of width `width`: ids(rows) are token
/// ids stored as T and rounded to the nearest integer; a negative one throws `gpipe::Error`.
template <class T>
struct LayerKernels<EmbeddingOp, host::Kernels<T>> {
  /// y(r, :) = wte(id_r, :) + wpe(r % tokens, :), y (rows, width) overwritten
  static void forward(host::Kernels<T>&, std::size_t rows, std::size_t tokens, std::size_t width,
                      const T* ids, const T* wte, const T* wpe, T* y) {
    for (std::size_t r = 0; r < rows; ++r)
      host::simd::transform(
          width, [](auto e, auto p) { return e + p; }, y + r * width, wte + id(ids[r]) * width,
          wpe + (r % tokens) * width);
  }
  /// dwte(id_r, :) += dy(r, :), dwpe(r % tokens, :) += dy(r, :), row by row in order
  static void backward_weight(host::Kernels<T>&, std::size_t rows, std::size_t tokens,
                              std::size_t width, const T* ids, const T* dy, T* dwte, T* dwpe) {
    for (std::size_t r = 0; r < rows; ++r) {
      const T* g = dy + r * width;
      T* e = dwte + id(ids[r]) * width;
      T* p = dwpe + (r % tokens) * width;
      host::simd::transform(
          width, [](auto acc, auto v) { return acc + v; }, e, e, g);
      host::simd::transform(
          width, [](auto acc, auto v) { return acc + v; }, p, p, g);
    }
  }

 private:
  /// The Trainer has checked every id against the vocabulary; a negative one here would read
  /// outside wte, so it is refused rather than trusted.
  static std::size_t id(T value) {
    const long long i = std::llround(value);
    if (i < 0) throw Error("gpipe: Embedding got token id " + std::to_string(i));
    return static_cast<std::size_t>(i);
  }
};

}  // namespace gpipe
