#pragma once
// Bias of a Linear layer: the broadcast add over rows, and its gradient, a sum over rows of each
// column. Host reference: gpipe/backend/host/kernels/elementwise.hpp.
//
// Column sums (here and in layer_norm.cuh) run in two deterministic passes: blocks of 32 columns
// x 8 row lanes each sum one chunk of rows into partial(chunks, cols); then one thread per column
// adds the chunks in order. With a single chunk the first pass accumulates into the result
// directly. No atomics, so the same inputs give the same bits on every run.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/bias.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

namespace detail {

inline constexpr unsigned column_tile = 32;  // columns per block of a column sum
inline constexpr unsigned column_lanes = 8;  // row lanes per block of a column sum

// How a column sum over (rows, cols) splits its rows: enough chunks for about 1024 blocks, none
// of fewer than 64 rows.
struct ColumnSplit {
  std::size_t chunks = 1;
  std::size_t rows_per_chunk = 0;

  ColumnSplit(std::size_t rows, std::size_t cols) {
    const std::size_t tiles = (cols + column_tile - 1) / column_tile;
    const std::size_t max_chunks = std::max<std::size_t>(1, rows / 64);
    chunks = std::clamp<std::size_t>((1024 + tiles - 1) / tiles, 1,
                                     std::min<std::size_t>(max_chunks, 65535));
    rows_per_chunk = (rows + chunks - 1) / chunks;
    chunks = rows_per_chunk == 0 ? 1 : (rows + rows_per_chunk - 1) / rows_per_chunk;
  }
  // Floats of scratch per summed quantity: partial(chunks, cols), none for a single chunk.
  std::size_t scratch(std::size_t cols) const { return chunks > 1 ? chunks * cols : 0; }
  dim3 grid(std::size_t cols) const {
    return dim3(static_cast<unsigned>((cols + column_tile - 1) / column_tile),
                static_cast<unsigned>(chunks));
  }
  static dim3 block() { return dim3(column_tile, column_lanes); }
};

// Sum of v over the block's row lanes (threadIdx.y), for its column (threadIdx.x); valid in the
// threads with threadIdx.y == 0. `buf` is column_lanes x (column_tile + 1) shared floats.
__device__ __forceinline__ float lane_sum(float v, float (*buf)[column_tile + 1]) {
  buf[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  float sum = 0;
  if (threadIdx.y == 0) {
#pragma unroll
    for (unsigned i = 0; i < column_lanes; ++i) sum += buf[i][threadIdx.x];
  }
  __syncthreads();
  return sum;
}

// The result of chunk blockIdx.y for column c: dst[c] += sum with one chunk, else partial row.
__device__ __forceinline__ void store_column(float sum, std::size_t c, std::size_t cols, float* dst,
                                             float* partial) {
  if (gridDim.y == 1) {
    dst[c] += sum;
  } else {
    partial[blockIdx.y * cols + c] = sum;
  }
}

}  // namespace detail

/// dst(cols) += sum over k of partial(chunks, cols)[k], in order of k
template <class T>
__global__ void column_sum_kernel(std::size_t chunks, std::size_t cols, const T* partial, T* dst) {
  for (std::size_t c = detail::global_thread(); c < cols; c += detail::grid_threads()) {
    T sum = 0;
    for (std::size_t k = 0; k < chunks; ++k) sum += partial[k * cols + c];
    dst[c] += sum;
  }
}
/// dst(cols) += the sum of partial(chunks, cols)'s rows, added in chunk order, on `stream`.
GPIPE_CUDA_INLINE void column_sum(std::size_t chunks, std::size_t cols, const float* partial,
                                  float* dst, cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void column_sum(std::size_t chunks, std::size_t cols, const float* partial,
                                  float* dst, cudaStream_t stream) {
  detail::record_kernel("column_sum_kernel", {chunks, cols, 0},
                        static_cast<double>(chunks) * static_cast<double>(cols),
                        detail::bytes_of<float>(chunks * cols + cols),
                        detail::bytes_of<float>(cols), stream);
  GPIPE_CUDA_LAUNCH(column_sum_kernel<float>, detail::grid_for(cols), detail::block_size, stream)
  (chunks, cols, partial, dst);
  GPIPE_CUDA_CHECK_LAUNCH("column_sum_kernel");
}
#endif

/// y(rows, cols) += bias(cols): thread (c, r) adds the pack of bias at column c * V to rows r,
/// r + gridDim.y * blockDim.y, ...
template <int V, class T>
__global__ void bias_add_forward_kernel(std::size_t rows, std::size_t cols, const float* bias,
                                        T* y) {
  const std::size_t c = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  const detail::Pack<float, V> b = detail::load_pack<V>(bias + c);
  for (std::size_t r = static_cast<std::size_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<std::size_t>(gridDim.y) * blockDim.y) {
    detail::Pack<T, V> v = detail::load_pack<V>(y + r * cols + c);
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = detail::narrow<T>(detail::widen(v.v[j]) + b.v[j]);
    detail::store_pack<V>(y + r * cols + c, v);
  }
}
/// y(rows, cols) += bias(cols), on `stream`: 16-byte packs when cols % 4 == 0 and both pointers
/// allow them.
template <class T>
void bias_add_forward(std::size_t rows, std::size_t cols, const float* bias, T* y,
                      cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const bool vectorized = cols % 4 == 0 && detail::aligned<4>(bias, y);
  const std::size_t packs = vectorized ? cols / 4 : cols;
  // x covers the packs of a row (up to 256 threads), y the rows.
  unsigned bx = 1;
  while (bx < 256 && bx < packs) bx *= 2;
  const dim3 block(bx, 256 / bx);
  const std::size_t row_blocks = (rows + block.y - 1) / block.y;
  const dim3 grid(static_cast<unsigned>((packs + bx - 1) / bx),
                  static_cast<unsigned>(std::min<std::size_t>(row_blocks, 65535)));
  detail::record_kernel("bias_add_forward_kernel", {rows, cols, 0},
                        static_cast<double>(rows) * static_cast<double>(cols),
                        detail::bytes_of<T>(rows * cols) + detail::bytes_of<float>(cols),
                        detail::bytes_of<T>(rows * cols), stream);
  constexpr auto packed = &bias_add_forward_kernel<4, T>;
  constexpr auto scalar = &bias_add_forward_kernel<1, T>;
  if (vectorized) {
    GPIPE_CUDA_LAUNCH(packed, grid, block, stream)(rows, cols, bias, y);
  } else {
    GPIPE_CUDA_LAUNCH(scalar, grid, block, stream)(rows, cols, bias, y);
  }
  GPIPE_CUDA_CHECK_LAUNCH("bias_add_forward_kernel");
}

/// Pass 1 of db(cols) += sum over rows of dy(rows, cols); see the top of this file.
template <int Unroll, class T>
__global__ void bias_grad_backward_kernel(std::size_t rows, std::size_t cols,
                                          std::size_t rows_per_chunk, const T* dy, float* db,
                                          float* partial) {
  __shared__ float buf[detail::column_lanes][detail::column_tile + 1];
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * detail::column_tile + threadIdx.x;
  const std::size_t begin = blockIdx.y * rows_per_chunk;
  const std::size_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0;
  if (c < cols) {
    std::size_t r = begin + threadIdx.y;
    // Unroll independent loads, so that several are in flight per thread.
    for (; r + (Unroll - 1) * detail::column_lanes < end; r += Unroll * detail::column_lanes) {
      float v[Unroll];
#pragma unroll
      for (int u = 0; u < Unroll; ++u)
        v[u] = detail::widen(dy[(r + u * detail::column_lanes) * cols + c]);
#pragma unroll
      for (int u = 0; u < Unroll; ++u) sum += v[u];
    }
    for (; r < end; r += detail::column_lanes) sum += detail::widen(dy[r * cols + c]);
  }
  sum = detail::lane_sum(sum, buf);
  if (threadIdx.y == 0 && c < cols) detail::store_column(sum, c, cols, db, partial);
}
/// Floats of scratch that bias_grad_backward needs for (rows, cols).
inline std::size_t bias_grad_scratch(std::size_t rows, std::size_t cols) {
  return detail::ColumnSplit(rows, cols).scratch(cols);
}
/// db(cols) += sum over rows of dy(rows, cols), on `stream`, deterministic. `scratch` holds
/// bias_grad_scratch(rows, cols) floats (null if that is 0) and stays in use until the launches
/// run.
template <class T>
void bias_grad_backward(std::size_t rows, std::size_t cols, const T* dy, float* db, float* scratch,
                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::ColumnSplit split(rows, cols);
  detail::record_kernel("bias_grad_backward_kernel", {rows, cols, 0},
                        static_cast<double>(rows) * static_cast<double>(cols),
                        detail::bytes_of<T>(rows * cols) + detail::bytes_of<float>(cols),
                        detail::bytes_of<float>(split.chunks > 1 ? split.chunks * cols : cols),
                        stream);
  constexpr auto kernel = &bias_grad_backward_kernel<4, T>;
  GPIPE_CUDA_LAUNCH(kernel, split.grid(cols), split.block(), stream)
  (rows, cols, split.rows_per_chunk, dy, db, scratch);
  GPIPE_CUDA_CHECK_LAUNCH("bias_grad_backward_kernel");
  if (split.chunks > 1) column_sum(split.chunks, cols, scratch, db, stream);
}

}  // namespace gpipe::cuda
