#pragma once
// LayerNorm on the host: the kernels of kernels/layer_norm.hpp.

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
                      const T* x, const T* gamma, const T* beta, T* y, T* stats) {
    k.layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats);
  }
  /// dx(rows, cols) = rstd (g - mean(g) - xhat mean(g xhat)) per row, g = dy gamma, xhat =
  /// (x - mean) rstd; overwritten.
  static void backward_input(host::Kernels<T>& k, std::size_t rows, std::size_t cols, const T* x,
                             const T* dy, const T* gamma, const T* stats, T* dx) {
    k.layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx);
  }
  /// dgamma(cols) += the column sums of dy xhat, dbeta(cols) += the column sums of dy.
  static void backward_weight(host::Kernels<T>& k, std::size_t rows, std::size_t cols, const T* x,
                              const T* dy, const T* stats, T* dgamma, T* dbeta) {
    k.layer_norm_backward_weight(rows, cols, x, dy, stats, dgamma, dbeta);
  }
};

}  // namespace gpipe
