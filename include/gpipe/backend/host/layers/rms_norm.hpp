#pragma once
// RMSNorm on the host: one body for every activation type (float, bf16, double in the tests),
// sums in double, each output rounded once; split over the context's team by rows (forward,
// input gradient) or by columns (weight gradient).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/bf16.hpp"
#include "gpipe/backend/host/kernels/elementwise.hpp"
#include "gpipe/backend/host/linkage.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/model/rms_norm.hpp"

namespace gpipe {

namespace detail {

// Row r's rstd in stats (rows, 2) of T as RMSNormOp keeps it: (0, rstd) in float or double; a
// float's bits, high half first, in bf16.
template <class T>
void put_rstd(T* stats, std::size_t r, master_t<T> rstd) {
  if constexpr (std::is_same_v<T, bf16>) {
    host::store_float_bits(rstd, stats + 2 * r);
  } else {
    stats[2 * r] = T(0);
    stats[2 * r + 1] = rstd;
  }
}
template <class T>
master_t<T> rstd_of(const T* stats, std::size_t r) {
  if constexpr (std::is_same_v<T, bf16>)
    return host::load_float_bits(stats + 2 * r);
  else
    return stats[2 * r + 1];
}

}  // namespace detail

/// RMSNorm on the host over the last dimension of (rows, cols); weight and gradients in
/// master_t<T> (float for bf16), rstd kept in stats as RMSNormOp says, bf16 activations widened
/// exactly and the results rounded once.
template <class T>
struct LayerKernels<RMSNormOp, host::KernelContext<T>> {
  /// The master type: weight, rstd, gradients.
  using M = master_t<T>;

  /// Per row: rstd = 1 / sqrt(mean(x^2) + eps), y = x rstd weight(cols); y and stats (rows, 2)
  /// overwritten.
  static void forward(host::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                      const T* x, const M* weight, T* y, T* stats);
  /// dx(rows, cols) = rstd (g - xhat mean(g xhat)) per row, g = dy weight, xhat = x rstd.
  static void backward_input(host::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                             const T* x, const T* dy, const M* weight, const T* stats, T* dx);
  /// dweight(cols) += the column sums of dy xhat, each column summed in row order.
  static void backward_weight(host::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                              const T* x, const T* dy, const T* stats, M* dweight);
  /// x += r (a residual's add, in place, rounded as the context's add), then forward from it, a
  /// block of rows at a time: bit for bit the add then forward.
  static void forward_add(host::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                          T* x, const T* r, const M* weight, T* y, T* stats);
  /// backward_input's dx, then dx += r, a block of rows at a time: bit for bit the two.
  static void backward_input_add(host::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                                 const T* x, const T* dy, const M* weight, const T* stats,
                                 const T* r, T* dx);

 private:
  // Rows [first, first + count) of forward and backward_input.
  static void forward_rows(std::size_t first, std::size_t count, std::size_t cols, double eps,
                           const T* x, const M* weight, T* y, T* stats);
  static void backward_input_rows(std::size_t first, std::size_t count, std::size_t cols,
                                  const T* x, const T* dy, const M* weight, const T* stats, T* dx);
  // y(n) = y + a as the context's add rounds it (bf16: in float, rounded once).
  static void add_into(std::size_t n, T* y, const T* a);
};

// Defined out of the class, so that a program on gpipe::compiled compiles none of them (the
// float ones are instantiated in the library: GPIPE_HOST_INSTANTIATION below).

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::forward(host::KernelContext<T>& k,
                                                              std::size_t rows, std::size_t cols,
                                                              double eps, const T* x,
                                                              const M* weight, T* y, T* stats) {
  k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
    forward_rows(first, count, cols, eps, x, weight, y, stats);
  });
}

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::backward_input(host::KernelContext<T>& k,
                                                                     std::size_t rows,
                                                                     std::size_t cols, const T* x,
                                                                     const T* dy, const M* weight,
                                                                     const T* stats, T* dx) {
  k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
    backward_input_rows(first, count, cols, x, dy, weight, stats, dx);
  });
}

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::forward_add(host::KernelContext<T>& k,
                                                                  std::size_t rows,
                                                                  std::size_t cols, double eps,
                                                                  T* x, const T* r, const M* weight,
                                                                  T* y, T* stats) {
  k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
    add_into(count * cols, x + first * cols, r + first * cols);
    forward_rows(first, count, cols, eps, x, weight, y, stats);
  });
}

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::backward_input_add(
    host::KernelContext<T>& k, std::size_t rows, std::size_t cols, const T* x, const T* dy,
    const M* weight, const T* stats, const T* r, T* dx) {
  k.in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
    backward_input_rows(first, count, cols, x, dy, weight, stats, dx);
    add_into(count * cols, dx + first * cols, r + first * cols);
  });
}

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::forward_rows(std::size_t first,
                                                                   std::size_t count,
                                                                   std::size_t cols, double eps,
                                                                   const T* x, const M* weight,
                                                                   T* y, T* stats) {
  for (std::size_t r = first; r < first + count; ++r) {
    const T* xr = x + r * cols;
    double sq = 0;
    for (std::size_t c = 0; c < cols; ++c) sq += static_cast<double>(xr[c]) * xr[c];
    // rounded to M first, so that B and W use the very rstd that y was formed with
    const M s = static_cast<M>(1.0 / std::sqrt(sq / static_cast<double>(cols) + eps));
    detail::put_rstd(stats, r, s);
    for (std::size_t c = 0; c < cols; ++c)
      y[r * cols + c] = static_cast<T>(static_cast<double>(xr[c]) * s * weight[c]);
  }
}

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::backward_input_rows(
    std::size_t first, std::size_t count, std::size_t cols, const T* x, const T* dy,
    const M* weight, const T* stats, T* dx) {
  for (std::size_t r = first; r < first + count; ++r) {
    const double s = detail::rstd_of(stats, r);
    double sum_gx = 0;
    for (std::size_t c = 0; c < cols; ++c)
      sum_gx += static_cast<double>(dy[r * cols + c]) * weight[c] * x[r * cols + c] * s;
    const double mean_gx = sum_gx / static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const double g = static_cast<double>(dy[r * cols + c]) * weight[c];
      const double xhat = static_cast<double>(x[r * cols + c]) * s;
      dx[r * cols + c] = static_cast<T>(s * (g - xhat * mean_gx));
    }
  }
}

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::add_into(std::size_t n, T* y, const T* a) {
  if constexpr (std::is_same_v<T, bf16>)
    host::add_bf16(n, y, a, y);
  else
    host::add(n, y, a, y);
}

template <class T>
void LayerKernels<RMSNormOp, host::KernelContext<T>>::backward_weight(host::KernelContext<T>& k,
                                                                      std::size_t rows,
                                                                      std::size_t cols, const T* x,
                                                                      const T* dy, const T* stats,
                                                                      M* dweight) {
  std::vector<double> rstd(rows);
  for (std::size_t r = 0; r < rows; ++r) rstd[r] = detail::rstd_of(stats, r);
  k.in_blocks(cols, rows, [&](std::size_t first, std::size_t count) {  // column blocks
    // rows outer, so that memory is read in order; each column is still summed in row order
    std::vector<double> sum(count, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      const T* dyr = dy + r * cols + first;
      const T* xr = x + r * cols + first;
      const double s = rstd[r];
      for (std::size_t j = 0; j < count; ++j) sum[j] += static_cast<double>(dyr[j]) * xr[j] * s;
    }
    for (std::size_t j = 0; j < count; ++j) dweight[first + j] += static_cast<M>(sum[j]);
  });
}

GPIPE_HOST_INSTANTIATION(struct LayerKernels<RMSNormOp, host::KernelContext<float>>);

}  // namespace gpipe
