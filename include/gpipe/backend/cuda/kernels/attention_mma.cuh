#pragma once
// Flash attention on the tensor cores (the bf16 mma of mma.cuh): attention.cuh's algorithm for
// bf16 storage and head sizes that are multiples of 16 up to flash_attention_mma_max_head_size,
// padded with zeros to DMAX = 64 or 128. Products take bf16 operands and accumulate in float:
//   forward_mma_kernel       S = Q K^T, O += P V
//   backward_kv_mma_kernel   S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q
//   backward_q_mma_kernel    S = Q K^T, dP = dO V^T, dQ += dS K
// P and dS are rounded to bf16 as operands (the SIMT kernels keep them in float); the softmax's
// max and sum, lse, delta and every accumulator stay float, and exponentials run in base 2 on
// scores scaled by log2(e) / sqrt(d) (lse is stored in base e, as the SIMT kernels store it).
//
// A block is 4 warps; a warp owns 16 rows of the block's 64 (queries, or keys in the dk/dv
// kernel), so a row of its accumulators lives in the 4 lanes of a group (mma.cuh), where xor
// shuffles by 1 and 2 give the row's max and sum. A warp's own rows of q and do (forward, dq)
// stay in registers as A fragments, loaded from global memory once; the dk/dv kernel keeps its
// k and v tile in shared memory. The tiles that stream by go through shared memory as bf16,
// row-major, rows padded by 8 elements so that the 8 rows of each ldmatrix phase hit 8 different
// groups of banks, loaded by cp.async into two buffers (one for the dk/dv kernel at DMAX 128,
// for want of shared memory), the next tile while the current one computes; a product that
// needs a tile with k along its rows (V in P V, Q and dO in the dk/dv kernel, K in dQ) loads its
// fragments transposed (ldmatrix .trans). The mask (causal, document runs, the sample's end) is
// applied only to tiles that a warp's rows see partly.
// Every accumulator's sum runs in a fixed order: deterministic, no atomics.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/attention_mma.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels/async_copy.cuh"
#include "gpipe/backend/cuda/kernels/attention_common.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/kernels/mma.cuh"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::cuda {

/// The largest head size that the tensor-core flash attention kernels take (bf16, a multiple of
/// 16); the SIMT kernels take the others.
inline constexpr std::size_t flash_attention_mma_max_head_size = 128;

namespace detail {

// MmaTile<DMAX>: the tiling of the tensor-core kernels for head sizes up to DMAX.
template <int DMAX>
struct MmaTile {
  static constexpr int rows = 64;                       // a block's own rows, 16 a warp
  static constexpr int keys = DMAX <= 64 ? 64 : 32;     // the forward's streamed key tile
  static constexpr int queries = DMAX <= 64 ? 32 : 16;  // the dk/dv kernel's query tile
  static constexpr int backward_keys = 32;              // the dq kernel's key tile
  static constexpr int kv_stages = DMAX <= 64 ? 2 : 1;  // the dk/dv kernel's query buffers
  static constexpr int ksteps = DMAX / 16;  // k-steps of a product over the head dimensions
  static constexpr int dtiles = DMAX / 8;   // n-tiles of an accumulator over them
  static constexpr int ld = DMAX + 8;       // a shared row over the head dimensions, padded
  static_assert(DMAX % 16 == 0 && rows == 16 * flash_attention_threads / 32);
};

inline constexpr float log2e = 1.4426950408889634f;

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// a[k] (k < KS) = the A fragment of rows [t0, t0 + 16) and columns [16 k, 16 k + 16) of a head
// (columns at `head`, rows `ld` apart) in global memory, 0 past `tokens` rows and d columns (d
// even). Any alignment: each bf16 is loaded alone.
template <int KS>
__device__ __forceinline__ void load_a_rows(std::uint32_t (&a)[KS][4], const bf16* head,
                                            std::size_t ld, std::size_t t0, std::size_t tokens,
                                            std::size_t d) {
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, q = 2 * (lane % 4);
#pragma unroll
  for (int k = 0; k < KS; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::size_t t = t0 + static_cast<std::size_t>(g + 8 * (i % 2));
      const std::size_t c = static_cast<std::size_t>(16 * k + q + 8 * (i / 2));
      const bf16* p = head + t * ld + c;
      a[k][i] = t < tokens && c < d ? static_cast<std::uint32_t>(p[0].bits) |
                                          (static_cast<std::uint32_t>(p[1].bits) << 16)
                                    : 0u;
    }
}

// s (ROWS, LD) <- rows [t0, t0 + ROWS) of a head (d columns at `head`, rows `ld` apart), DMAX
// columns, 0 past `tokens` rows and past d (a multiple of 8). `packed` (head and ld allow 16-byte
// loads): by cp.async, landing at the wait that covers the caller's next commit; else by plain
// loads and stores. All threads of the block call it; the tile is everyone's after that wait
// and a __syncthreads.
template <int ROWS, int DMAX, int LD>
__device__ __forceinline__ void load_tile_mma(bf16* s, const bf16* head, std::size_t ld,
                                              std::size_t t0, std::size_t tokens, std::size_t d,
                                              bool packed) {
  constexpr int chunks = DMAX / 8;
  for (int i = static_cast<int>(threadIdx.x); i < ROWS * chunks; i += flash_attention_threads) {
    const int r = i / chunks, c = i % chunks * 8;
    const std::size_t t = t0 + static_cast<std::size_t>(r);
    const bool inside = t < tokens && static_cast<std::size_t>(c) < d;
    if (packed) {
      cp_async_16(s + r * LD + c, inside ? head + t * ld + c : head, inside);
      continue;
    }
    Pack<bf16, 8> v;
#pragma unroll
    for (int j = 0; j < 8; ++j) v.v[j].bits = inside ? head[t * ld + c + j].bits : 0;
    store_pack<8>(s + r * LD + c, v);
  }
}

// Runs a pipeline of Stages (1 or 2) buffers over `tiles` tiles: load(i, buffer) issues tile
// i's loads into buffer i % Stages (load_tile_mma), compute(i, buffer) uses them once every
// thread's loads landed; with 2 stages, tile i + 1 loads while tile i computes. All threads of
// the block call it.
template <int Stages, class Load, class Compute>
__device__ __forceinline__ void pipeline(std::size_t tiles, Load&& load, Compute&& compute) {
  static_assert(Stages == 1 || Stages == 2);
  for (std::size_t i = 0; i < tiles; ++i) {
    const int buffer = static_cast<int>(i % Stages);
    if (Stages == 1 || i == 0) {
      load(i, buffer);
      cp_async_commit();
    }
    if (Stages == 2 && i + 1 < tiles) {
      load(i + 1, 1 - buffer);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile i landed for every thread
    compute(i, buffer);
    __syncthreads();  // tile i is read: its buffer may take the next
  }
}

// The end of the run of equal ids that holds token x (the first token after it); `tokens`
// without documents.
__device__ __forceinline__ std::size_t run_end(const std::int32_t* doc, std::size_t x,
                                               std::size_t tokens) {
  if (doc == nullptr) return tokens;
  const std::int32_t id = doc[x];
  while (x + 1 < tokens && doc[x + 1] == id) ++x;
  return x + 1;
}

// s[n] = a b_n over KS k-steps for n < N (even): a warp's 16 rows (A fragments a) times rows
// [8 n, 8 n + 8) of bt (a (rows, k) tile in shared memory, rows LD apart) transposed.
template <int N, int KS, int LD>
__device__ __forceinline__ void mma_rows(float (&s)[N][4], const std::uint32_t (&a)[KS][4],
                                         const bf16* bt) {
  static_assert(N % 2 == 0);
#pragma unroll
  for (int n = 0; n < N; n += 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = 0.0f, s[n + 1][i] = 0.0f;
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      std::uint32_t b0[2], b1[2];
      load_b_pair<LD>(b0, b1, bt, 8 * n, 16 * k);
      mma_16x8x16(s[n], a[k], b0, s[n]);
      mma_16x8x16(s[n + 1], a[k], b1, s[n + 1]);
    }
  }
}

// mma_rows with a warp's A fragments loaded as it goes from rows [r0, r0 + 16) of as (a (rows,
// k) tile in shared memory, rows LD apart).
template <int N, int KS, int LD>
__device__ __forceinline__ void mma_shared_rows(float (&s)[N][4], const bf16* as, int r0,
                                                const bf16* bt) {
  std::uint32_t a[KS][4];
#pragma unroll
  for (int k = 0; k < KS; ++k) load_a<LD>(a[k], as, r0, 16 * k);
  mma_rows<N, KS, LD>(s, a, bt);
}

// acc[n] += p b_n for n < N (even): p (16 rows by 16 KSTEPS columns, accumulator fragments of
// 2 KSTEPS n-tiles, rounded to bf16 as A fragments) times columns [8 n, 8 n + 8) of b (a
// (16 KSTEPS, N * 8) tile in shared memory, rows LD apart).
template <int N, int KSTEPS, int LD>
__device__ __forceinline__ void mma_accumulate(float (&acc)[N][4], const float (&p)[2 * KSTEPS][4],
                                               const bf16* b) {
  static_assert(N % 2 == 0);
#pragma unroll
  for (int j = 0; j < KSTEPS; ++j) {
    const std::uint32_t a[4] = {
        pack_bf16(p[2 * j][0], p[2 * j][1]), pack_bf16(p[2 * j][2], p[2 * j][3]),
        pack_bf16(p[2 * j + 1][0], p[2 * j + 1][1]), pack_bf16(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      std::uint32_t b0[2], b1[2];
      load_b_pair_transposed<LD>(b0, b1, b, 16 * j, 8 * n);
      mma_16x8x16(acc[n], a, b0, acc[n]);
      mma_16x8x16(acc[n + 1], a, b1, acc[n + 1]);
    }
  }
}

// A lane's two rows of a warp's 16 (g and g + 8 of its group): each row's token, first key and,
// in the backward, lse (base 2) and delta.
struct LaneRows {
  std::size_t t[2], first[2];
  std::size_t last_first;  // the first key of the warp's last row (the largest of its rows')
  float lse[2], delta[2];
};

// Whether a key tile [u0, u0 + keys) needs the mask for a warp's 16 queries: unless every key
// precedes (or is) every query and follows every query's document start.
__device__ __forceinline__ bool needs_mask(const LaneRows& rows, std::size_t w0, std::size_t u0,
                                           int keys) {
  return u0 + static_cast<std::size_t>(keys) > w0 + 1 || u0 < rows.last_first;
}

// f(std::true_type{}) where `masked`, else f(std::false_type{}): a step compiled twice, so that
// the tiles away from the diagonal and document starts run without the mask.
template <class F>
__device__ __forceinline__ void masked_or_not(bool masked, F&& f) {
  if (masked) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Whether key u enters row r's softmax: causal, inside the row's document run, a real token.
__device__ __forceinline__ bool attends(const LaneRows& rows, int r, std::size_t u,
                                        std::size_t tokens) {
  return rows.t[r] < tokens && u <= rows.t[r] && u >= rows.first[r];
}

// One key tile [u0, u0 + C) of the forward for a warp's 16 queries: s = q k^T masked and
// scaled, the online softmax's max m, this lane's part of the sum l, acc rescaled, acc += p v
// (ks, vs: (C, LD) tiles in shared memory).
template <bool Masked, int C, int KS, int DT, int LD>
__device__ __forceinline__ void forward_mma_step(float (&acc)[DT][4], float (&m)[2], float (&l)[2],
                                                 const std::uint32_t (&qf)[KS][4], const bf16* ks,
                                                 const bf16* vs, const LaneRows& rows,
                                                 std::size_t u0, std::size_t tokens, float scale) {
  float s[C / 8][4];
  mma_rows<C / 8, KS, LD>(s, qf, ks);
  const int q = 2 * static_cast<int>(threadIdx.x % 4);
  float row_max[2] = {-INFINITY, -INFINITY}, shift[2];
#pragma unroll
  for (int n = 0; n < C / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::size_t u = u0 + static_cast<std::size_t>(8 * n + q + i % 2);
      s[n][i] = !Masked || attends(rows, i / 2, u, tokens) ? s[n][i] * scale : -INFINITY;
      row_max[i / 2] = fmaxf(row_max[i / 2], s[n][i]);
    }
#pragma unroll
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float next = fmaxf(m[r], quad_max(row_max[r]));
    shift[r] = next == -INFINITY ? 0.0f : next;  // a row with no key yet keeps 0s
    const float rescale = exp2f(m[r] - shift[r]);
    m[r] = next;
    l[r] *= rescale;
#pragma unroll
    for (int n = 0; n < DT; ++n) acc[n][2 * r] *= rescale, acc[n][2 * r + 1] *= rescale;
  }
#pragma unroll
  for (int n = 0; n < C / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[n][i] = exp2f(s[n][i] - shift[i / 2]);
      l[i / 2] += s[n][i];
    }
  mma_accumulate<DT, C / 16, LD>(acc, s, vs);
}

// One query tile [t0, t0 + R) of the dk/dv kernel for a warp's 16 keys [w0, w0 + 16), rows
// [r0, r0 + 16) of the key tile's ks and vs: P^T = e^(K Q^T scale - lse),
// dS^T = P^T .* (V dO^T - delta), dv += P^T dO, dk += dS^T Q, from qs, gs (tiles (R, LD), as ks
// and vs, in shared memory); lse (base 2), delta and the first keys of the tile's rows in shared
// memory.
template <bool Masked, int R, int KS, int DT, int LD>
__device__ __forceinline__ void backward_kv_mma_step(
    float (&dk)[DT][4], float (&dv)[DT][4], const bf16* ks, const bf16* vs, int r0, const bf16* qs,
    const bf16* gs, const float* lse, const float* delta, const std::size_t* first, std::size_t t0,
    std::size_t w0, std::size_t tokens, float scale) {
  float p[R / 8][4], ds[R / 8][4];
  mma_shared_rows<R / 8, KS, LD>(p, ks, r0, qs);
  mma_shared_rows<R / 8, KS, LD>(ds, vs, r0, gs);
  const int g = static_cast<int>(threadIdx.x % 32 / 4), q = 2 * static_cast<int>(threadIdx.x % 4);
#pragma unroll
  for (int n = 0; n < R / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 8 * n + q + i % 2;  // the query's row in the tile
      const std::size_t u = w0 + static_cast<std::size_t>(g + 8 * (i / 2)),
                        t = t0 + static_cast<std::size_t>(r);
      const bool in = !Masked || (t < tokens && u <= t && u >= first[r]);
      p[n][i] = in ? exp2f(p[n][i] * scale - lse[r]) : 0.0f;
      ds[n][i] = p[n][i] * (ds[n][i] - delta[r]);
    }
  mma_accumulate<DT, R / 16, LD>(dv, p, gs);
  mma_accumulate<DT, R / 16, LD>(dk, ds, qs);
}

// One key tile [u0, u0 + C) of the dq kernel for a warp's 16 queries (A fragments qf, gf of q
// and do): P = e^(Q K^T scale - lse), dS = P .* (dO V^T - delta), dq += dS K, from ks, vs (C, LD)
// tiles in shared memory.
template <bool Masked, int C, int KS, int DT, int LD>
__device__ __forceinline__ void backward_q_mma_step(float (&dq)[DT][4],
                                                    const std::uint32_t (&qf)[KS][4],
                                                    const std::uint32_t (&gf)[KS][4],
                                                    const bf16* ks, const bf16* vs,
                                                    const LaneRows& rows, std::size_t u0,
                                                    std::size_t tokens, float scale) {
  float p[C / 8][4], ds[C / 8][4];
  mma_rows<C / 8, KS, LD>(p, qf, ks);
  mma_rows<C / 8, KS, LD>(ds, gf, vs);
  const int q = 2 * static_cast<int>(threadIdx.x % 4);
#pragma unroll
  for (int n = 0; n < C / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = i / 2;
      const std::size_t u = u0 + static_cast<std::size_t>(8 * n + q + i % 2);
      const bool in = !Masked || attends(rows, r, u, tokens);
      const float e = in ? exp2f(p[n][i] * scale - rows.lse[r]) : 0.0f;
      ds[n][i] = e * (ds[n][i] - rows.delta[r]);
    }
  mma_accumulate<DT, C / 16, LD>(dq, ds, ks);
}

// out[8 n + 2 q + j] of row r (r < 2) of a lane's accumulators acc times `factor`, rounded to
// bf16, for columns below d.
template <int DT>
__device__ __forceinline__ void store_row(bf16* out, const float (&acc)[DT][4], int r, float factor,
                                          std::size_t d) {
  const int q = 2 * static_cast<int>(threadIdx.x % 4);
#pragma unroll
  for (int n = 0; n < DT; ++n) {
    const std::size_t c = static_cast<std::size_t>(8 * n + q);
    if (c >= d) continue;
    out[c] = narrow<bf16>(acc[n][2 * r] * factor);
    out[c + 1] = narrow<bf16>(acc[n][2 * r + 1] * factor);
  }
}

// For the calling thread's row t0 + threadIdx.x of sample b, query head h: its lse (in base 2),
// delta and first key into the arrays (zeros and `tokens` past the sample's tokens).
__device__ __forceinline__ void load_row_statistics(float* lse_s, float* delta_s,
                                                    std::size_t* first, const AttentionGeometry& g,
                                                    std::size_t b, std::size_t h, std::size_t t0,
                                                    const float* lse, const float* delta,
                                                    const std::int32_t* doc) {
  const std::size_t i = threadIdx.x, t = t0 + i, row = (b * g.tokens + t) * g.heads + h;
  lse_s[i] = t < g.tokens ? lse[row] * log2e : 0.0f;
  delta_s[i] = t < g.tokens ? delta[row] : 0.0f;
  first[i] = t < g.tokens ? run_start(doc, t) : g.tokens;
}

// The lane's two rows of dk (times scale) and dv, of the 16 keys from w0, into a sample's rows
// of dqkv (rows, g.ld), at key/value head kv.
template <int DT>
__device__ __forceinline__ void store_kv_rows(bf16* dqkv, const AttentionGeometry& g,
                                              std::size_t kv, std::size_t w0,
                                              const float (&dk)[DT][4], const float (&dv)[DT][4],
                                              float scale) {
  const std::size_t d = g.head_size;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::size_t u = w0 + threadIdx.x % 32 / 4 + 8 * static_cast<std::size_t>(r);
    if (u >= g.tokens) continue;
    store_row(dqkv + u * g.ld + g.k + kv * d, dk, r, scale, d);
    store_row(dqkv + u * g.ld + g.v + kv * d, dv, r, 1.0f, d);
  }
}

// The lane's two rows of the 16 starting at w0, in the sample whose ids are doc (or null).
__device__ __forceinline__ LaneRows lane_rows(std::size_t w0, std::size_t tokens,
                                              const std::int32_t* doc) {
  LaneRows rows{};
  const std::size_t g = threadIdx.x % 32 / 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows.t[r] = w0 + g + 8 * static_cast<std::size_t>(r);
    rows.first[r] = rows.t[r] < tokens ? run_start(doc, rows.t[r]) : tokens;
  }
  rows.last_first = w0 < tokens ? run_start(doc, w0 + 15 < tokens ? w0 + 15 : tokens - 1) : 0;
  return rows;
}

}  // namespace detail

/// o (rows, H d) and lse (rows, H) of the query tile blockIdx.x % tiles (heaviest first) of
/// sample blockIdx.x / tiles, query head blockIdx.y, on the tensor cores (see the top of this
/// file); `packed`: qkv and g's columns allow 16-byte loads.
template <int DMAX>
__global__ void __launch_bounds__(flash_attention_threads)
    flash_attention_forward_mma_kernel(AttentionGeometry g, const bf16* qkv, bf16* o, float* lse,
                                       const std::int32_t* document, bool packed) {
  using Tile = detail::MmaTile<DMAX>;
  constexpr int R = Tile::rows, C = Tile::keys, LD = Tile::ld, DT = Tile::dtiles;
  struct alignas(16) Shared {
    bf16 k[2][C][LD], v[2][C][LD];  // two stages
    std::size_t first;              // the block's first query's first key
  };
  __shared__ Shared sh;
  const std::size_t tokens = g.tokens, d = g.head_size, tiles = detail::flash_tiles(tokens, R);
  const std::size_t b = blockIdx.x / tiles, h = blockIdx.y, kv = h / (g.heads / g.kv_heads);
  const std::size_t t0 = (tiles - 1 - blockIdx.x % tiles) * R, w0 = t0 + threadIdx.x / 32 * 16;
  const bf16* rows = qkv + b * tokens * g.ld;
  const std::int32_t* doc = document == nullptr ? nullptr : document + b * tokens;
  if (threadIdx.x == 0) sh.first = detail::run_start(doc, t0);
  const detail::LaneRows mine = detail::lane_rows(w0, tokens, doc);
  std::uint32_t qf[Tile::ksteps][4];
  detail::load_a_rows(qf, rows + g.q + h * d, g.ld, w0, tokens, d);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[DT][4] = {};
  const float scale = detail::log2e / sqrtf(static_cast<float>(d));
  __syncthreads();
  const std::size_t begin = sh.first / C * C, end = t0 + R < tokens ? t0 + R : tokens;
  detail::pipeline<2>(
      (end - begin + C - 1) / C,
      [&](std::size_t i, int buffer) {
        const std::size_t u0 = begin + i * C;
        detail::load_tile_mma<C, DMAX, LD>(&sh.k[buffer][0][0], rows + g.k + kv * d, g.ld, u0,
                                           tokens, d, packed);
        detail::load_tile_mma<C, DMAX, LD>(&sh.v[buffer][0][0], rows + g.v + kv * d, g.ld, u0,
                                           tokens, d, packed);
      },
      [&](std::size_t i, int buffer) {
        const std::size_t u0 = begin + i * C;
        if (u0 > w0 + 15 || w0 >= tokens) return;  // no key of the tile for the warp's queries
        detail::masked_or_not(detail::needs_mask(mine, w0, u0, C), [&](auto masked) {
          detail::forward_mma_step<decltype(masked)::value, C, Tile::ksteps, DT, LD>(
              acc, m, l, qf, &sh.k[buffer][0][0], &sh.v[buffer][0][0], mine, u0, tokens, scale);
        });
      });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = detail::quad_sum(l[r]);
    if (mine.t[r] >= tokens) continue;
    const std::size_t row = b * tokens + mine.t[r];
    detail::store_row(o + row * g.heads * d + h * d, acc, r, 1.0f / sum, d);
    if (threadIdx.x % 4 == 0) lse[row * g.heads + h] = (m[r] + log2f(sum)) / detail::log2e;
  }
}

/// dk and dv of key tile blockIdx.x % tiles of sample blockIdx.x / tiles, key/value head
/// blockIdx.y, into dqkv (overwritten), on the tensor cores: over the group's query heads in
/// order and the query tiles from the key tile on (see flash_attention_backward_kv_kernel).
template <int DMAX>
__global__ void __launch_bounds__(flash_attention_threads)
    flash_attention_backward_kv_mma_kernel(AttentionGeometry g, const bf16* qkv, const float* lse,
                                           const float* delta, const bf16* dout, bf16* dqkv,
                                           const std::int32_t* document, bool packed) {
  using Tile = detail::MmaTile<DMAX>;
  constexpr int C = Tile::rows, R = Tile::queries, LD = Tile::ld, DT = Tile::dtiles;
  constexpr int S = Tile::kv_stages;
  struct alignas(16) Shared {
    bf16 k[C][LD], v[C][LD], q[S][R][LD], g[S][R][LD];
    float lse[S][R], delta[S][R];
    std::size_t first[S][R];
    std::size_t end;  // no query from here on attends to a key of the tile
  };
  __shared__ Shared sh;
  const std::size_t tokens = g.tokens, d = g.head_size, tiles = detail::flash_tiles(tokens, C);
  const std::size_t b = blockIdx.x / tiles, kv = blockIdx.y, group = g.heads / g.kv_heads;
  const std::size_t u0 = blockIdx.x % tiles * C, w0 = u0 + threadIdx.x / 32 * 16, hd = g.heads * d;
  const bf16* rows = qkv + b * tokens * g.ld;
  const bf16* grows = dout + b * tokens * hd;
  const std::int32_t* doc = document == nullptr ? nullptr : document + b * tokens;
  detail::load_tile_mma<C, DMAX, LD>(&sh.k[0][0], rows + g.k + kv * d, g.ld, u0, tokens, d, packed);
  detail::load_tile_mma<C, DMAX, LD>(&sh.v[0][0], rows + g.v + kv * d, g.ld, u0, tokens, d, packed);
  if (threadIdx.x == 0)
    sh.end = detail::run_end(doc, u0 + C < tokens ? u0 + C - 1 : tokens - 1, tokens);
  float dk[DT][4] = {}, dv[DT][4] = {};
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  __syncthreads();
  // query tiles [u0, end) of each query head of the group in order
  const std::size_t per_head = (sh.end - u0 + R - 1) / R;
  const auto head = [&](std::size_t i) { return kv * group + i / per_head; };
  const auto first_query = [&](std::size_t i) { return u0 + i % per_head * R; };
  detail::pipeline<S>(
      group * per_head,
      [&](std::size_t i, int buffer) {
        const std::size_t h = head(i), t0 = first_query(i);
        detail::load_tile_mma<R, DMAX, LD>(&sh.q[buffer][0][0], rows + g.q + h * d, g.ld, t0,
                                           tokens, d, packed);
        detail::load_tile_mma<R, DMAX, LD>(&sh.g[buffer][0][0], grows + h * d, hd, t0, tokens, d,
                                           packed);
        if (threadIdx.x < static_cast<unsigned>(R))
          detail::load_row_statistics(sh.lse[buffer], sh.delta[buffer], sh.first[buffer], g, b, h,
                                      t0, lse, delta, doc);
      },
      [&](std::size_t i, int buffer) {
        const std::size_t t0 = first_query(i);
        if (w0 > t0 + R - 1 || w0 >= tokens) return;  // the warp's keys come after the queries
        // unmasked where every key precedes every query, all real, after every document start
        const bool masked = w0 + 15 > t0 || t0 + R > tokens || sh.first[buffer][R - 1] > w0;
        detail::masked_or_not(masked, [&](auto mask) {
          detail::backward_kv_mma_step<decltype(mask)::value, R, Tile::ksteps, DT, LD>(
              dk, dv, &sh.k[0][0], &sh.v[0][0], threadIdx.x / 32 * 16, &sh.q[buffer][0][0],
              &sh.g[buffer][0][0], sh.lse[buffer], sh.delta[buffer], sh.first[buffer], t0, w0,
              tokens, scale * detail::log2e);
        });
      });
  detail::store_kv_rows(dqkv + b * tokens * g.ld, g, kv, w0, dk, dv, scale);
}

/// dq of query tile blockIdx.x % tiles (heaviest first) of sample blockIdx.x / tiles, query head
/// blockIdx.y, into dqkv (overwritten), on the tensor cores: over its key tiles (see
/// flash_attention_backward_q_kernel).
template <int DMAX>
__global__ void __launch_bounds__(flash_attention_threads)
    flash_attention_backward_q_mma_kernel(AttentionGeometry g, const bf16* qkv, const float* lse,
                                          const float* delta, const bf16* dout, bf16* dqkv,
                                          const std::int32_t* document, bool packed) {
  using Tile = detail::MmaTile<DMAX>;
  constexpr int R = Tile::rows, C = Tile::backward_keys, LD = Tile::ld, DT = Tile::dtiles;
  struct alignas(16) Shared {
    bf16 k[2][C][LD], v[2][C][LD];  // two stages
    std::size_t first;              // the block's first query's first key
  };
  __shared__ Shared sh;
  const std::size_t tokens = g.tokens, d = g.head_size, tiles = detail::flash_tiles(tokens, R);
  const std::size_t b = blockIdx.x / tiles, h = blockIdx.y, kv = h / (g.heads / g.kv_heads);
  const std::size_t t0 = (tiles - 1 - blockIdx.x % tiles) * R, w0 = t0 + threadIdx.x / 32 * 16;
  const std::size_t hd = g.heads * d;
  const bf16* rows = qkv + b * tokens * g.ld;
  const std::int32_t* doc = document == nullptr ? nullptr : document + b * tokens;
  if (threadIdx.x == 0) sh.first = detail::run_start(doc, t0);
  detail::LaneRows mine = detail::lane_rows(w0, tokens, doc);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::size_t row = (b * tokens + mine.t[r]) * g.heads + h;
    mine.lse[r] = mine.t[r] < tokens ? lse[row] * detail::log2e : 0.0f;
    mine.delta[r] = mine.t[r] < tokens ? delta[row] : 0.0f;
  }
  std::uint32_t qf[Tile::ksteps][4], gf[Tile::ksteps][4];
  detail::load_a_rows(qf, rows + g.q + h * d, g.ld, w0, tokens, d);
  detail::load_a_rows(gf, dout + b * tokens * hd + h * d, hd, w0, tokens, d);
  float dq[DT][4] = {};
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  __syncthreads();
  const std::size_t begin = sh.first / C * C, end = t0 + R < tokens ? t0 + R : tokens;
  detail::pipeline<2>(
      (end - begin + C - 1) / C,
      [&](std::size_t i, int buffer) {
        const std::size_t u0 = begin + i * C;
        detail::load_tile_mma<C, DMAX, LD>(&sh.k[buffer][0][0], rows + g.k + kv * d, g.ld, u0,
                                           tokens, d, packed);
        detail::load_tile_mma<C, DMAX, LD>(&sh.v[buffer][0][0], rows + g.v + kv * d, g.ld, u0,
                                           tokens, d, packed);
      },
      [&](std::size_t i, int buffer) {
        const std::size_t u0 = begin + i * C;
        if (u0 > w0 + 15 || w0 >= tokens) return;
        detail::masked_or_not(detail::needs_mask(mine, w0, u0, C), [&](auto masked) {
          detail::backward_q_mma_step<decltype(masked)::value, C, Tile::ksteps, DT, LD>(
              dq, qf, gf, &sh.k[buffer][0][0], &sh.v[buffer][0][0], mine, u0, tokens,
              scale * detail::log2e);
        });
      });
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (mine.t[r] < tokens)
      detail::store_row(dqkv + (b * tokens + mine.t[r]) * g.ld + g.q + h * d, dq, r, scale, d);
}

namespace detail {

// Whether the tensor-core kernels take an attention of head size d (bf16 storage).
inline bool mma_takes(std::size_t d) {
  return d % 16 == 0 && d <= flash_attention_mma_max_head_size;
}

// Whether qkv and dout (or null) allow g's heads to be loaded 8 bf16 (16 bytes) at a time.
inline bool mma_packed(const AttentionGeometry& g, const bf16* qkv, const bf16* dout) {
  return aligned<8>(qkv) && (dout == nullptr || aligned<8>(dout)) && g.ld % 8 == 0 &&
         g.q % 8 == 0 && g.k % 8 == 0 && g.v % 8 == 0;
}

// Calls f(std::integral_constant<int, DMAX>{}) for DMAX 64 or 128, the smaller that holds d.
// (No DMAX 32: its kernels gain little over 64's, and ptxas spills one of them on sm_80.)
template <class F>
void with_mma_head_size(std::size_t d, F&& f) {
  if (d <= 64) return f(std::integral_constant<int, 64>{});
  return f(std::integral_constant<int, 128>{});
}

}  // namespace detail
}  // namespace gpipe::cuda
