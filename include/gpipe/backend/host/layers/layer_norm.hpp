#pragma once
// LayerNorm on the host: the kernels of kernels/layer_norm.hpp, split over the context's team by
// rows (forward, input gradient) or by columns (weight gradient).

#include <cstddef>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/layer_norm.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer_norm.hpp"

namespace gpipe {

/// LayerNorm on the host, over the last dimension of (rows, cols): the kernels of
/// kernels/layer_norm.hpp, with statistics in double.
template <class T>
struct LayerKernels<LayerNormOp, host::Kernels<T>> {
  /// Per row: y = (x - mean) rstd gamma(cols) + beta(cols), rstd = 1 / sqrt(var + eps) with
  /// the biased variance; stats(rows, 2) = (mean, rstd) for the backward. y and stats overwritten.
  static void forward(host::Kernels<T>& k, std::size_t rows, std::size_t cols, double eps,
                      const T* x, const T* gamma, const T* beta, T* y, T* stats);
  /// dx(rows, cols) = rstd (g - mean(g) - xhat mean(g xhat)) per row, g = dy gamma, xhat =
  /// (x - mean) rstd; overwritten.
  static void backward_input(host::Kernels<T>& k, std::size_t rows, std::size_t cols, const T* x,
                             const T* dy, const T* gamma, const T* stats, T* dx);
  /// dgamma(cols) += the column sums of dy xhat, dbeta(cols) += the column sums of dy.
  static void backward_weight(host::Kernels<T>& k, std::size_t rows, std::size_t cols, const T* x,
                              const T* dy, const T* stats, T* dgamma, T* dbeta);
};

// Defined out of the classes, so that a program on gpipe::compiled compiles none of them
// (backend/host/compiled.hpp declares the float ones extern).

template <class T>
void LayerKernels<LayerNormOp, host::Kernels<T>>::forward(host::Kernels<T>& k, std::size_t rows,
                                                          std::size_t cols, double eps, const T* x,
                                                          const T* gamma, const T* beta, T* y,
                                                          T* stats) {
  k.in_blocks(rows, cols, [&](std::size_t r, std::size_t count) {
    host::layer_norm_forward(count, cols, eps, x + r * cols, gamma, beta, y + r * cols,
                             stats + 2 * r);
  });
}

template <class T>
void LayerKernels<LayerNormOp, host::Kernels<T>>::backward_input(host::Kernels<T>& k,
                                                                 std::size_t rows, std::size_t cols,
                                                                 const T* x, const T* dy,
                                                                 const T* gamma, const T* stats,
                                                                 T* dx) {
  k.in_blocks(rows, cols, [&](std::size_t r, std::size_t count) {
    host::layer_norm_backward_input(count, cols, x + r * cols, dy + r * cols, gamma, stats + 2 * r,
                                    dx + r * cols);
  });
}

template <class T>
void LayerKernels<LayerNormOp, host::Kernels<T>>::backward_weight(host::Kernels<T>& k,
                                                                  std::size_t rows,
                                                                  std::size_t cols, const T* x,
                                                                  const T* dy, const T* stats,
                                                                  T* dgamma, T* dbeta) {
  k.in_blocks(cols, rows, [&](std::size_t first, std::size_t count) {  // column blocks
    host::layer_norm_backward_weight(rows, count, x + first, dy + first, stats, dgamma + first,
                                     dbeta + first, cols);
  });
}

}  // namespace gpipe
