#pragma once
// LayerNorm over the last dimension, affine, as torch.nn.LayerNorm (biased variance, eps inside
// the square root): y = (x - mean) * rstd * gamma + beta. Row statistics are kept as
// stats(rows, 2) = (mean, rstd) for the backward kernels. Host reference:
// gpipe/backend/host/kernels/layer_norm.hpp (which computes in double; these kernels in float).
//
// Forward and backward_input give each row to one warp: a first pass reduces the row (16-byte
// packs where rows are aligned), a second pass, which finds the row in L1/L2, writes it. The
// weight gradients are column sums (see bias.cuh).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/layer_norm.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "gpipe/backend/cuda/kernels/bias.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"

namespace gpipe::cuda {

namespace detail {

inline constexpr unsigned rows_per_block = 4;  // warps per block of a row-per-warp kernel

inline dim3 row_grid(std::size_t rows) {
  return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
}

}  // namespace detail

// x (rows, cols) -> y (rows, cols), stats (rows, 2). The variance comes from sums of x - x[0]
// (shifted data), which keeps the cancellation of E[x^2] - E[x]^2 small when |mean| >> std.
template <int V>
__global__ void layer_norm_forward_kernel(std::size_t rows, std::size_t cols, float eps,
                                          const float* x, const float* gamma, const float* beta,
                                          float* y, float* stats) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const float* xr = x + row * cols;
  float* yr = y + row * cols;

  const float shift = xr[0];
  float sum = 0, sum_sq = 0;
  for (std::size_t c = lane * V; c < cols; c += 32 * V) {
    const detail::Pack<float, V> v = detail::load_pack<V>(xr + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = v.v[j] - shift;
      sum += d;
      sum_sq += d * d;
    }
  }
  sum = detail::warp_sum(sum);
  sum_sq = detail::warp_sum(sum_sq);
  const float n = static_cast<float>(cols);
  const float shifted_mean = sum / n;
  const float var = fmaxf(sum_sq / n - shifted_mean * shifted_mean, 0.0f);
  const float mean = shift + shifted_mean;
  const float rstd = 1.0f / sqrtf(var + eps);

  for (std::size_t c = lane * V; c < cols; c += 32 * V) {
    const detail::Pack<float, V> v = detail::load_pack<V>(xr + c);
    const detail::Pack<float, V> g = detail::load_pack<V>(gamma + c);
    const detail::Pack<float, V> b = detail::load_pack<V>(beta + c);
    detail::Pack<float, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = (v.v[j] - mean) * rstd * g.v[j] + b.v[j];
    detail::store_pack<V>(yr + c, out);
  }
  if (lane == 0) {
    stats[2 * row] = mean;
    stats[2 * row + 1] = rstd;
  }
}
inline void layer_norm_forward(std::size_t rows, std::size_t cols, double eps, const float* x,
                               const float* gamma, const float* beta, float* y, float* stats,
                               cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const auto e = static_cast<float>(eps);
  const dim3 grid = detail::row_grid(rows), block(32 * detail::rows_per_block);
  if (cols % 4 == 0 && detail::aligned<4>(x, gamma, beta, y)) {
    GPIPE_CUDA_LAUNCH(layer_norm_forward_kernel<4>, grid, block, stream)
    (rows, cols, e, x, gamma, beta, y, stats);
  } else {
    GPIPE_CUDA_LAUNCH(layer_norm_forward_kernel<1>, grid, block, stream)
    (rows, cols, e, x, gamma, beta, y, stats);
  }
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_forward_kernel");
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,  xhat = (x - mean) * rstd
// x, dy, dx (rows, cols); gamma (cols); stats (rows, 2)
template <int V>
__global__ void layer_norm_backward_input_kernel(std::size_t rows, std::size_t cols, const float* x,
                                                 const float* dy, const float* gamma,
                                                 const float* stats, float* dx) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  const float mean = stats[2 * row], rstd = stats[2 * row + 1];

  float sum_g = 0, sum_gx = 0;
  for (std::size_t c = lane * V; c < cols; c += 32 * V) {
    const detail::Pack<float, V> xv = detail::load_pack<V>(xr + c);
    const detail::Pack<float, V> dv = detail::load_pack<V>(dyr + c);
    const detail::Pack<float, V> gv = detail::load_pack<V>(gamma + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float g = dv.v[j] * gv.v[j];
      sum_g += g;
      sum_gx += g * ((xv.v[j] - mean) * rstd);
    }
  }
  const float n = static_cast<float>(cols);
  const float mean_g = detail::warp_sum(sum_g) / n;
  const float mean_gx = detail::warp_sum(sum_gx) / n;

  for (std::size_t c = lane * V; c < cols; c += 32 * V) {
    const detail::Pack<float, V> xv = detail::load_pack<V>(xr + c);
    const detail::Pack<float, V> dv = detail::load_pack<V>(dyr + c);
    const detail::Pack<float, V> gv = detail::load_pack<V>(gamma + c);
    detail::Pack<float, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float xhat = (xv.v[j] - mean) * rstd;
      out.v[j] = rstd * (dv.v[j] * gv.v[j] - mean_g - xhat * mean_gx);
    }
    detail::store_pack<V>(dx + row * cols + c, out);
  }
}
inline void layer_norm_backward_input(std::size_t rows, std::size_t cols, const float* x,
                                      const float* dy, const float* gamma, const float* stats,
                                      float* dx, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid = detail::row_grid(rows), block(32 * detail::rows_per_block);
  if (cols % 4 == 0 && detail::aligned<4>(x, dy, gamma, dx)) {
    GPIPE_CUDA_LAUNCH(layer_norm_backward_input_kernel<4>, grid, block, stream)
    (rows, cols, x, dy, gamma, stats, dx);
  } else {
    GPIPE_CUDA_LAUNCH(layer_norm_backward_input_kernel<1>, grid, block, stream)
    (rows, cols, x, dy, gamma, stats, dx);
  }
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_input_kernel");
}

// Pass 1 of dgamma(cols) += sum_rows dy * xhat and dbeta(cols) += sum_rows dy; partial is
// (2, chunks, cols) when there is more than one chunk (see bias.cuh).
template <int Unroll>
__global__ void layer_norm_backward_weight_kernel(std::size_t rows, std::size_t cols,
                                                  std::size_t rows_per_chunk, const float* x,
                                                  const float* dy, const float* stats,
                                                  float* dgamma, float* dbeta, float* partial) {
  __shared__ float buf[detail::column_lanes][detail::column_tile + 1];
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * detail::column_tile + threadIdx.x;
  const std::size_t begin = blockIdx.y * rows_per_chunk;
  const std::size_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum_gamma = 0, sum_beta = 0;
  if (c < cols) {
    std::size_t r = begin + threadIdx.y;
    for (; r + (Unroll - 1) * detail::column_lanes < end; r += Unroll * detail::column_lanes) {
      float xv[Unroll], dv[Unroll], mean[Unroll], rstd[Unroll];
#pragma unroll
      for (int u = 0; u < Unroll; ++u) {
        const std::size_t ru = r + u * detail::column_lanes;
        xv[u] = x[ru * cols + c];
        dv[u] = dy[ru * cols + c];
        mean[u] = stats[2 * ru];
        rstd[u] = stats[2 * ru + 1];
      }
#pragma unroll
      for (int u = 0; u < Unroll; ++u) {
        sum_gamma += dv[u] * ((xv[u] - mean[u]) * rstd[u]);
        sum_beta += dv[u];
      }
    }
    for (; r < end; r += detail::column_lanes) {
      const float d = dy[r * cols + c];
      sum_gamma += d * ((x[r * cols + c] - stats[2 * r]) * stats[2 * r + 1]);
      sum_beta += d;
    }
  }
  sum_gamma = detail::lane_sum(sum_gamma, buf);
  sum_beta = detail::lane_sum(sum_beta, buf);
  if (threadIdx.y == 0 && c < cols) {
    detail::store_column(sum_gamma, c, cols, dgamma, partial);
    detail::store_column(sum_beta, c, cols, dbeta,
                         gridDim.y == 1 ? nullptr : partial + gridDim.y * cols);
  }
}
// Floats of scratch that layer_norm_backward_weight needs for (rows, cols).
inline std::size_t layer_norm_backward_weight_scratch(std::size_t rows, std::size_t cols) {
  return 2 * detail::ColumnSplit(rows, cols).scratch(cols);
}
inline void layer_norm_backward_weight(std::size_t rows, std::size_t cols, const float* x,
                                       const float* dy, const float* stats, float* dgamma,
                                       float* dbeta, float* scratch, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::ColumnSplit split(rows, cols);
  GPIPE_CUDA_LAUNCH(layer_norm_backward_weight_kernel<4>, split.grid(cols), split.block(), stream)
  (rows, cols, split.rows_per_chunk, x, dy, stats, dgamma, dbeta, scratch);
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_weight_kernel");
  if (split.chunks > 1) {
    column_sum(split.chunks, cols, scratch, dgamma, stream);
    column_sum(split.chunks, cols, scratch + split.chunks * cols, dbeta, stream);
  }
}

}  // namespace gpipe::cuda
