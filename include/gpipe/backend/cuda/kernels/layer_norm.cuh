#pragma once
// LayerNorm over the last dimension, affine, as torch.nn.LayerNorm (biased variance, eps inside
// the square root): y = (x - mean) * rstd * gamma + beta. Row statistics are kept as
// stats(rows, 2) = (mean, rstd) for the backward kernels. Host reference:
// gpipe/backend/host/kernels/layer_norm.hpp (which computes in double; these kernels in float).
//
// Forward and backward_input need a row twice: for its sums, then for the output. Rows of up to
// 16384 floats (in 16-byte packs) stay in registers in between ("resident" kernels: a warp per
// row up to 1024 floats, a block per row beyond), so each input is read from memory once. Wider
// or unaligned rows take the "streaming" kernels, which give each row to a warp and read it a
// second time, from L1/L2 where it is still there. The weight gradients are column sums (see
// bias.cuh).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/layer_norm.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "gpipe/backend/cuda/kernels/bias.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

namespace detail {
// Launch records of LayerNorm's row kernels over (rows, cols) of float: `arrays` (rows, cols)
// arrays read, one written, gamma (and beta) read, stats (rows, 2) read or written.
inline void record_layer_norm(std::string_view kernel, std::size_t rows, std::size_t cols,
                              double flops_per, int arrays_read, int params_read, bool stats_read,
                              cudaStream_t stream) {
  const std::size_t n = rows * cols;
  record_kernel(kernel, {rows, cols, 0}, flops_per * static_cast<double>(n),
                arrays_read * bytes_of<float>(n) + params_read * bytes_of<float>(cols) +
                    (stats_read ? bytes_of<float>(2 * rows) : 0.0),
                bytes_of<float>(n) + (stats_read ? 0.0 : bytes_of<float>(2 * rows)), stream);
}
}  // namespace detail

namespace detail {

inline constexpr unsigned rows_per_block = 4;  // warps per block of a row-per-warp kernel

inline dim3 row_grid(std::size_t rows) {
  return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
}

// The most threads that hold one row in a resident kernel, and the most 4-float packs each
// holds: 512 x 8 x 4 = 16384 floats. (A 1024-thread block could hold no more than 64 registers
// per thread, too few for backward's 2 x 8 packs.)
inline constexpr unsigned max_row_threads = 512;
inline constexpr int max_row_packs = 8;

// How a resident kernel holds a row of `cols` floats (cols a multiple of 4): a group of
// `threads` threads, each with `packs` 4-float packs, thread t those at pack t, t + threads, ...
// The group is a warp (rows_per_block rows per block) where 32 threads suffice, else a whole
// block; `threads` is 0 where the row is too wide for registers.
struct RowLayout {
  unsigned threads = 0;
  int packs = 0;

  explicit RowLayout(std::size_t cols) {
    const std::size_t row_packs = cols / 4;
    unsigned t = 32;
    while (t < max_row_threads && std::size_t{t} * max_row_packs < row_packs) t *= 2;
    if (cols % 4 != 0 || std::size_t{t} * max_row_packs < row_packs) return;
    const std::size_t per_thread = (row_packs + t - 1) / t;
    threads = t;
    packs = per_thread <= 1 ? 1 : per_thread <= 2 ? 2 : per_thread <= 4 ? 4 : 8;
  }
  bool whole_block() const { return threads > 32; }
  dim3 block() const { return dim3(whole_block() ? threads : 32 * rows_per_block); }
  // Blocks: one row each (or rows_per_block), capped; the kernels loop over the rest.
  dim3 grid(std::size_t rows) const {
    const std::size_t per_block = whole_block() ? 1 : rows_per_block;
    return dim3(static_cast<unsigned>(
        std::clamp<std::size_t>((rows + per_block - 1) / per_block, 1, std::size_t{1} << 20)));
  }
  // launch(std::integral_constant<int, Packs>, std::bool_constant<WholeBlock>)
  template <class Launch>
  void dispatch(Launch&& launch) const {
    if (whole_block())
      return launch(std::integral_constant<int, max_row_packs>{}, std::true_type{});
    switch (packs) {
      case 1:
        return launch(std::integral_constant<int, 1>{}, std::false_type{});
      case 2:
        return launch(std::integral_constant<int, 2>{}, std::false_type{});
      case 4:
        return launch(std::integral_constant<int, 4>{}, std::false_type{});
      default:
        return launch(std::integral_constant<int, max_row_packs>{}, std::false_type{});
    }
  }
};

// The threads of a resident kernel that hold one row: a warp, or (WholeBlock) the block. Rows
// first_row(), first_row() + row_stride(), ... belong to this thread's group.
template <bool WholeBlock>
struct RowGroup {
  // The most threads in a block of its kernels (RowLayout::block()): their __launch_bounds__.
  static constexpr unsigned max_block_threads = WholeBlock ? max_row_threads : 32 * rows_per_block;
  __device__ static unsigned size() { return WholeBlock ? blockDim.x : 32; }
  __device__ static unsigned rank() { return WholeBlock ? threadIdx.x : threadIdx.x % 32; }
  // The row's pack that this thread holds as its p-th (RowLayout: t, t + size(), ...).
  __device__ static std::size_t pack(int p) { return rank() + std::size_t{size()} * p; }
  __device__ static std::size_t first_row() {
    return WholeBlock ? blockIdx.x
                      : static_cast<std::size_t>(blockIdx.x) * rows_per_block + threadIdx.x / 32;
  }
  __device__ static std::size_t row_stride() {
    return WholeBlock ? gridDim.x : static_cast<std::size_t>(gridDim.x) * rows_per_block;
  }
  // v[p] = this thread's p-th pack of `row`, zeros past its row_packs packs (they add 0 to sums).
  template <int Packs>
  __device__ static void load(Pack<float, 4> (&v)[Packs], const float* row, std::size_t row_packs) {
#pragma unroll
    for (int p = 0; p < Packs; ++p)
      v[p] = pack(p) < row_packs ? load_pack<4>(row + 4 * pack(p)) : Pack<float, 4>{};
  }
  // Sum over the group; every thread gets it.
  __device__ static float sum(float v) {
    if constexpr (WholeBlock) {
      __shared__ float buf[32];
      return block_sum(v, buf);
    } else {
      return warp_sum(v);
    }
  }
};

}  // namespace detail

/// x (rows, cols) -> y (rows, cols), stats (rows, 2), cols % 4 == 0, each row held in registers
/// (Packs packs per thread, see RowLayout): mean, then the variance as the mean of (x - mean)^2.
template <int Packs, bool WholeBlock>
__global__ void __launch_bounds__(detail::RowGroup<WholeBlock>::max_block_threads)
    layer_norm_forward_resident_kernel(std::size_t rows, std::size_t cols, float eps,
                                       const float* x, const float* gamma, const float* beta,
                                       float* y, float* stats) {
  using Group = detail::RowGroup<WholeBlock>;
  using P4 = detail::Pack<float, 4>;
  const std::size_t row_packs = cols / 4;
  const float n = static_cast<float>(cols);
  for (std::size_t row = Group::first_row(); row < rows; row += Group::row_stride()) {
    P4 v[Packs];
    Group::load(v, x + row * cols, row_packs);
    float sum = 0;
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
#pragma unroll
      for (int j = 0; j < 4; ++j) sum += v[p].v[j];
    }
    const float mean = Group::sum(sum) / n;
    float sum_sq = 0;
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
      if (Group::pack(p) >= row_packs) break;
#pragma unroll
      for (int j = 0; j < 4; ++j) sum_sq += (v[p].v[j] - mean) * (v[p].v[j] - mean);
    }
    const float rstd = 1.0f / sqrtf(Group::sum(sum_sq) / n + eps);
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
      const std::size_t q = Group::pack(p);
      if (q >= row_packs) break;
      const P4 g = detail::load_pack<4>(gamma + 4 * q), b = detail::load_pack<4>(beta + 4 * q);
      P4 out;
#pragma unroll
      for (int j = 0; j < 4; ++j) out.v[j] = (v[p].v[j] - mean) * rstd * g.v[j] + b.v[j];
      detail::store_pack<4>(y + row * cols + 4 * q, out);
    }
    if (Group::rank() == 0) {
      stats[2 * row] = mean;
      stats[2 * row + 1] = rstd;
    }
  }
}

/// The streaming form of layer_norm_forward_resident_kernel, for any cols and alignment. The
/// variance comes from sums of x - x[0] (shifted data), which keeps the cancellation of
/// E[x^2] - E[x]^2 small when |mean| >> std.
template <int V>
__global__ void layer_norm_forward_streaming_kernel(std::size_t rows, std::size_t cols, float eps,
                                                    const float* x, const float* gamma,
                                                    const float* beta, float* y, float* stats) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const float* xr = x + row * cols;

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

  detail::map_strided<V>(
      cols, lane, 32, [=](float v, float g, float b) { return (v - mean) * rstd * g + b; },
      y + row * cols, xr, gamma, beta);
  if (lane == 0) {
    stats[2 * row] = mean;
    stats[2 * row + 1] = rstd;
  }
}
/// The streaming kernels alone (layer_norm_forward uses them where rows do not fit registers);
/// public so that the benchmark can show what the resident kernels save.
inline void layer_norm_forward_streaming(std::size_t rows, std::size_t cols, double eps,
                                         const float* x, const float* gamma, const float* beta,
                                         float* y, float* stats, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  detail::record_layer_norm("layer_norm_forward_streaming_kernel", rows, cols, 8, 1, 2, false,
                            stream);
  const auto e = static_cast<float>(eps);
  const dim3 grid = detail::row_grid(rows), block(32 * detail::rows_per_block);
  if (cols % 4 == 0 && detail::aligned<4>(x, gamma, beta, y)) {
    GPIPE_CUDA_LAUNCH(layer_norm_forward_streaming_kernel<4>, grid, block, stream)
    (rows, cols, e, x, gamma, beta, y, stats);
  } else {
    GPIPE_CUDA_LAUNCH(layer_norm_forward_streaming_kernel<1>, grid, block, stream)
    (rows, cols, e, x, gamma, beta, y, stats);
  }
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_forward_streaming_kernel");
}
/// x (rows, cols) -> y (rows, cols), stats (rows, 2) = (mean, rstd), gamma and beta (cols), on
/// `stream`: the resident kernels where a row fits in registers (cols % 4 == 0, at most 16384,
/// pointers 16-byte aligned), else the streaming one.
inline void layer_norm_forward(std::size_t rows, std::size_t cols, double eps, const float* x,
                               const float* gamma, const float* beta, float* y, float* stats,
                               cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::RowLayout layout(cols);
  if (layout.threads == 0 || !detail::aligned<4>(x, gamma, beta, y)) {
    return layer_norm_forward_streaming(rows, cols, eps, x, gamma, beta, y, stats, stream);
  }
  detail::record_layer_norm("layer_norm_forward_resident_kernel", rows, cols, 8, 1, 2, false,
                            stream);
  layout.dispatch([&](auto packs, auto whole_block) {
    constexpr auto kernel =
        &layer_norm_forward_resident_kernel<decltype(packs)::value, decltype(whole_block)::value>;
    GPIPE_CUDA_LAUNCH(kernel, layout.grid(rows), layout.block(), stream)
    (rows, cols, static_cast<float>(eps), x, gamma, beta, y, stats);
  });
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_forward_resident_kernel");
}

/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,  xhat = (x - mean) * rstd
/// x, dy, dx (rows, cols), cols % 4 == 0; gamma (cols); stats (rows, 2). Each row's x and g are
/// held in registers (Packs packs each per thread, see RowLayout).
template <int Packs, bool WholeBlock>
__global__ void __launch_bounds__(detail::RowGroup<WholeBlock>::max_block_threads)
    layer_norm_backward_input_resident_kernel(std::size_t rows, std::size_t cols, const float* x,
                                              const float* dy, const float* gamma,
                                              const float* stats, float* dx) {
  using Group = detail::RowGroup<WholeBlock>;
  using P4 = detail::Pack<float, 4>;
  const std::size_t row_packs = cols / 4;
  const float n = static_cast<float>(cols);
  for (std::size_t row = Group::first_row(); row < rows; row += Group::row_stride()) {
    const float mean = stats[2 * row], rstd = stats[2 * row + 1];
    P4 xv[Packs], gv[Packs];
    Group::load(xv, x + row * cols, row_packs);
    Group::load(gv, dy + row * cols, row_packs);
    float sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
      const std::size_t q = Group::pack(p);
      if (q >= row_packs) break;
      const P4 w = detail::load_pack<4>(gamma + 4 * q);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        gv[p].v[j] = __fmul_rn(gv[p].v[j], w.v[j]);  // rounded once: see the streaming kernel
        sum_g += gv[p].v[j];
        sum_gx += gv[p].v[j] * ((xv[p].v[j] - mean) * rstd);
      }
    }
    const float mean_g = Group::sum(sum_g) / n;
    const float mean_gx = Group::sum(sum_gx) / n;
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
      const std::size_t q = Group::pack(p);
      if (q >= row_packs) break;
      P4 out;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float xhat = (xv[p].v[j] - mean) * rstd;
        out.v[j] = rstd * (gv[p].v[j] - mean_g - xhat * mean_gx);
      }
      detail::store_pack<4>(dx + row * cols + 4 * q, out);
    }
  }
}

/// The streaming form of layer_norm_backward_input_resident_kernel, for any cols and alignment.
/// x, dy, dx (rows, cols); gamma (cols); stats (rows, 2)
template <int V>
__global__ void layer_norm_backward_input_streaming_kernel(std::size_t rows, std::size_t cols,
                                                           const float* x, const float* dy,
                                                           const float* gamma, const float* stats,
                                                           float* dx) {
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
      // The same rounded g in mean(g) and below: a product contracted into an FMA in one place
      // only leaves its rounding error in dx (a whole row of it where cols == 1, whose dx is 0).
      const float g = __fmul_rn(dv.v[j], gv.v[j]);
      sum_g += g;
      sum_gx += g * ((xv.v[j] - mean) * rstd);
    }
  }
  const float n = static_cast<float>(cols);
  const float mean_g = detail::warp_sum(sum_g) / n;
  const float mean_gx = detail::warp_sum(sum_gx) / n;

  detail::map_strided<V>(
      cols, lane, 32,
      [=](float xv, float dv, float gv) {
        const float xhat = (xv - mean) * rstd;
        return rstd * (__fmul_rn(dv, gv) - mean_g - xhat * mean_gx);
      },
      dx + row * cols, xr, dyr, gamma);
}
/// The streaming backward_input kernels alone (layer_norm_backward_input uses them where rows do
/// not fit registers); public so that the benchmark can show what the resident kernels save.
inline void layer_norm_backward_input_streaming(std::size_t rows, std::size_t cols, const float* x,
                                                const float* dy, const float* gamma,
                                                const float* stats, float* dx,
                                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  detail::record_layer_norm("layer_norm_backward_input_streaming_kernel", rows, cols, 12, 2, 1,
                            true, stream);
  const dim3 grid = detail::row_grid(rows), block(32 * detail::rows_per_block);
  if (cols % 4 == 0 && detail::aligned<4>(x, dy, gamma, dx)) {
    GPIPE_CUDA_LAUNCH(layer_norm_backward_input_streaming_kernel<4>, grid, block, stream)
    (rows, cols, x, dy, gamma, stats, dx);
  } else {
    GPIPE_CUDA_LAUNCH(layer_norm_backward_input_streaming_kernel<1>, grid, block, stream)
    (rows, cols, x, dy, gamma, stats, dx);
  }
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_input_streaming_kernel");
}
/// dx (rows, cols), overwritten, from x, dy (rows, cols), gamma (cols) and the forward's stats
/// (rows, 2), on `stream`; resident or streaming kernels as for layer_norm_forward.
inline void layer_norm_backward_input(std::size_t rows, std::size_t cols, const float* x,
                                      const float* dy, const float* gamma, const float* stats,
                                      float* dx, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::RowLayout layout(cols);
  if (layout.threads == 0 || !detail::aligned<4>(x, dy, gamma, dx)) {
    return layer_norm_backward_input_streaming(rows, cols, x, dy, gamma, stats, dx, stream);
  }
  detail::record_layer_norm("layer_norm_backward_input_resident_kernel", rows, cols, 12, 2, 1, true,
                            stream);
  layout.dispatch([&](auto packs, auto whole_block) {
    constexpr auto kernel =
        &layer_norm_backward_input_resident_kernel<decltype(packs)::value,
                                                   decltype(whole_block)::value>;
    GPIPE_CUDA_LAUNCH(kernel, layout.grid(rows), layout.block(), stream)
    (rows, cols, x, dy, gamma, stats, dx);
  });
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_input_resident_kernel");
}

/// Pass 1 of dgamma(cols) += sum_rows dy * xhat and dbeta(cols) += sum_rows dy; partial is
/// (2, chunks, cols) when there is more than one chunk (see bias.cuh).
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
/// Floats of scratch that layer_norm_backward_weight needs for (rows, cols).
inline std::size_t layer_norm_backward_weight_scratch(std::size_t rows, std::size_t cols) {
  return 2 * detail::ColumnSplit(rows, cols).scratch(cols);
}
/// dgamma(cols) += sum over rows of dy xhat, dbeta(cols) += sum over rows of dy, on `stream`,
/// deterministic. `scratch` holds layer_norm_backward_weight_scratch(rows, cols) floats and stays
/// in use until the launches run.
inline void layer_norm_backward_weight(std::size_t rows, std::size_t cols, const float* x,
                                       const float* dy, const float* stats, float* dgamma,
                                       float* dbeta, float* scratch, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::ColumnSplit split(rows, cols);
  detail::record_kernel(
      "layer_norm_backward_weight_kernel", {rows, cols, 0}, 5.0 * static_cast<double>(rows * cols),
      detail::bytes_of<float>(2 * rows * cols + 2 * rows) +
          (split.chunks > 1 ? 0.0 : detail::bytes_of<float>(2 * cols)),
      detail::bytes_of<float>(split.chunks > 1 ? 2 * split.chunks * cols : 2 * cols), stream);
  GPIPE_CUDA_LAUNCH(layer_norm_backward_weight_kernel<4>, split.grid(cols), split.block(), stream)
  (rows, cols, split.rows_per_chunk, x, dy, stats, dgamma, dbeta, scratch);
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_weight_kernel");
  if (split.chunks > 1) {
    column_sum(split.chunks, cols, scratch, dgamma, stream);
    column_sum(split.chunks, cols, scratch + split.chunks * cols, dbeta, stream);
  }
}

}  // namespace gpipe::cuda
