#pragma once
// LayerNorm over the last dimension, affine, as torch.nn.LayerNorm (biased variance, eps inside
// the square root): y = (x - mean) * rstd * gamma + beta. x, y, dy and dx are stored as T (float,
// or gpipe::bf16 under gpipe::MixedBf16: widened on load, float math, rounded once on store);
// gamma, beta and their gradients are float. Host reference: gpipe/backend/host/kernels/
// layer_norm.hpp (which computes in double; these kernels in float).
//
// Row statistics are kept for the backward kernels as stats(rows, 2) of T: float rows hold
// (mean, rstd); a bf16 row's two slots hold rstd's 32 bits, high half first, and the backward
// kernels recompute the mean from x in the forward's order (so the same float, where they hold
// the row as the forward did: both resident or both streaming).
//
// Forward and backward_input need a row twice: for its sums, then for the output. Rows of up to
// 16384 elements (in packs of 4) stay in registers in between ("resident" kernels: a warp per
// row up to 1024, a block per row beyond), so each input is read from memory once. Wider or
// unaligned rows take the "streaming" kernels, which give each row to a warp and read it a
// second time, from L1/L2 where it is still there. The weight gradients are column sums: of
// float rows in column tiles (see bias.cuh); of bf16 rows by the resident layout, each row group
// summing its rows' columns in registers (the mean recomputed from the row it holds), then the
// blocks' sums in order (bf16 rows that the layout cannot hold: column tiles, after a pass that
// writes their float statistics into scratch).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/layer_norm.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "gpipe/backend/cuda/kernels/bias.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

namespace detail {
// The launch record of a LayerNorm row kernel over (rows, cols) of T: `arrays` (rows, cols)
// arrays read and one written, `params` of gamma and beta read, the stats (rows, 2) of T read or
// (forward) written.
template <class T>
void record_layer_norm(std::string_view kernel, std::size_t rows, std::size_t cols,
                       double flops_per, int arrays, int params, bool forward,
                       cudaStream_t stream) {
  const std::size_t n = rows * cols;
  const double stats = bytes_of<T>(2 * rows);
  record_kernel(kernel, {rows, cols, 0}, flops_per * static_cast<double>(n),
                arrays * bytes_of<T>(n) + params * bytes_of<float>(cols) + (forward ? 0 : stats),
                bytes_of<T>(n) + (forward ? stats : 0), stream);
}
}  // namespace detail

namespace detail {

inline constexpr unsigned rows_per_block = 4;  // warps per block of a row-per-warp kernel

inline dim3 row_grid(std::size_t rows) {
  return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
}

// The most threads that hold one row in a resident kernel, and the most 4-element packs each
// holds: 512 x 8 x 4 = 16384 elements. (A 1024-thread block could hold no more than 64 registers
// per thread, too few for backward's 2 x 8 packs.)
inline constexpr unsigned max_row_threads = 512;
inline constexpr int max_row_packs = 8;

// How a resident kernel holds a row of `cols` elements (cols a multiple of 4): a group of
// `threads` threads, each with `packs` 4-element packs, thread t those at pack t, t + threads, ...
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
  // Rows a block holds at once: its one group's, or rows_per_block warps'.
  std::size_t block_rows() const { return whole_block() ? 1 : rows_per_block; }
  // Blocks: one row each (or rows_per_block), capped; the kernels loop over the rest.
  dim3 grid(std::size_t rows) const {
    const std::size_t per_block = block_rows();
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
  // v[p] = this thread's p-th pack of `row` widened, zeros past its row_packs packs (they add 0
  // to sums).
  template <int Packs, class T>
  __device__ static void load(Pack<float, 4> (&v)[Packs], const T* row, std::size_t row_packs) {
#pragma unroll
    for (int p = 0; p < Packs; ++p)
      v[p] = pack(p) < row_packs ? load_widened<4>(row + 4 * pack(p)) : Pack<float, 4>{};
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
  // The mean of the row of n elements that the group holds in v (load()'s packs): every resident
  // kernel's, so that a backward kernel recomputes the forward's bits.
  template <int Packs>
  __device__ static float mean(const Pack<float, 4> (&v)[Packs], float n) {
    float s = 0;
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s += v[p].v[j];
    }
    return sum(s) / n;
  }
};

// A row's statistics in stats(rows, 2) of T (see the top of this file): float (mean, rstd); bf16
// rstd's bits, high half first, the mean left to the backward kernels.
template <class T>
inline constexpr bool stats_hold_mean = std::is_same_v<T, float>;
__device__ __forceinline__ void store_stats(float* stats, std::size_t row, float mean, float rstd) {
  stats[2 * row] = mean;
  stats[2 * row + 1] = rstd;
}
__device__ __forceinline__ void store_stats(bf16* stats, std::size_t row, float, float rstd) {
  const std::uint32_t bits = bits_of_float(rstd);
  stats[2 * row].bits = static_cast<std::uint16_t>(bits >> 16);
  stats[2 * row + 1].bits = static_cast<std::uint16_t>(bits & 0xffffu);
}
__device__ __forceinline__ float stored_rstd(const float* stats, std::size_t row) {
  return stats[2 * row + 1];
}
__device__ __forceinline__ float stored_rstd(const bf16* stats, std::size_t row) {
  return float_of_bits(static_cast<std::uint32_t>(stats[2 * row].bits) << 16 |
                       stats[2 * row + 1].bits);
}

// A lane's sums of d = x - shift and of d^2 over its elements of the row xr (cols): V per load,
// from element lane V on, 32 V apart. The streaming kernels' statistics: the variance from
// shifted data keeps the cancellation of E[x^2] - E[x]^2 small when |mean| >> std.
struct ShiftedSums {
  float sum = 0, sum_sq = 0;
};
template <int V, class T>
__device__ __forceinline__ ShiftedSums shifted_sums(const T* xr, std::size_t cols, unsigned lane,
                                                    float shift) {
  ShiftedSums s;
  for (std::size_t c = lane * V; c < cols; c += 32 * V) {
    const Pack<float, V> v = load_widened<V>(xr + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = v.v[j] - shift;
      s.sum += d;
      s.sum_sq += d * d;
    }
  }
  return s;
}
// The streaming kernels' mean of the row xr (cols), which a warp holds: every lane gets it.
template <int V, class T>
__device__ __forceinline__ float streaming_mean(const T* xr, std::size_t cols, unsigned lane) {
  const float shift = widen(xr[0]);
  return shift + warp_sum(shifted_sums<V>(xr, cols, lane, shift).sum) / static_cast<float>(cols);
}

}  // namespace detail

namespace detail {
// The rows of layer_norm_forward_resident_kernel (AddInput: of residual_layer_norm_forward_kernel,
// each row first formed as x + r, rounded to T and stored in x, then normalized as stored).
template <int Packs, bool WholeBlock, bool AddInput, class T>
__device__ __forceinline__ void layer_norm_forward_rows(std::size_t rows, std::size_t cols,
                                                        float eps, const T* x, const T* r, T* sum,
                                                        const float* gamma, const float* beta, T* y,
                                                        T* stats) {
  using Group = RowGroup<WholeBlock>;
  using P4 = Pack<float, 4>;
  const std::size_t row_packs = cols / 4;
  const float n = static_cast<float>(cols);
  for (std::size_t row = Group::first_row(); row < rows; row += Group::row_stride()) {
    P4 v[Packs];
    Group::load(v, x + row * cols, row_packs);
    if constexpr (AddInput) {
      P4 rv[Packs];
      Group::load(rv, r + row * cols, row_packs);
#pragma unroll
      for (int p = 0; p < Packs; ++p) {
        const std::size_t q = Group::pack(p);
        if (q >= row_packs) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) v[p].v[j] = widen(narrow<T>(__fadd_rn(v[p].v[j], rv[p].v[j])));
        store_narrowed<4>(sum + row * cols + 4 * q, v[p]);
      }
    }
    const float mean = Group::mean(v, n);
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
      const P4 g = load_pack<4>(gamma + 4 * q), b = load_pack<4>(beta + 4 * q);
      P4 out;
#pragma unroll
      for (int j = 0; j < 4; ++j) out.v[j] = (v[p].v[j] - mean) * rstd * g.v[j] + b.v[j];
      store_narrowed<4>(y + row * cols + 4 * q, out);
    }
    if (Group::rank() == 0) store_stats(stats, row, mean, rstd);
  }
}
}  // namespace detail

/// x (rows, cols) -> y (rows, cols), stats (rows, 2), cols % 4 == 0, each row held in registers
/// (Packs packs per thread, see RowLayout): mean, then the variance as the mean of (x - mean)^2.
template <int Packs, bool WholeBlock, class T>
__global__ void __launch_bounds__(detail::RowGroup<WholeBlock>::max_block_threads)
    layer_norm_forward_resident_kernel(std::size_t rows, std::size_t cols, float eps, const T* x,
                                       const float* gamma, const float* beta, T* y, T* stats) {
  detail::layer_norm_forward_rows<Packs, WholeBlock, false, T>(rows, cols, eps, x, nullptr, nullptr,
                                                               gamma, beta, y, stats);
}
/// x = x + r (a residual's add, each sum rounded to T and stored), then y and stats from the
/// stored x as layer_norm_forward_resident_kernel computes them: bit for bit add_kernel then it.
template <int Packs, bool WholeBlock, class T>
__global__ void __launch_bounds__(detail::RowGroup<WholeBlock>::max_block_threads)
    residual_layer_norm_forward_kernel(std::size_t rows, std::size_t cols, float eps, T* x,
                                       const T* r, const float* gamma, const float* beta, T* y,
                                       T* stats) {
  detail::layer_norm_forward_rows<Packs, WholeBlock, true, T>(rows, cols, eps, x, r, x, gamma, beta,
                                                              y, stats);
}

/// The streaming form of layer_norm_forward_resident_kernel, for any cols and alignment: the
/// statistics from detail::shifted_sums.
template <int V, class T>
__global__ void layer_norm_forward_streaming_kernel(std::size_t rows, std::size_t cols, float eps,
                                                    const T* x, const float* gamma,
                                                    const float* beta, T* y, T* stats) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const T* xr = x + row * cols;

  const float shift = detail::widen(xr[0]);
  const detail::ShiftedSums s = detail::shifted_sums<V>(xr, cols, lane, shift);
  const float sum = detail::warp_sum(s.sum);
  const float sum_sq = detail::warp_sum(s.sum_sq);
  const float n = static_cast<float>(cols);
  const float shifted_mean = sum / n;  // as detail::streaming_mean: shift + sum / n
  const float var = fmaxf(sum_sq / n - shifted_mean * shifted_mean, 0.0f);
  const float mean = shift + shifted_mean;
  const float rstd = 1.0f / sqrtf(var + eps);

  detail::map_strided<V>(
      cols, lane, 32, [=](float v, float g, float b) { return (v - mean) * rstd * g + b; },
      y + row * cols, xr, gamma, beta);
  if (lane == 0) detail::store_stats(stats, row, mean, rstd);
}
/// The streaming kernels alone (layer_norm_forward uses them where rows do not fit registers);
/// public so that the benchmark can show what the resident kernels save.
template <class T>
void layer_norm_forward_streaming(std::size_t rows, std::size_t cols, double eps, const T* x,
                                  const float* gamma, const float* beta, T* y, T* stats,
                                  cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  detail::record_layer_norm<T>("layer_norm_forward_streaming_kernel", rows, cols, 8, 1, 2, true,
                               stream);
  const auto e = static_cast<float>(eps);
  const dim3 grid = detail::row_grid(rows), block(32 * detail::rows_per_block);
  constexpr auto packed = &layer_norm_forward_streaming_kernel<4, T>;
  constexpr auto scalar = &layer_norm_forward_streaming_kernel<1, T>;
  if (cols % 4 == 0 && detail::aligned<4>(x, gamma, beta, y)) {
    GPIPE_CUDA_LAUNCH(packed, grid, block, stream)(rows, cols, e, x, gamma, beta, y, stats);
  } else {
    GPIPE_CUDA_LAUNCH(scalar, grid, block, stream)(rows, cols, e, x, gamma, beta, y, stats);
  }
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_forward_streaming_kernel");
}
/// x (rows, cols) -> y (rows, cols), stats (rows, 2) (see the top of this file), gamma and beta
/// (cols), on `stream`: the resident kernels where a row fits in registers (cols % 4 == 0, at
/// most 16384, pointers aligned for 4-element packs), else the streaming one.
template <class T>
void layer_norm_forward(std::size_t rows, std::size_t cols, double eps, const T* x,
                        const float* gamma, const float* beta, T* y, T* stats,
                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::RowLayout layout(cols);
  if (layout.threads == 0 || !detail::aligned<4>(x, gamma, beta, y)) {
    return layer_norm_forward_streaming(rows, cols, eps, x, gamma, beta, y, stats, stream);
  }
  detail::record_layer_norm<T>("layer_norm_forward_resident_kernel", rows, cols, 8, 1, 2, true,
                               stream);
  layout.dispatch([&](auto packs, auto whole_block) {
    constexpr auto kernel = &layer_norm_forward_resident_kernel<decltype(packs)::value,
                                                                decltype(whole_block)::value, T>;
    GPIPE_CUDA_LAUNCH(kernel, layout.grid(rows), layout.block(), stream)
    (rows, cols, static_cast<float>(eps), x, gamma, beta, y, stats);
  });
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_forward_resident_kernel");
}

namespace detail {
// The rows of layer_norm_backward_input_resident_kernel (AddOutput: of
// residual_layer_norm_backward_input_kernel, each dx rounded to T, then r added).
template <int Packs, bool WholeBlock, bool AddOutput, class T>
__device__ __forceinline__ void layer_norm_backward_input_rows(std::size_t rows, std::size_t cols,
                                                               const T* x, const T* dy,
                                                               const float* gamma, const T* stats,
                                                               const T* r, T* dx) {
  using Group = RowGroup<WholeBlock>;
  using P4 = Pack<float, 4>;
  const std::size_t row_packs = cols / 4;
  const float n = static_cast<float>(cols);
  for (std::size_t row = Group::first_row(); row < rows; row += Group::row_stride()) {
    P4 xv[Packs], gv[Packs];
    Group::load(xv, x + row * cols, row_packs);
    Group::load(gv, dy + row * cols, row_packs);
    const float rstd = stored_rstd(stats, row);
    float mean;
    if constexpr (stats_hold_mean<T>) {
      mean = stats[2 * row];
    } else {
      mean = Group::mean(xv, n);
    }
    float sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
      const std::size_t q = Group::pack(p);
      if (q >= row_packs) break;
      const P4 w = load_pack<4>(gamma + 4 * q);
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
      if constexpr (AddOutput) {
        const P4 rv = load_widened<4>(r + row * cols + 4 * q);
#pragma unroll
        for (int j = 0; j < 4; ++j) out.v[j] = __fadd_rn(widen(narrow<T>(out.v[j])), rv.v[j]);
      }
      store_narrowed<4>(dx + row * cols + 4 * q, out);
    }
  }
}
}  // namespace detail

/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,  xhat = (x - mean) * rstd
/// x, dy, dx (rows, cols), cols % 4 == 0; gamma (cols); stats (rows, 2). Each row's x and g are
/// held in registers (Packs packs each per thread, see RowLayout).
template <int Packs, bool WholeBlock, class T>
__global__ void __launch_bounds__(detail::RowGroup<WholeBlock>::max_block_threads)
    layer_norm_backward_input_resident_kernel(std::size_t rows, std::size_t cols, const T* x,
                                              const T* dy, const float* gamma, const T* stats,
                                              T* dx) {
  detail::layer_norm_backward_input_rows<Packs, WholeBlock, false, T>(rows, cols, x, dy, gamma,
                                                                      stats, nullptr, dx);
}
/// layer_norm_backward_input_resident_kernel's dx rounded to T, plus r (a residual's input
/// gradient): bit for bit that kernel then add_kernel.
template <int Packs, bool WholeBlock, class T>
__global__ void __launch_bounds__(detail::RowGroup<WholeBlock>::max_block_threads)
    residual_layer_norm_backward_input_kernel(std::size_t rows, std::size_t cols, const T* x,
                                              const T* dy, const float* gamma, const T* stats,
                                              const T* r, T* dx) {
  detail::layer_norm_backward_input_rows<Packs, WholeBlock, true, T>(rows, cols, x, dy, gamma,
                                                                     stats, r, dx);
}

/// The streaming form of layer_norm_backward_input_resident_kernel, for any cols and alignment.
/// x, dy, dx (rows, cols); gamma (cols); stats (rows, 2)
template <int V, class T>
__global__ void layer_norm_backward_input_streaming_kernel(std::size_t rows, std::size_t cols,
                                                           const T* x, const T* dy,
                                                           const float* gamma, const T* stats,
                                                           T* dx) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  const T* dyr = dy + row * cols;
  const float rstd = detail::stored_rstd(stats, row);
  float mean;
  if constexpr (detail::stats_hold_mean<T>) {
    mean = stats[2 * row];
  } else {
    mean = detail::streaming_mean<V>(xr, cols, lane);
  }

  float sum_g = 0, sum_gx = 0;
  for (std::size_t c = lane * V; c < cols; c += 32 * V) {
    const detail::Pack<float, V> xv = detail::load_widened<V>(xr + c);
    const detail::Pack<float, V> dv = detail::load_widened<V>(dyr + c);
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
template <class T>
void layer_norm_backward_input_streaming(std::size_t rows, std::size_t cols, const T* x,
                                         const T* dy, const float* gamma, const T* stats, T* dx,
                                         cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  detail::record_layer_norm<T>("layer_norm_backward_input_streaming_kernel", rows, cols, 12, 2, 1,
                               false, stream);
  const dim3 grid = detail::row_grid(rows), block(32 * detail::rows_per_block);
  constexpr auto packed = &layer_norm_backward_input_streaming_kernel<4, T>;
  constexpr auto scalar = &layer_norm_backward_input_streaming_kernel<1, T>;
  if (cols % 4 == 0 && detail::aligned<4>(x, dy, gamma, dx)) {
    GPIPE_CUDA_LAUNCH(packed, grid, block, stream)(rows, cols, x, dy, gamma, stats, dx);
  } else {
    GPIPE_CUDA_LAUNCH(scalar, grid, block, stream)(rows, cols, x, dy, gamma, stats, dx);
  }
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_input_streaming_kernel");
}
/// dx (rows, cols), overwritten, from x, dy (rows, cols), gamma (cols) and the forward's stats
/// (rows, 2), on `stream`; resident or streaming kernels as for layer_norm_forward.
template <class T>
void layer_norm_backward_input(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                               const float* gamma, const T* stats, T* dx, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::RowLayout layout(cols);
  if (layout.threads == 0 || !detail::aligned<4>(x, dy, gamma, dx)) {
    return layer_norm_backward_input_streaming(rows, cols, x, dy, gamma, stats, dx, stream);
  }
  detail::record_layer_norm<T>("layer_norm_backward_input_resident_kernel", rows, cols, 12, 2, 1,
                               false, stream);
  layout.dispatch([&](auto packs, auto whole_block) {
    constexpr auto kernel =
        &layer_norm_backward_input_resident_kernel<decltype(packs)::value,
                                                   decltype(whole_block)::value, T>;
    GPIPE_CUDA_LAUNCH(kernel, layout.grid(rows), layout.block(), stream)
    (rows, cols, x, dy, gamma, stats, dx);
  });
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_input_resident_kernel");
}

/// A residual's add fused into the LayerNorm after it: x = x + r (rounded to T, in place), then
/// y and stats from x as layer_norm_forward computes them, on `stream`, in one kernel where the
/// resident kernels hold the row (else add then layer_norm_forward): bit for bit those two.
template <class T>
void residual_layer_norm_forward(std::size_t rows, std::size_t cols, double eps, T* x, const T* r,
                                 const float* gamma, const float* beta, T* y, T* stats,
                                 cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::RowLayout layout(cols);
  if (layout.threads == 0 || !detail::aligned<4>(x, r, gamma, beta, y)) {
    add(rows * cols, x, r, x, stream);
    return layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats, stream);
  }
  const std::size_t n = rows * cols;
  // x and r read, x and y written; gamma and beta read; the stats written
  detail::record_kernel("residual_layer_norm_forward_kernel", {rows, cols, 0},
                        9.0 * static_cast<double>(n),
                        detail::bytes_of<T>(2 * n) + detail::bytes_of<float>(2 * cols),
                        detail::bytes_of<T>(2 * n + 2 * rows), stream);
  layout.dispatch([&](auto packs, auto whole_block) {
    constexpr auto kernel = &residual_layer_norm_forward_kernel<decltype(packs)::value,
                                                                decltype(whole_block)::value, T>;
    GPIPE_CUDA_LAUNCH(kernel, layout.grid(rows), layout.block(), stream)
    (rows, cols, static_cast<float>(eps), x, r, gamma, beta, y, stats);
  });
  GPIPE_CUDA_CHECK_LAUNCH("residual_layer_norm_forward_kernel");
}
/// layer_norm_backward_input's dx, then dx += r (a residual's input gradient), on `stream`, in
/// one kernel where the resident kernels hold the row (else the two): bit for bit those two.
template <class T>
void residual_layer_norm_backward_input(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                                        const float* gamma, const T* stats, const T* r, T* dx,
                                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::RowLayout layout(cols);
  if (layout.threads == 0 || !detail::aligned<4>(x, dy, gamma, r, dx)) {
    layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx, stream);
    return add(rows * cols, dx, r, dx, stream);
  }
  const std::size_t n = rows * cols;
  // x, dy and r read, dx written; gamma and the stats read
  detail::record_kernel("residual_layer_norm_backward_input_kernel", {rows, cols, 0},
                        13.0 * static_cast<double>(n),
                        detail::bytes_of<T>(3 * n + 2 * rows) + detail::bytes_of<float>(cols),
                        detail::bytes_of<T>(n), stream);
  layout.dispatch([&](auto packs, auto whole_block) {
    constexpr auto kernel =
        &residual_layer_norm_backward_input_kernel<decltype(packs)::value,
                                                   decltype(whole_block)::value, T>;
    GPIPE_CUDA_LAUNCH(kernel, layout.grid(rows), layout.block(), stream)
    (rows, cols, x, dy, gamma, stats, r, dx);
  });
  GPIPE_CUDA_CHECK_LAUNCH("residual_layer_norm_backward_input_kernel");
}

/// Pass 1 of dgamma(cols) += sum_rows dy * xhat and dbeta(cols) += sum_rows dy over column tiles,
/// from float statistics (mean, rstd); partial is (2, chunks, cols) when there is more than one
/// chunk (see bias.cuh).
template <int Unroll, class T>
__global__ void layer_norm_backward_weight_kernel(std::size_t rows, std::size_t cols,
                                                  std::size_t rows_per_chunk, const T* x,
                                                  const T* dy, const float* stats, float* dgamma,
                                                  float* dbeta, float* partial) {
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
        xv[u] = detail::widen(x[ru * cols + c]);
        dv[u] = detail::widen(dy[ru * cols + c]);
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
      const float d = detail::widen(dy[r * cols + c]);
      sum_gamma += d * ((detail::widen(x[r * cols + c]) - stats[2 * r]) * stats[2 * r + 1]);
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

namespace detail {

// The column sums of the row groups of a block (layer_norm_backward_weight_resident_kernel's,
// each thread's for its packs as RowLayout places them), in group order: added to dgamma and
// dbeta (cols) where the grid is one block, else written to row blockIdx.x of partial(2,
// gridDim.x, cols)'s two halves. All threads of the block call it.
template <int Packs, bool WholeBlock>
__device__ void store_block_sums(const Pack<float, 4> (&sum_gamma)[Packs],
                                 const Pack<float, 4> (&sum_beta)[Packs], std::size_t cols,
                                 float* dgamma, float* dbeta, float* partial) {
  using Group = RowGroup<WholeBlock>;
  const bool one_block = gridDim.x == 1;
  float* out_gamma = one_block ? dgamma : partial + blockIdx.x * cols;
  float* out_beta = one_block ? dbeta : partial + (gridDim.x + blockIdx.x) * cols;
  const auto put = [&](float* out, std::size_t c, float v) { out[c] = one_block ? out[c] + v : v; };
  const std::size_t row_packs = cols / 4;
  if constexpr (WholeBlock) {  // one group: its own columns
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
      if (Group::pack(p) >= row_packs) break;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        put(out_gamma, 4 * Group::pack(p) + j, sum_gamma[p].v[j]);
        put(out_beta, 4 * Group::pack(p) + j, sum_beta[p].v[j]);
      }
    }
  } else {  // rows_per_block warps, each a row of at most 32 x max_row_packs packs: added in order
    __shared__ float buf[2][32 * max_row_packs * 4];
    const unsigned warp = threadIdx.x / 32;
    for (unsigned w = 0; w < rows_per_block; ++w) {
      if (warp == w) {
#pragma unroll
        for (int p = 0; p < Packs; ++p) {
          if (Group::pack(p) >= row_packs) break;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const std::size_t c = 4 * Group::pack(p) + j;
            buf[0][c] = w == 0 ? sum_gamma[p].v[j] : buf[0][c] + sum_gamma[p].v[j];
            buf[1][c] = w == 0 ? sum_beta[p].v[j] : buf[1][c] + sum_beta[p].v[j];
          }
        }
      }
      __syncthreads();
    }
    for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
      put(out_gamma, c, buf[0][c]);
      put(out_beta, c, buf[1][c]);
    }
  }
}

}  // namespace detail

/// Pass 1 of dgamma(cols) += sum_rows dy * xhat and dbeta(cols) += sum_rows dy by row groups
/// (RowLayout, cols % 4 == 0) of bf16 rows: each group sums its rows (first_row(), +
/// row_stride(), ...) per column in registers, the mean recomputed from the row as the resident
/// forward computes it, rstd from the stash; then each block's sums (detail::store_block_sums)
/// go to partial(2, blocks, cols), or are added to dgamma and dbeta where there is one block.
template <int Packs, bool WholeBlock, class T>
__global__ void __launch_bounds__(detail::RowGroup<WholeBlock>::max_block_threads)
    layer_norm_backward_weight_resident_kernel(std::size_t rows, std::size_t cols, const T* x,
                                               const T* dy, const T* stats, float* dgamma,
                                               float* dbeta, float* partial) {
  static_assert(!detail::stats_hold_mean<T>, "gpipe: float rows take the column tiles");
  using Group = detail::RowGroup<WholeBlock>;
  using P4 = detail::Pack<float, 4>;
  const std::size_t row_packs = cols / 4;
  const float n = static_cast<float>(cols);
  P4 sum_gamma[Packs] = {}, sum_beta[Packs] = {};
  for (std::size_t row = Group::first_row(); row < rows; row += Group::row_stride()) {
    P4 xv[Packs];
    Group::load(xv, x + row * cols, row_packs);
    const float rstd = detail::stored_rstd(stats, row), mean = Group::mean(xv, n);
#pragma unroll
    for (int p = 0; p < Packs; ++p) {
      const std::size_t q = Group::pack(p);
      if (q >= row_packs) break;
      const P4 d = detail::load_widened<4>(dy + row * cols + 4 * q);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sum_gamma[p].v[j] += d.v[j] * ((xv[p].v[j] - mean) * rstd);
        sum_beta[p].v[j] += d.v[j];
      }
    }
  }
  detail::store_block_sums<Packs, WholeBlock>(sum_gamma, sum_beta, cols, dgamma, dbeta, partial);
}

/// stats(rows, 2) = (mean, rstd) in float from x (rows, cols) and a bf16 stash: the mean as the
/// streaming forward computes it, rstd from the stash's bits; a warp per row. (The column-tile
/// weight gradient of rows that the resident layout cannot hold.)
template <int V>
__global__ void layer_norm_stats_from_stash_kernel(std::size_t rows, std::size_t cols,
                                                   const bf16* x, const bf16* stash, float* stats) {
  const std::size_t row =
      static_cast<std::size_t>(blockIdx.x) * detail::rows_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float mean = detail::streaming_mean<V>(x + row * cols, cols, lane);
  if (lane == 0) detail::store_stats(stats, row, mean, detail::stored_rstd(stash, row));
}

namespace detail {

// How layer_norm_backward_weight sums (rows, cols) of T: by row groups (bf16 rows that the
// resident layout holds, their pointers aligned for its packs), blocks of at least 8 rows a
// group, their partial sums added in block order by column_sum (one thread a column); else by
// column tiles (ColumnSplit), bf16 rows after a pass that writes their float statistics into
// the scratch.
template <class T>
struct WeightSplit {
  RowLayout layout;
  std::size_t blocks = 0;  // of the row-group kernel; 0: column tiles
  ColumnSplit columns;

  WeightSplit(std::size_t rows, std::size_t cols, bool aligned)
      : layout(cols), columns(rows, cols) {
    if (stats_hold_mean<T> || layout.threads == 0 || !aligned) return;
    const std::size_t per_block = 8 * layout.block_rows();
    blocks = std::clamp<std::size_t>((rows + per_block - 1) / per_block, 1, 256);
  }
  // Floats of scratch: the blocks' partial sums (2, blocks, cols); or the float statistics
  // (bf16) and the column tiles' partial sums.
  std::size_t scratch(std::size_t rows, std::size_t cols) const {
    if (blocks != 0) return blocks > 1 ? 2 * blocks * cols : 0;
    return (stats_hold_mean<T> ? 0 : 2 * rows) + 2 * columns.scratch(cols);
  }
};

// The column-tile weight gradient's statistics (mean, rstd) in float: float stats themselves; a
// bf16 stash's recomputed into scratch(rows, 2).
inline const float* float_stats(std::size_t, std::size_t, const float*, const float* stats, float*,
                                cudaStream_t) {
  return stats;
}
GPIPE_CUDA_INLINE const float* float_stats(std::size_t rows, std::size_t cols, const bf16* x,
                                           const bf16* stash, float* scratch, cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE const float* float_stats(std::size_t rows, std::size_t cols, const bf16* x,
                                           const bf16* stash, float* scratch, cudaStream_t stream) {
  record_kernel("layer_norm_stats_from_stash_kernel", {rows, cols, 0},
                static_cast<double>(rows * cols), bytes_of<bf16>(rows * cols + 2 * rows),
                bytes_of<float>(2 * rows), stream);
  const dim3 grid = row_grid(rows), block(32 * rows_per_block);
  if (cols % 4 == 0 && aligned<4>(x)) {
    GPIPE_CUDA_LAUNCH(layer_norm_stats_from_stash_kernel<4>, grid, block, stream)
    (rows, cols, x, stash, scratch);
  } else {
    GPIPE_CUDA_LAUNCH(layer_norm_stats_from_stash_kernel<1>, grid, block, stream)
    (rows, cols, x, stash, scratch);
  }
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_stats_from_stash_kernel");
  return scratch;
}
#endif

// layer_norm_backward_weight by row groups (split.blocks != 0): the kernel, then the blocks'
// partial sums (2, blocks, cols) added in block order by column_sum, one thread a column.
template <class T>
void weight_by_row_groups(const WeightSplit<T>& split, std::size_t rows, std::size_t cols,
                          const T* x, const T* dy, const T* stats, float* dgamma, float* dbeta,
                          float* scratch, cudaStream_t stream) {
  const std::size_t blocks = split.blocks;
  split.layout.dispatch([&](auto packs, auto whole_block) {
    constexpr auto kernel =
        &layer_norm_backward_weight_resident_kernel<decltype(packs)::value,
                                                    decltype(whole_block)::value, T>;
    GPIPE_CUDA_LAUNCH(kernel, static_cast<unsigned>(blocks), split.layout.block(), stream)
    (rows, cols, x, dy, stats, dgamma, dbeta, blocks > 1 ? scratch : nullptr);
  });
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_weight_resident_kernel");
  if (blocks == 1) return;
  column_sum(blocks, cols, scratch, dgamma, stream);
  column_sum(blocks, cols, scratch + blocks * cols, dbeta, stream);
}

}  // namespace detail

/// Floats of scratch that layer_norm_backward_weight needs for (rows, cols) of T (whatever the
/// pointers' alignment).
template <class T = float>
std::size_t layer_norm_backward_weight_scratch(std::size_t rows, std::size_t cols) {
  return std::max(detail::WeightSplit<T>(rows, cols, true).scratch(rows, cols),
                  detail::WeightSplit<T>(rows, cols, false).scratch(rows, cols));
}
/// dgamma(cols) += sum over rows of dy xhat, dbeta(cols) += sum over rows of dy, on `stream`,
/// deterministic; x and dy (rows, cols), stats (rows, 2) the forward's. `scratch` holds
/// layer_norm_backward_weight_scratch<T>(rows, cols) floats and stays in use until the launches
/// run.
template <class T>
void layer_norm_backward_weight(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                                const T* stats, float* dgamma, float* dbeta, float* scratch,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const detail::WeightSplit<T> split(rows, cols, detail::aligned<4>(x, dy));
  // x, dy and the stats read; dgamma and dbeta read and written, or the blocks' (chunks')
  // partial sums written
  const std::size_t partials = split.blocks != 0 ? split.blocks : split.columns.chunks;
  detail::record_kernel(split.blocks != 0 ? "layer_norm_backward_weight_resident_kernel"
                                          : "layer_norm_backward_weight_kernel",
                        {rows, cols, 0}, 5.0 * static_cast<double>(rows * cols),
                        detail::bytes_of<T>(2 * rows * cols + 2 * rows) +
                            (partials > 1 ? 0.0 : detail::bytes_of<float>(2 * cols)),
                        detail::bytes_of<float>(2 * partials * cols), stream);
  if constexpr (!detail::stats_hold_mean<T>) {  // float rows never take the row groups
    if (split.blocks != 0) {
      return detail::weight_by_row_groups(split, rows, cols, x, dy, stats, dgamma, dbeta, scratch,
                                          stream);
    }
  }
  const float* mean_rstd = detail::float_stats(rows, cols, x, stats, scratch, stream);
  const detail::ColumnSplit& columns = split.columns;
  float* partial =
      columns.chunks > 1 ? scratch + (detail::stats_hold_mean<T> ? 0 : 2 * rows) : nullptr;
  constexpr auto kernel = &layer_norm_backward_weight_kernel<4, T>;
  GPIPE_CUDA_LAUNCH(kernel, columns.grid(cols), columns.block(), stream)
  (rows, cols, columns.rows_per_chunk, x, dy, mean_rstd, dgamma, dbeta, partial);
  GPIPE_CUDA_CHECK_LAUNCH("layer_norm_backward_weight_kernel");
  if (columns.chunks > 1) {
    column_sum(columns.chunks, cols, partial, dgamma, stream);
    column_sum(columns.chunks, cols, partial + columns.chunks * cols, dbeta, stream);
  }
}

}  // namespace gpipe::cuda
