#pragma once
// Embedding on the host: rows gather a row of wte and of wpe; W adds each row's dy into the
// rows it read, in row order (deterministic: the same sums in the same order every step). With
// document ids, each row's position (its row of wpe) is found first, in one pass over the rows.
// Without a position table (wpe and dwpe null: TokenEmbedding) only wte is read and written.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/positions.hpp"
#include "gpipe/backend/host/kernels/simd.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/embedding.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {
/// Embedding on the host, on rows = samples * tokens rows of width `width`: ids(rows) are token
/// ids stored as T and rounded to the nearest integer; a negative one throws `gpipe::Error`.
/// Without a position table (wpe and dwpe null: TokenEmbedding) only wte is read and written.
template <class T>
struct LayerKernels<EmbeddingOp, host::KernelContext<T>> {
  /// y(r, :) = wte(id_r, :) + wpe(p_r, :), y (rows, width) overwritten; p_r the row's position
  /// (host::document_positions)
  static void forward(host::KernelContext<T>&, std::size_t rows, std::size_t tokens,
                      std::size_t width, const T* ids, const T* wte, const T* wpe, T* y,
                      const std::int32_t* document = nullptr) {
    if (wpe == nullptr) {
      for (std::size_t r = 0; r < rows; ++r)
        std::copy_n(wte + id(ids[r]) * width, width, y + r * width);
      return;
    }
    std::vector<std::size_t> position;
    host::document_positions(rows, tokens, document, position);
    for (std::size_t r = 0; r < rows; ++r)
      host::simd::transform(
          width, [](auto e, auto p) { return e + p; }, y + r * width, wte + id(ids[r]) * width,
          wpe + position[r] * width);
  }
  /// dwte(id_r, :) += dy(r, :), dwpe(p_r, :) += dy(r, :), row by row in order
  static void backward_weight(host::KernelContext<T>&, std::size_t rows, std::size_t tokens,
                              std::size_t width, const T* ids, const T* dy, T* dwte, T* dwpe,
                              const std::int32_t* document = nullptr) {
    std::vector<std::size_t> position;
    host::document_positions(rows, tokens, document, position);
    for (std::size_t r = 0; r < rows; ++r) {
      const T* g = dy + r * width;
      T* e = dwte + id(ids[r]) * width;
      host::simd::transform(
          width, [](auto acc, auto v) { return acc + v; }, e, e, g);
      if (dwpe == nullptr) continue;
      T* p = dwpe + position[r] * width;
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

/// Embedding on bf16 activations: ids(rows) are token ids carried in a bf16's 16 bits as an
/// unsigned integer (the executor stores them so: bf16 values hold integers exactly only up to
/// 256); the sums wte + wpe are formed in float and rounded once; W adds dy widened to float.
template <>
struct LayerKernels<EmbeddingOp, host::KernelContext<bf16>> {
  /// y(r, :) = wte(id_r, :) + wpe(p_r, :), rounded to bf16; p_r the row's position
  /// (host::document_positions)
  static void forward(host::KernelContext<bf16>& k, std::size_t rows, std::size_t tokens,
                      std::size_t width, const bf16* ids, const float* wte, const float* wpe,
                      bf16* y, const std::int32_t* document = nullptr) {
    std::vector<std::size_t> position;
    host::document_positions(rows, tokens, document, position);
    k.in_blocks(rows, width, [&](std::size_t first, std::size_t count) {
      std::vector<float> row(width);
      for (std::size_t r = first; r < first + count; ++r) {
        if (wpe == nullptr) {
          host::to_bf16(width, wte + ids[r].bits * width, y + r * width);
          continue;
        }
        host::add(width, wte + ids[r].bits * width, wpe + position[r] * width, row.data());
        host::to_bf16(width, row.data(), y + r * width);
      }
    });
  }
  /// dwte(id_r, :) += dy(r, :), dwpe(p_r, :) += dy(r, :), row by row in order
  static void backward_weight(host::KernelContext<bf16>&, std::size_t rows, std::size_t tokens,
                              std::size_t width, const bf16* ids, const bf16* dy, float* dwte,
                              float* dwpe, const std::int32_t* document = nullptr) {
    std::vector<std::size_t> position;
    host::document_positions(rows, tokens, document, position);
    std::vector<float> g(width);
    for (std::size_t r = 0; r < rows; ++r) {
      host::from_bf16(width, dy + r * width, g.data());
      host::accumulate(width, g.data(), dwte + ids[r].bits * width);
      if (dwpe != nullptr) host::accumulate(width, g.data(), dwpe + position[r] * width);
    }
  }
};

}  // namespace gpipe
