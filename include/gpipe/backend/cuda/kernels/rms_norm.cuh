#pragma once
// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm: y = x rstd weight, rstd =
// 1 / sqrt(mean(x^2) + eps). x, y, dy and dx are stored as T (float, or gpipe::bf16 under
// gpipe::MixedBf16: widened on load, float math, rounded once on store); weight and its gradient
// are float. Each row's rstd is kept for the backward kernels in stats (rows, 2) of T as
// LayerNorm's (kernels/layer_norm.cuh: store_stats), the mean slot 0: (0, rstd) for float, rstd's
// 32 bits for bf16. Host reference: gpipe/backend/host/layers/rms_norm.hpp (which computes in
// double; these kernels in float).
//
// Forward and backward_input give each row to a warp (rows_per_block warps a block), which reads
// the row twice: for its sum, then for the output (the second read from L1/L2). The weight
// gradient is a column sum, in column tiles as bias.cuh's, its chunks' partial sums added in
// order: deterministic.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/rms_norm.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "gpipe/backend/cuda/kernels/bias.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/kernels/layer_norm.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

namespace detail {
// The row of rms_norm_forward_kernel (AddInput: of residual_rms_norm_forward_kernel, x = x + r
// first, each sum rounded to T and stored, the row then read back as stored).
template <bool AddInput, class T>
__device__ __forceinline__ void rms_norm_forward_row(std::size_t rows, std::size_t cols, float eps,
                                                     const T* x, const T* r, T* sum,
                                                     const float* weight, T* y, T* stats) {
  const std::size_t row = static_cast<std::size_t>(blockIdx.x) * rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const T* xr = x + row * cols;
  if constexpr (AddInput) {  // each lane forms the elements it reads below
    for (std::size_t c = lane; c < cols; c += 32)
      sum[row * cols + c] = narrow<T>(__fadd_rn(widen(xr[c]), widen(r[row * cols + c])));
  }
  float sq = 0;
  for (std::size_t c = lane; c < cols; c += 32) {
    const float v = widen(xr[c]);
    sq += v * v;
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(cols) + eps);
  for (std::size_t c = lane; c < cols; c += 32)
    y[row * cols + c] = narrow<T>(widen(xr[c]) * s * weight[c]);
  if (lane == 0) store_stats(stats, row, 0.0f, s);
}

// The row of rms_norm_backward_input_kernel (AddOutput: of
// residual_rms_norm_backward_input_kernel, each dx rounded to T, then r added).
template <bool AddOutput, class T>
__device__ __forceinline__ void rms_norm_backward_input_row(std::size_t rows, std::size_t cols,
                                                            const T* x, const T* dy,
                                                            const float* weight, const T* stats,
                                                            const T* r, T* dx) {
  const std::size_t row = static_cast<std::size_t>(blockIdx.x) * rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  const T* dr = dy + row * cols;
  const float s = stored_rstd(stats, row);
  float gx = 0;
  for (std::size_t c = lane; c < cols; c += 32) gx += widen(dr[c]) * weight[c] * (widen(xr[c]) * s);
  const float mean_gx = warp_sum(gx) / static_cast<float>(cols);
  for (std::size_t c = lane; c < cols; c += 32) {
    const float g = widen(dr[c]) * weight[c];
    const float v = s * (g - widen(xr[c]) * s * mean_gx);
    if constexpr (AddOutput)
      dx[row * cols + c] = narrow<T>(__fadd_rn(widen(narrow<T>(v)), widen(r[row * cols + c])));
    else
      dx[row * cols + c] = narrow<T>(v);
  }
}
}  // namespace detail

/// y (rows, cols) = x rstd weight, rstd = 1 / sqrt(mean(x^2) + eps) into stats (rows, 2): a warp
/// per row.
template <class T>
__global__ void rms_norm_forward_kernel(std::size_t rows, std::size_t cols, float eps, const T* x,
                                        const float* weight, T* y, T* stats) {
  detail::rms_norm_forward_row<false, T>(rows, cols, eps, x, nullptr, nullptr, weight, y, stats);
}
/// x = x + r (a residual's add, each sum rounded to T and stored), then y and stats from the
/// stored x as rms_norm_forward_kernel: bit for bit add_kernel then it.
template <class T>
__global__ void residual_rms_norm_forward_kernel(std::size_t rows, std::size_t cols, float eps,
                                                 T* x, const T* r, const float* weight, T* y,
                                                 T* stats) {
  detail::rms_norm_forward_row<true, T>(rows, cols, eps, x, r, x, weight, y, stats);
}

/// dx (rows, cols) = rstd (g - xhat mean(g xhat)), g = dy weight, xhat = x rstd: a warp per row.
template <class T>
__global__ void rms_norm_backward_input_kernel(std::size_t rows, std::size_t cols, const T* x,
                                               const T* dy, const float* weight, const T* stats,
                                               T* dx) {
  detail::rms_norm_backward_input_row<false, T>(rows, cols, x, dy, weight, stats, nullptr, dx);
}
/// rms_norm_backward_input_kernel's dx rounded to T, plus r (a residual's input gradient): bit
/// for bit that kernel then add_kernel.
template <class T>
__global__ void residual_rms_norm_backward_input_kernel(std::size_t rows, std::size_t cols,
                                                        const T* x, const T* dy,
                                                        const float* weight, const T* stats,
                                                        const T* r, T* dx) {
  detail::rms_norm_backward_input_row<true, T>(rows, cols, x, dy, weight, stats, r, dx);
}

/// Pass 1 of dweight(cols) += sum_rows dy xhat over column tiles (bias.cuh's ColumnSplit);
/// partial is (chunks, cols) when there is more than one chunk.
template <class T>
__global__ void rms_norm_backward_weight_kernel(std::size_t rows, std::size_t cols,
                                                std::size_t rows_per_chunk, const T* x, const T* dy,
                                                const T* stats, float* dweight, float* partial) {
  __shared__ float buf[detail::column_lanes][detail::column_tile + 1];
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * detail::column_tile + threadIdx.x;
  const std::size_t begin = blockIdx.y * rows_per_chunk;
  const std::size_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0;
  if (c < cols)
    for (std::size_t r = begin + threadIdx.y; r < end; r += detail::column_lanes)
      sum += detail::widen(dy[r * cols + c]) *
             (detail::widen(x[r * cols + c]) * detail::stored_rstd(stats, r));
  sum = detail::lane_sum(sum, buf);
  if (threadIdx.y == 0 && c < cols) detail::store_column(sum, c, cols, dweight, partial);
}

/// rms_norm_forward_kernel on `stream`: y (rows, cols) and stats (rows, 2) from x and weight
/// (cols).
template <class T>
void rms_norm_forward(std::size_t rows, std::size_t cols, double eps, const T* x,
                      const float* weight, T* y, T* stats, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const std::size_t n = rows * cols;
  detail::record_kernel("rms_norm_forward_kernel", {rows, cols, 0}, 4.0 * static_cast<double>(n),
                        2 * detail::bytes_of<T>(n) + detail::bytes_of<float>(cols),
                        detail::bytes_of<T>(n + 2 * rows), stream);
  GPIPE_CUDA_LAUNCH(rms_norm_forward_kernel<T>, detail::row_grid(rows), 32 * detail::rows_per_block,
                    stream)
  (rows, cols, static_cast<float>(eps), x, weight, y, stats);
  GPIPE_CUDA_CHECK_LAUNCH("rms_norm_forward_kernel");
}

/// rms_norm_backward_input_kernel on `stream`: dx (rows, cols), overwritten.
template <class T>
void rms_norm_backward_input(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                             const float* weight, const T* stats, T* dx, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const std::size_t n = rows * cols;
  detail::record_kernel("rms_norm_backward_input_kernel", {rows, cols, 0},
                        8.0 * static_cast<double>(n),
                        4 * detail::bytes_of<T>(n + rows) + detail::bytes_of<float>(cols),
                        detail::bytes_of<T>(n), stream);
  GPIPE_CUDA_LAUNCH(rms_norm_backward_input_kernel<T>, detail::row_grid(rows),
                    32 * detail::rows_per_block, stream)
  (rows, cols, x, dy, weight, stats, dx);
  GPIPE_CUDA_CHECK_LAUNCH("rms_norm_backward_input_kernel");
}

/// A residual's add fused into the RMSNorm after it: x = x + r (rounded to T, in place), then y
/// and stats from x as rms_norm_forward, on `stream`, in one kernel: bit for bit the two.
template <class T>
void residual_rms_norm_forward(std::size_t rows, std::size_t cols, double eps, T* x, const T* r,
                               const float* weight, T* y, T* stats, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const std::size_t n = rows * cols;
  // x and r read, the sum read back twice; x, y and the stats written
  detail::record_kernel("residual_rms_norm_forward_kernel", {rows, cols, 0},
                        5.0 * static_cast<double>(n),
                        4 * detail::bytes_of<T>(n) + detail::bytes_of<float>(cols),
                        detail::bytes_of<T>(2 * n + 2 * rows), stream);
  GPIPE_CUDA_LAUNCH(residual_rms_norm_forward_kernel<T>, detail::row_grid(rows),
                    32 * detail::rows_per_block, stream)
  (rows, cols, static_cast<float>(eps), x, r, weight, y, stats);
  GPIPE_CUDA_CHECK_LAUNCH("residual_rms_norm_forward_kernel");
}

/// rms_norm_backward_input's dx, then dx += r (a residual's input gradient), on `stream`, in one
/// kernel: bit for bit the two.
template <class T>
void residual_rms_norm_backward_input(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                                      const float* weight, const T* stats, const T* r, T* dx,
                                      cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const std::size_t n = rows * cols;
  detail::record_kernel(
      "residual_rms_norm_backward_input_kernel", {rows, cols, 0}, 9.0 * static_cast<double>(n),
      4 * detail::bytes_of<T>(n + rows) + detail::bytes_of<T>(n) + detail::bytes_of<float>(cols),
      detail::bytes_of<T>(n), stream);
  GPIPE_CUDA_LAUNCH(residual_rms_norm_backward_input_kernel<T>, detail::row_grid(rows),
                    32 * detail::rows_per_block, stream)
  (rows, cols, x, dy, weight, stats, r, dx);
  GPIPE_CUDA_CHECK_LAUNCH("residual_rms_norm_backward_input_kernel");
}

/// Floats of scratch that rms_norm_backward_weight needs for (rows, cols).
inline std::size_t rms_norm_backward_weight_scratch(std::size_t rows, std::size_t cols) {
  return detail::ColumnSplit(rows, cols).scratch(cols);
}
/// dweight(cols) += sum over rows of dy x rstd, on `stream`, deterministic; stats the forward's.
/// `scratch` holds rms_norm_backward_weight_scratch(rows, cols) floats (null if 0) until the
/// launches run.
template <class T>
void rms_norm_backward_weight(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                              const T* stats, float* dweight, float* scratch, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::ColumnSplit split(rows, cols);
  detail::record_kernel(
      "rms_norm_backward_weight_kernel", {rows, cols, 0}, 3.0 * static_cast<double>(rows * cols),
      detail::bytes_of<T>(2 * rows * cols + 2 * rows),
      detail::bytes_of<float>(split.chunks > 1 ? split.chunks * cols : cols), stream);
  GPIPE_CUDA_LAUNCH(rms_norm_backward_weight_kernel<T>, split.grid(cols), split.block(), stream)
  (rows, cols, split.rows_per_chunk, x, dy, stats, dweight, scratch);
  GPIPE_CUDA_CHECK_LAUNCH("rms_norm_backward_weight_kernel");
  if (split.chunks > 1) column_sum(split.chunks, cols, scratch, dweight, stream);
}

}  // namespace gpipe::cuda
