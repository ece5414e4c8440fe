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

/// y (rows, cols) = x rstd weight, rstd = 1 / sqrt(mean(x^2) + eps) into stats (rows, 2): a warp
/// per row.
template <class T>
__global__ void rms_norm_forward_kernel(std::size_t rows, std::size_t cols, float eps, const T* x,
                                        const float* weight, T* y, T* stats) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const T* xr = x + row * cols;
  float sq = 0;
  for (std::size_t c = lane; c < cols; c += 32) {
    const float v = detail::widen(xr[c]);
    sq += v * v;
  }
  const float s = 1.0f / sqrtf(detail::warp_sum(sq) / static_cast<float>(cols) + eps);
  for (std::size_t c = lane; c < cols; c += 32)
    y[row * cols + c] = detail::narrow<T>(detail::widen(xr[c]) * s * weight[c]);
  if (lane == 0) detail::store_stats(stats, row, 0.0f, s);
}

/// dx (rows, cols) = rstd (g - xhat mean(g xhat)), g = dy weight, xhat = x rstd: a warp per row.
template <class T>
__global__ void rms_norm_backward_input_kernel(std::size_t rows, std::size_t cols, const T* x,
                                               const T* dy, const float* weight, const T* stats,
                                               T* dx) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  const T* dr = dy + row * cols;
  const float s = detail::stored_rstd(stats, row);
  float gx = 0;
  for (std::size_t c = lane; c < cols; c += 32)
    gx += detail::widen(dr[c]) * weight[c] * (detail::widen(xr[c]) * s);
  const float mean_gx = detail::warp_sum(gx) / static_cast<float>(cols);
  for (std::size_t c = lane; c < cols; c += 32) {
    const float g = detail::widen(dr[c]) * weight[c];
    dx[row * cols + c] = detail::narrow<T>(s * (g - detail::widen(xr[c]) * s * mean_gx));
  }
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
