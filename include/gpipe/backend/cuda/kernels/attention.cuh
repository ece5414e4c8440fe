#pragma once
// Flash attention kernels (FlashAttention-2's order, SIMT: float FMAs): the algorithm of
// gpipe/model/attention.hpp for any AttentionGeometry (grouped-query heads, q, k, v anywhere in a
// row) and optional document ids, T storage float or bf16 (loaded widened, computed and
// accumulated in float, stored rounded once), and the launchers, which give bf16 attention of
// head sizes that are multiples of 16 up to 128 to the tensor-core kernels of attention_mma.cuh
// instead. Host reference: gpipe/backend/host/kernels/attention.hpp.
//
// Tiles of R query rows by R key rows (R = 32 for head sizes up to 64, 16 up to 128), a block
// of 128 threads per tile: L = 128 / R threads share a tile row, each holding R / L of its
// scores and DMAX / L of its head dimensions; a row's max and sum go through L-lane shuffles.
// Operands live in shared memory as float, rows padded by one against bank conflicts.
//   flash_attention_forward_kernel          block (sample, query tile, query head): the q tile
//       stays, k and v tiles stream by (u <= t only), online softmax; writes o and lse
//   flash_attention_backward_delta_kernel   a warp per (row, head): delta = rowsum(do .* o)
//   flash_attention_backward_kv_kernel      block (sample, key tile, key/value head): dk and dv
//       of the tile, over every query tile at or after it and every query head of the group
//   flash_attention_backward_q_kernel       block (sample, query tile, query head): dq of the
//       tile, over its key tiles
// The backward recomputes P = e^(S - lse) tile by tile in both of its passes (seven products a
// tile instead of FlashAttention-2's five), so that every gradient element is one thread's sum in
// a fixed order: deterministic, no atomics.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/attention.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels/attention_common.cuh"
#include "gpipe/backend/cuda/kernels/attention_mma.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/error.hpp"
#include "gpipe/model/attention.hpp"

namespace gpipe::cuda {

/// The largest head size d the flash attention kernels take (a gpipe::Error beyond).
inline constexpr std::size_t flash_attention_max_head_size = 128;

namespace detail {

// FlashTile<DMAX>: the tiling for head sizes up to DMAX (see the top of this file).
template <int DMAX>
struct FlashTile {
  static constexpr int dmax = DMAX;
  static constexpr int rows = DMAX <= 64 ? 32 : 16;             // R, query and key rows
  static constexpr int lanes = flash_attention_threads / rows;  // L, threads a row
  static constexpr int cols = rows / lanes;                     // scores a thread
  static constexpr int dims = DMAX / lanes;                     // head dimensions a thread
  static constexpr int ld = DMAX + 1;                           // a shared row, padded
  static_assert(lanes <= 32 && 32 % lanes == 0 && rows % lanes == 0 && DMAX % lanes == 0);
};

// s (Tile::rows, Tile::ld) <- rows [t0, t0 + Tile::rows) of a head (d columns at `head`, rows
// `ld` apart), widened, 0 past `tokens` rows and past d columns. All threads of the block call it.
template <class Tile, class T>
__device__ __forceinline__ void load_tile(float (*s)[Tile::ld], const T* head, std::size_t ld,
                                          std::size_t t0, std::size_t tokens, std::size_t d) {
  for (int i = static_cast<int>(threadIdx.x); i < Tile::rows * Tile::dmax;
       i += flash_attention_threads) {
    const int r = i / Tile::dmax, c = i % Tile::dmax;
    const std::size_t t = t0 + static_cast<std::size_t>(r);
    s[r][c] = t < tokens && static_cast<std::size_t>(c) < d ? widen(head[t * ld + c]) : 0.0f;
  }
}

// The max and the sum over the L lanes of a tile row (consecutive lanes of one warp).
template <int L>
__device__ __forceinline__ float lanes_max(float v) {
#pragma unroll
  for (int offset = L / 2; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
template <int L>
__device__ __forceinline__ float lanes_sum(float v) {
#pragma unroll
  for (int offset = L / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// out[j] = a . b[sub + L j] over DMAX entries (zero past d), for j < Tile::cols: a thread's
// dot products with the tile rows it holds, each a[i] loaded once for all of them.
template <class Tile>
__device__ __forceinline__ void row_dots(const float* a, const float (*b)[Tile::ld], int sub,
                                         float (&out)[Tile::cols]) {
#pragma unroll
  for (int j = 0; j < Tile::cols; ++j) out[j] = 0.0f;
#pragma unroll
  for (int i = 0; i < Tile::dmax; ++i) {
    const float x = a[i];
#pragma unroll
    for (int j = 0; j < Tile::cols; ++j) out[j] += x * b[sub + Tile::lanes * j][i];
  }
}

// Calls f(std::integral_constant<int, DMAX>{}) for the smallest DMAX of 32, 64 and 128 that holds
// head size d; a gpipe::Error naming the limit beyond 128.
template <class F>
void with_head_size(std::size_t d, F&& f) {
  if (d > flash_attention_max_head_size)
    throw Error("gpipe: CUDA flash attention takes head sizes up to " +
                std::to_string(flash_attention_max_head_size) + ", got " + std::to_string(d));
  if (d <= 32) return f(std::integral_constant<int, 32>{});
  if (d <= 64) return f(std::integral_constant<int, 64>{});
  return f(std::integral_constant<int, 128>{});
}

}  // namespace detail

/// o (rows, H d) and lse (rows, H) of the query tile blockIdx.x % tiles (heaviest first) of
/// sample blockIdx.x / tiles, query head blockIdx.y: softmax(q k^T / sqrt d) v over the keys
/// each query attends to (causal, within its document run), online over key tiles.
template <int DMAX, class T>
__global__ void __launch_bounds__(flash_attention_threads)
    flash_attention_forward_kernel(AttentionGeometry g, const T* qkv, T* o, float* lse,
                                   const std::int32_t* document) {
  using Tile = detail::FlashTile<DMAX>;
  constexpr int R = Tile::rows, L = Tile::lanes;
  __shared__ float qs[R][Tile::ld], ks[R][Tile::ld], vs[R][Tile::ld], ps[R][R + 1];
  __shared__ std::size_t first[R];  // each query row's first key
  const std::size_t tokens = g.tokens, d = g.head_size, tiles = detail::flash_tiles(tokens, R);
  const std::size_t b = blockIdx.x / tiles, h = blockIdx.y, kv = h / (g.heads / g.kv_heads);
  const std::size_t t0 = (tiles - 1 - blockIdx.x % tiles) * R;
  const T* rows = qkv + b * tokens * g.ld;
  const std::int32_t* doc = document == nullptr ? nullptr : document + b * tokens;
  const int r = static_cast<int>(threadIdx.x) / L, sub = static_cast<int>(threadIdx.x) % L;
  const std::size_t t = t0 + static_cast<std::size_t>(r);
  const float scale = 1.0f / sqrtf(static_cast<float>(d));

  detail::load_tile<Tile>(qs, rows + g.q + h * d, g.ld, t0, tokens, d);
  if (threadIdx.x < static_cast<unsigned>(R)) {
    const std::size_t row = t0 + threadIdx.x;
    first[threadIdx.x] = row < tokens ? detail::run_start(doc, row) : tokens;
  }
  __syncthreads();
  const std::size_t mine = first[r];
  float m = -INFINITY, l = 0.0f, acc[Tile::dims] = {};
  const std::size_t end = t0 + R < tokens ? t0 + R : tokens;
  for (std::size_t u0 = first[0] / R * R; u0 < end; u0 += R) {
    __syncthreads();  // the previous tile's ks, vs and ps are read
    detail::load_tile<Tile>(ks, rows + g.k + kv * d, g.ld, u0, tokens, d);
    detail::load_tile<Tile>(vs, rows + g.v + kv * d, g.ld, u0, tokens, d);
    __syncthreads();
    float s[Tile::cols], tile_max = -INFINITY;
    detail::row_dots<Tile>(qs[r], ks, sub, s);
#pragma unroll
    for (int j = 0; j < Tile::cols; ++j) {
      const std::size_t u = u0 + static_cast<std::size_t>(sub + L * j);
      const bool attends = t < tokens && u <= t && u >= mine;
      s[j] = attends ? s[j] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
    const float max = fmaxf(m, detail::lanes_max<L>(tile_max));
    const float shift = max == -INFINITY ? 0.0f : max;  // a row with no key yet keeps 0s
    const float rescale = expf(m - shift);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < Tile::cols; ++j) {
      const float p = expf(s[j] - shift);
      ps[r][sub + L * j] = p;
      sum += p;
    }
    l = l * rescale + detail::lanes_sum<L>(sum);
    m = max;
#pragma unroll
    for (int i = 0; i < Tile::dims; ++i) acc[i] *= rescale;
    __syncthreads();  // the row's other lanes' ps
    for (int c = 0; c < R; ++c) {
      const float p = ps[r][c];
#pragma unroll
      for (int i = 0; i < Tile::dims; ++i) acc[i] += p * vs[c][sub + L * i];
    }
  }
  if (t < tokens) {
    const std::size_t row = b * tokens + t;
    T* out = o + row * g.heads * d + h * d;
#pragma unroll
    for (int i = 0; i < Tile::dims; ++i) {
      const std::size_t col = static_cast<std::size_t>(sub + L * i);
      if (col < d) out[col] = detail::narrow<T>(acc[i] / l);
    }
    if (sub == 0) lse[row * g.heads + h] = m + logf(l);
  }
}

/// delta (rows, heads) = rowsum(do .* o) per head, one warp per (row, head); o and dout (rows,
/// heads d).
template <class T>
__global__ void flash_attention_backward_delta_kernel(std::size_t rows, std::size_t heads,
                                                      std::size_t d, const T* o, const T* dout,
                                                      float* delta) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t w = detail::global_thread() / 32; w < rows * heads;
       w += detail::grid_threads() / 32) {
    float sum = 0.0f;
    for (std::size_t i = lane; i < d; i += 32)
      sum += detail::widen(o[w * d + i]) * detail::widen(dout[w * d + i]);
    sum = detail::warp_sum(sum);
    if (lane == 0) delta[w] = sum;
  }
}

/// dk and dv of key tile blockIdx.x % tiles of sample blockIdx.x / tiles, key/value head
/// blockIdx.y, into dqkv (overwritten): over the group's query heads in order and the query tiles
/// from the key tile on, P = e^(S - lse), dv += P^T do, dS = P .* (do v^T - delta),
/// dk += dS^T q / sqrt d. A thread owns one key row's dimensions; its sums run in a fixed order.
template <int DMAX, class T>
__global__ void __launch_bounds__(flash_attention_threads)
    flash_attention_backward_kv_kernel(AttentionGeometry g, const T* qkv, const float* lse,
                                       const float* delta, const T* dout, T* dqkv,
                                       const std::int32_t* document) {
  using Tile = detail::FlashTile<DMAX>;
  constexpr int R = Tile::rows, L = Tile::lanes;
  __shared__ float ks[R][Tile::ld], vs[R][Tile::ld], qs[R][Tile::ld], gs[R][Tile::ld];
  __shared__ float ps[R][R + 1], dss[R][R + 1], lse_s[R], delta_s[R];
  __shared__ std::size_t first[R];
  const std::size_t tokens = g.tokens, d = g.head_size, tiles = detail::flash_tiles(tokens, R);
  const std::size_t b = blockIdx.x / tiles, kv = blockIdx.y, group = g.heads / g.kv_heads;
  const std::size_t u0 = blockIdx.x % tiles * R, hd = g.heads * d;
  const T* rows = qkv + b * tokens * g.ld;
  const T* grows = dout + b * tokens * hd;
  const std::int32_t* doc = document == nullptr ? nullptr : document + b * tokens;
  const int c = static_cast<int>(threadIdx.x) / L, sub = static_cast<int>(threadIdx.x) % L;
  const std::size_t u = u0 + static_cast<std::size_t>(c);
  const float scale = 1.0f / sqrtf(static_cast<float>(d));

  detail::load_tile<Tile>(ks, rows + g.k + kv * d, g.ld, u0, tokens, d);
  detail::load_tile<Tile>(vs, rows + g.v + kv * d, g.ld, u0, tokens, d);
  float dk[Tile::dims] = {}, dv[Tile::dims] = {};
  for (std::size_t h = kv * group; h < (kv + 1) * group; ++h) {
    for (std::size_t t0 = u0; t0 < tokens; t0 += R) {
      __syncthreads();  // the previous tile's qs, gs, ps and dss are read
      detail::load_tile<Tile>(qs, rows + g.q + h * d, g.ld, t0, tokens, d);
      detail::load_tile<Tile>(gs, grows + h * d, hd, t0, tokens, d);
      if (threadIdx.x < static_cast<unsigned>(R)) {
        const std::size_t t = t0 + threadIdx.x, row = b * tokens + t;
        lse_s[threadIdx.x] = t < tokens ? lse[row * g.heads + h] : 0.0f;
        delta_s[threadIdx.x] = t < tokens ? delta[row * g.heads + h] : 0.0f;
        first[threadIdx.x] = t < tokens ? detail::run_start(doc, t) : tokens;
      }
      __syncthreads();
      // first keys only grow down a sample: no query from here on attends to this key tile
      if (first[0] >= u0 + R) break;
      float s[Tile::cols], dp[Tile::cols];
      detail::row_dots<Tile>(ks[c], qs, sub, s);
      detail::row_dots<Tile>(vs[c], gs, sub, dp);
#pragma unroll
      for (int j = 0; j < Tile::cols; ++j) {
        const int r = sub + L * j;
        const std::size_t t = t0 + static_cast<std::size_t>(r);
        const bool attends = t < tokens && u <= t && u >= first[r];
        const float p = attends ? expf(s[j] * scale - lse_s[r]) : 0.0f;
        ps[r][c] = p;
        dss[r][c] = p * (dp[j] - delta_s[r]);
      }
      __syncthreads();
      for (int r = 0; r < R; ++r) {
        const float p = ps[r][c], ds = dss[r][c];
#pragma unroll
        for (int i = 0; i < Tile::dims; ++i) {
          dv[i] += p * gs[r][sub + L * i];
          dk[i] += ds * qs[r][sub + L * i];
        }
      }
    }
  }
  if (u < tokens) {
    T* drow = dqkv + (b * tokens + u) * g.ld;
#pragma unroll
    for (int i = 0; i < Tile::dims; ++i) {
      const std::size_t col = static_cast<std::size_t>(sub + L * i);
      if (col >= d) continue;
      drow[g.k + kv * d + col] = detail::narrow<T>(dk[i] * scale);
      drow[g.v + kv * d + col] = detail::narrow<T>(dv[i]);
    }
  }
}

/// dq of query tile blockIdx.x % tiles (heaviest first) of sample blockIdx.x / tiles, query head
/// blockIdx.y, into dqkv (overwritten): over its key tiles, P = e^(S - lse),
/// dS = P .* (do v^T - delta), dq += dS k / sqrt d. A thread owns one query row's dimensions.
template <int DMAX, class T>
__global__ void __launch_bounds__(flash_attention_threads)
    flash_attention_backward_q_kernel(AttentionGeometry g, const T* qkv, const float* lse,
                                      const float* delta, const T* dout, T* dqkv,
                                      const std::int32_t* document) {
  using Tile = detail::FlashTile<DMAX>;
  constexpr int R = Tile::rows, L = Tile::lanes;
  __shared__ float qs[R][Tile::ld], gs[R][Tile::ld], ks[R][Tile::ld], vs[R][Tile::ld];
  __shared__ float dss[R][R + 1], lse_s[R], delta_s[R];
  __shared__ std::size_t first[R];
  const std::size_t tokens = g.tokens, d = g.head_size, tiles = detail::flash_tiles(tokens, R);
  const std::size_t b = blockIdx.x / tiles, h = blockIdx.y, kv = h / (g.heads / g.kv_heads);
  const std::size_t t0 = (tiles - 1 - blockIdx.x % tiles) * R, hd = g.heads * d;
  const T* rows = qkv + b * tokens * g.ld;
  const std::int32_t* doc = document == nullptr ? nullptr : document + b * tokens;
  const int r = static_cast<int>(threadIdx.x) / L, sub = static_cast<int>(threadIdx.x) % L;
  const std::size_t t = t0 + static_cast<std::size_t>(r);
  const float scale = 1.0f / sqrtf(static_cast<float>(d));

  detail::load_tile<Tile>(qs, rows + g.q + h * d, g.ld, t0, tokens, d);
  detail::load_tile<Tile>(gs, dout + b * tokens * hd + h * d, hd, t0, tokens, d);
  if (threadIdx.x < static_cast<unsigned>(R)) {
    const std::size_t row_t = t0 + threadIdx.x, row = b * tokens + row_t;
    lse_s[threadIdx.x] = row_t < tokens ? lse[row * g.heads + h] : 0.0f;
    delta_s[threadIdx.x] = row_t < tokens ? delta[row * g.heads + h] : 0.0f;
    first[threadIdx.x] = row_t < tokens ? detail::run_start(doc, row_t) : tokens;
  }
  __syncthreads();
  const std::size_t mine = first[r];
  float dq[Tile::dims] = {};
  const std::size_t end = t0 + R < tokens ? t0 + R : tokens;
  for (std::size_t u0 = first[0] / R * R; u0 < end; u0 += R) {
    __syncthreads();  // the previous tile's ks and dss are read
    detail::load_tile<Tile>(ks, rows + g.k + kv * d, g.ld, u0, tokens, d);
    detail::load_tile<Tile>(vs, rows + g.v + kv * d, g.ld, u0, tokens, d);
    __syncthreads();
    float s[Tile::cols], dp[Tile::cols];
    detail::row_dots<Tile>(qs[r], ks, sub, s);
    detail::row_dots<Tile>(gs[r], vs, sub, dp);
#pragma unroll
    for (int j = 0; j < Tile::cols; ++j) {
      const int c = sub + L * j;
      const std::size_t u = u0 + static_cast<std::size_t>(c);
      const bool attends = t < tokens && u <= t && u >= mine;
      const float p = attends ? expf(s[j] * scale - lse_s[r]) : 0.0f;
      dss[r][c] = p * (dp[j] - delta_s[r]);
    }
    __syncthreads();
    for (int c = 0; c < R; ++c) {
      const float ds = dss[r][c];
#pragma unroll
      for (int i = 0; i < Tile::dims; ++i) dq[i] += ds * ks[c][sub + L * i];
    }
  }
  if (t < tokens) {
    T* drow = dqkv + (b * tokens + t) * g.ld + g.q + h * d;
#pragma unroll
    for (int i = 0; i < Tile::dims; ++i) {
      const std::size_t col = static_cast<std::size_t>(sub + L * i);
      if (col < d) drow[col] = detail::narrow<T>(dq[i] * scale);
    }
  }
}

namespace detail {
// The launch record of a flash-attention kernel on g: `products` (T, T) x d products per query
// head over the causal pairs (t, u <= t; a document mask skips more, not counted); the arrays
// read and written counted as q heads (rows, H d: q, o, do, dq), k or v heads (rows, KVH d) and
// (rows, H) floats (lse, delta). Tiles read again count once. `tensor_cores`: the mma kernels.
struct AttentionTraffic {
  int q, kv, floats;
};
template <class T>
void record_attention(std::string_view kernel, const AttentionGeometry& g, double products,
                      AttentionTraffic read, AttentionTraffic written, cudaStream_t stream,
                      bool tensor_cores = false) {
  const std::size_t rows = g.rows();
  const double pairs = static_cast<double>(g.samples) * static_cast<double>(g.tokens) *
                       static_cast<double>(g.tokens + 1) / 2;
  auto bytes = [&](AttentionTraffic a) {
    return a.q * bytes_of<T>(rows * g.heads * g.head_size) +
           a.kv * bytes_of<T>(rows * g.kv_heads * g.head_size) +
           a.floats * bytes_of<float>(rows * g.heads);
  };
  record_launch({.kernel = kernel,
                 .shape = {rows, g.heads, g.head_size},
                 .flops = 2 * products * pairs * static_cast<double>(g.heads * g.head_size),
                 .bytes_read = bytes(read),
                 .bytes_written = bytes(written),
                 .tensor_cores = tensor_cores,
                 .stream = stream});
}
}  // namespace detail

/// o (rows, H d) and lse (rows, H) of the attention over g's qkv (rows, g.ld), both overwritten,
/// on `stream`; document (rows) or null (CausalAttentionOp's contract). T is float or bf16. A
/// head size above flash_attention_max_head_size is a gpipe::Error.
template <class T>
void flash_attention_forward(const AttentionGeometry& g, const T* qkv, T* o, float* lse,
                             const std::int32_t* document, cudaStream_t stream) {
  g.check();
  if (g.rows() == 0) return;
  const bool mma = std::is_same_v<T, bf16> && detail::mma_takes(g.head_size);
  // S = Q K^T and O = P V: two products; reads q, k, v; writes o and lse
  detail::record_attention<T>(
      mma ? "flash_attention_forward_mma_kernel" : "flash_attention_forward_kernel", g, 2,
      {1, 2, 0}, {1, 0, 1}, stream, mma);
  if constexpr (std::is_same_v<T, bf16>) {
    if (mma) {
      const bool packed = detail::mma_packed(g, qkv, nullptr);
      detail::with_mma_head_size(g.head_size, [&](auto dmax) {
        constexpr auto kernel = &flash_attention_forward_mma_kernel<decltype(dmax)::value>;
        GPIPE_CUDA_LAUNCH(
            kernel, detail::flash_grid(g, detail::MmaTile<decltype(dmax)::value>::rows, g.heads),
            flash_attention_threads, stream)
        (g, qkv, o, lse, document, packed);
      });
      GPIPE_CUDA_CHECK_LAUNCH("flash_attention_forward_mma_kernel");
      return;
    }
  }
  detail::with_head_size(g.head_size, [&](auto dmax) {
    constexpr int D = decltype(dmax)::value;
    constexpr auto kernel = &flash_attention_forward_kernel<D, T>;
    GPIPE_CUDA_LAUNCH(kernel, detail::flash_grid(g, detail::FlashTile<D>::rows, g.heads),
                      flash_attention_threads, stream)
    (g, qkv, o, lse, document);
  });
  GPIPE_CUDA_CHECK_LAUNCH("flash_attention_forward_kernel");
}

/// flash_attention_backward's dk, dv and dq kernels on the tensor cores, delta computed (bf16,
/// head sizes that detail::mma_takes).
GPIPE_CUDA_INLINE void flash_attention_backward_mma(const AttentionGeometry& g, const bf16* qkv,
                                                    const float* lse, const bf16* dout, bf16* dqkv,
                                                    const float* delta,
                                                    const std::int32_t* document,
                                                    cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void flash_attention_backward_mma(const AttentionGeometry& g, const bf16* qkv,
                                                    const float* lse, const bf16* dout, bf16* dqkv,
                                                    const float* delta,
                                                    const std::int32_t* document,
                                                    cudaStream_t stream) {
  const bool packed = detail::mma_packed(g, qkv, dout);
  detail::with_mma_head_size(g.head_size, [&](auto dmax) {
    constexpr int D = decltype(dmax)::value;
    constexpr int rows = detail::MmaTile<D>::rows;
    constexpr auto kv_kernel = &flash_attention_backward_kv_mma_kernel<D>;
    GPIPE_CUDA_LAUNCH(kv_kernel, detail::flash_grid(g, rows, g.kv_heads), flash_attention_threads,
                      stream)
    (g, qkv, lse, delta, dout, dqkv, document, packed);
    GPIPE_CUDA_CHECK_LAUNCH("flash_attention_backward_kv_mma_kernel");
    constexpr auto q_kernel = &flash_attention_backward_q_mma_kernel<D>;
    GPIPE_CUDA_LAUNCH(q_kernel, detail::flash_grid(g, rows, g.heads), flash_attention_threads,
                      stream)
    (g, qkv, lse, delta, dout, dqkv, document, packed);
    GPIPE_CUDA_CHECK_LAUNCH("flash_attention_backward_q_mma_kernel");
  });
}
#endif

/// The q, k and v heads of dqkv (rows, g.ld), overwritten, from the forward's qkv, o and lse
/// and dout (rows, H d), on `stream`; delta (rows, H) is scratch; document (rows) or null.
/// Deterministic: the same bits every run.
template <class T>
void flash_attention_backward(const AttentionGeometry& g, const T* qkv, const T* o,
                              const float* lse, const T* dout, T* dqkv, float* delta,
                              const std::int32_t* document, cudaStream_t stream) {
  g.check();
  if (g.rows() == 0) return;
  const std::size_t warps = g.rows() * g.heads;
  // delta = rowsum(do o); the K/V kernel recomputes S and dP and forms dV and dK (4 products),
  // the Q kernel recomputes S and dP and forms dQ (3)
  detail::record_attention<T>("flash_attention_backward_delta_kernel", g, 0, {2, 0, 0}, {0, 0, 1},
                              stream);
  const bool mma = std::is_same_v<T, bf16> && detail::mma_takes(g.head_size);
  detail::record_attention<T>(
      mma ? "flash_attention_backward_kv_mma_kernel" : "flash_attention_backward_kv_kernel", g, 4,
      {2, 2, 2}, {0, 2, 0}, stream, mma);
  detail::record_attention<T>(
      mma ? "flash_attention_backward_q_mma_kernel" : "flash_attention_backward_q_kernel", g, 3,
      {2, 2, 2}, {1, 0, 0}, stream, mma);
  GPIPE_CUDA_LAUNCH(flash_attention_backward_delta_kernel<T>,
                    detail::grid_for(warps, detail::block_size / 32), detail::block_size, stream)
  (g.rows(), g.heads, g.head_size, o, dout, delta);
  GPIPE_CUDA_CHECK_LAUNCH("flash_attention_backward_delta_kernel");
  if constexpr (std::is_same_v<T, bf16>) {
    if (mma) {
      flash_attention_backward_mma(g, qkv, lse, dout, dqkv, delta, document, stream);
      return;
    }
  }
  detail::with_head_size(g.head_size, [&](auto dmax) {
    constexpr int D = decltype(dmax)::value;
    constexpr auto kv_kernel = &flash_attention_backward_kv_kernel<D, T>;
    GPIPE_CUDA_LAUNCH(kv_kernel, detail::flash_grid(g, detail::FlashTile<D>::rows, g.kv_heads),
                      flash_attention_threads, stream)
    (g, qkv, lse, delta, dout, dqkv, document);
    GPIPE_CUDA_CHECK_LAUNCH("flash_attention_backward_kv_kernel");
    constexpr auto q_kernel = &flash_attention_backward_q_kernel<D, T>;
    GPIPE_CUDA_LAUNCH(q_kernel, detail::flash_grid(g, detail::FlashTile<D>::rows, g.heads),
                      flash_attention_threads, stream)
    (g, qkv, lse, delta, dout, dqkv, document);
    GPIPE_CUDA_CHECK_LAUNCH("flash_attention_backward_q_kernel");
  });
}

}  // namespace gpipe::cuda
