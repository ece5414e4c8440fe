#pragma once
// LayerNorm on the host: the kernels of kernels/layer_norm.hpp, split over the context's team by
// rows (forward, input gradient) or by columns (weight gradient).

#include <cstddef>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/elementwise.hpp"
#include "gpipe/backend/host/kernels/layer_norm.hpp"
#include "gpipe/backend/host/linkage.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer_norm.hpp"

namespace gpipe {

/// LayerNorm on the host, over the last dimension of (rows, cols): the kernels of
/// kernels/layer_norm.hpp, with statistics in double.
template <class T>
struct LayerKernels<LayerNormOp, host::KernelContext<T>> {
  /// Per row: y = (x - mean) rstd gamma(cols) + beta(cols), rstd = 1 / sqrt(var + eps) with
  /// the biased variance; stats(rows, 2) = (mean, rstd) for the backward. y and stats overwritten.
  static void forward(host::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                      const T* x, const T* gamma, const T* beta, T* y, T* stats);
  /// dx(rows, cols) = rstd (g - mean(g) - xhat mean(g xhat)) per row, g = dy gamma, xhat =
  /// (x - mean) rstd; overwritten.
  static void backward_input(host::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                             const T* x, const T* dy, const T* gamma, const T* stats, T* dx);
  /// dgamma(cols) += the column sums of dy xhat, dbeta(cols) += the column sums of dy.
  static void backward_weight(host::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                              const T* x, const T* dy, const T* stats, T* dgamma, T* dbeta);
  /// x += r (a residual's add, in place), then forward from it, a block of rows at a time while
  /// it is in cache: bit for bit the add then forward.
  static void forward_add(host::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                          T* x, const T* r, const T* gamma, const T* beta, T* y, T* stats);
  /// backward_input's dx, then dx += r, a block of rows at a time: bit for bit the two.
  static void backward_input_add(host::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                                 const T* x, const T* dy, const T* gamma, const T* stats,
                                 const T* r, T* dx);
};

// Defined out of the classes, so that a program on gpipe::compiled compiles none of them (the
// float ones are instantiated in the library: GPIPE_HOST_INSTANTIATION below).

template <class T>
void LayerKernels<LayerNormOp, host::KernelContext<T>>::forward(host::KernelContext<T>& k,
                                                                std::size_t rows, std::size_t cols,
                                                                double eps, const T* x,
                                                                const T* gamma, const T* beta, T* y,
                                                                T* stats) {
  k.in_blocks(rows, cols, [&](std::size_t r, std::size_t count) {
    host::layer_norm_forward(count, cols, eps, x + r * cols, gamma, beta, y + r * cols,
                             stats + 2 * r);
  });
}

template <class T>
void LayerKernels<LayerNormOp, host::KernelContext<T>>::backward_input(host::KernelContext<T>& k,
                                                                       std::size_t rows,
                                                                       std::size_t cols, const T* x,
                                                                       const T* dy, const T* gamma,
                                                                       const T* stats, T* dx) {
  k.in_blocks(rows, cols, [&](std::size_t r, std::size_t count) {
    host::layer_norm_backward_input(count, cols, x + r * cols, dy + r * cols, gamma, stats + 2 * r,
                                    dx + r * cols);
  });
}

template <class T>
void LayerKernels<LayerNormOp, host::KernelContext<T>>::backward_weight(
    host::KernelContext<T>& k, std::size_t rows, std::size_t cols, const T* x, const T* dy,
    const T* stats, T* dgamma, T* dbeta) {
  k.in_blocks(cols, rows, [&](std::size_t first, std::size_t count) {  // column blocks
    host::layer_norm_backward_weight(rows, count, x + first, dy + first, stats, dgamma + first,
                                     dbeta + first, cols);
  });
}

template <class T>
void LayerKernels<LayerNormOp, host::KernelContext<T>>::forward_add(
    host::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps, T* x, const T* r,
    const T* gamma, const T* beta, T* y, T* stats) {
  k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
    T* xb = x + first * cols;
    host::add(count * cols, xb, r + first * cols, xb);
    host::layer_norm_forward(count, cols, eps, xb, gamma, beta, y + first * cols,
                             stats + 2 * first);
  });
}

template <class T>
void LayerKernels<LayerNormOp, host::KernelContext<T>>::backward_input_add(
    host::KernelContext<T>& k, std::size_t rows, std::size_t cols, const T* x, const T* dy,
    const T* gamma, const T* stats, const T* r, T* dx) {
  k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
    T* dxb = dx + first * cols;
    host::layer_norm_backward_input(count, cols, x + first * cols, dy + first * cols, gamma,
                                    stats + 2 * first, dxb);
    host::add(count * cols, dxb, r + first * cols, dxb);
  });
}

GPIPE_HOST_INSTANTIATION(struct LayerKernels<LayerNormOp, host::KernelContext<float>>);

/// LayerNorm on bf16 activations: each row widened to float and run through the float kernels,
/// the results rounded once. The statistics stay float: a row's two stash slots hold rstd's 32
/// bits, and the backward ops recompute the mean from x as forward computed it (the same double
/// sum of the same floats, so the same float).
template <>
struct LayerKernels<LayerNormOp, host::KernelContext<bf16>> {
  /// The bf16 context.
  using Ctx = host::KernelContext<bf16>;

  /// y = (x - mean) rstd gamma + beta per row, rounded to bf16; stats(rows, 2) = rstd's bits.
  static void forward(Ctx& k, std::size_t rows, std::size_t cols, double eps, const bf16* x,
                      const float* gamma, const float* beta, bf16* y, bf16* stats) {
    k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
      std::vector<float> row(2 * cols);
      for (std::size_t i = first; i < first + count; ++i)
        forward_row(cols, eps, x + i * cols, gamma, beta, y + i * cols, stats + 2 * i, row.data());
    });
  }

  /// dx as the float kernel computes it from (mean, rstd), rounded to bf16.
  static void backward_input(Ctx& k, std::size_t rows, std::size_t cols, const bf16* x,
                             const bf16* dy, const float* gamma, const bf16* stats, bf16* dx) {
    k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
      std::vector<float> row(3 * cols);
      for (std::size_t i = first; i < first + count; ++i)
        backward_input_row(cols, x + i * cols, dy + i * cols, gamma, stats + 2 * i, dx + i * cols,
                           row.data());
    });
  }

  /// x = x + r rounded to bf16 (a residual's add, in place), then forward from it, a row at a
  /// time: bit for bit the add then forward.
  static void forward_add(Ctx& k, std::size_t rows, std::size_t cols, double eps, bf16* x,
                          const bf16* r, const float* gamma, const float* beta, bf16* y,
                          bf16* stats) {
    k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
      std::vector<float> row(2 * cols);
      for (std::size_t i = first; i < first + count; ++i) {
        host::add_bf16(cols, x + i * cols, r + i * cols, x + i * cols);
        forward_row(cols, eps, x + i * cols, gamma, beta, y + i * cols, stats + 2 * i, row.data());
      }
    });
  }

  /// backward_input's dx rounded to bf16, then dx + r rounded to bf16: bit for bit the two.
  static void backward_input_add(Ctx& k, std::size_t rows, std::size_t cols, const bf16* x,
                                 const bf16* dy, const float* gamma, const bf16* stats,
                                 const bf16* r, bf16* dx) {
    k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
      std::vector<float> row(3 * cols);
      for (std::size_t i = first; i < first + count; ++i) {
        backward_input_row(cols, x + i * cols, dy + i * cols, gamma, stats + 2 * i, dx + i * cols,
                           row.data());
        host::add_bf16(cols, dx + i * cols, r + i * cols, dx + i * cols);
      }
    });
  }

  /// dgamma(cols) += column sums of dy xhat, dbeta(cols) += column sums of dy, in float.
  static void backward_weight(Ctx& k, std::size_t rows, std::size_t cols, const bf16* x,
                              const bf16* dy, const bf16* stats, float* dgamma, float* dbeta) {
    k.in_blocks(cols, rows, [&](std::size_t first, std::size_t count) {  // column blocks
      std::vector<float> row(2 * cols);
      for (std::size_t r = 0; r < rows; ++r) {
        float st[2];
        widen_row(cols, x + r * cols, stats + 2 * r, row.data(), st);
        host::from_bf16(count, dy + r * cols + first, row.data() + cols + first);
        host::layer_norm_backward_weight(std::size_t{1}, count, row.data() + first,
                                         row.data() + cols + first, st, dgamma + first,
                                         dbeta + first, cols);
      }
    });
  }

 private:
  // One row of forward; row: 2 cols floats of scratch.
  static void forward_row(std::size_t cols, double eps, const bf16* x, const float* gamma,
                          const float* beta, bf16* y, bf16* stash, float* row) {
    float st[2];
    host::from_bf16(cols, x, row);
    host::layer_norm_forward(std::size_t{1}, cols, eps, row, gamma, beta, row + cols, st);
    host::to_bf16(cols, row + cols, y);
    host::store_float_bits(st[1], stash);
  }
  // One row of backward_input; row: 3 cols floats of scratch.
  static void backward_input_row(std::size_t cols, const bf16* x, const bf16* dy,
                                 const float* gamma, const bf16* stash, bf16* dx, float* row) {
    float st[2];
    widen_row(cols, x, stash, row, st);
    host::from_bf16(cols, dy, row + cols);
    host::layer_norm_backward_input(std::size_t{1}, cols, row, row + cols, gamma, st,
                                    row + 2 * cols);
    host::to_bf16(cols, row + 2 * cols, dx);
  }
  // x's row widened into `row`, and its (mean, rstd): the mean as forward computed it, rstd from
  // the stash's bits.
  static void widen_row(std::size_t cols, const bf16* x, const bf16* stash, float* row, float* st) {
    host::from_bf16(cols, x, row);
    double sum = 0;
    for (std::size_t c = 0; c < cols; ++c) sum += row[c];
    st[0] = static_cast<float>(sum / static_cast<double>(cols));
    st[1] = host::load_float_bits(stash);
  }
};

}  // namespace gpipe
