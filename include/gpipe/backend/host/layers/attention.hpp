#pragma once
// The causal attention core on the host: flash attention per (sample, head), the blocked
// algorithm of kernels/attention.hpp on strided views of qkv, so that memory beyond the
// operands is a few tiles per thread whatever T. With a team (host::KernelContext's in_blocks)
// the forward cuts its (sample, query head) pairs into blocks, the backward its (sample,
// key/value head) pairs (each owns its dk and dv, summed over its query heads in order), one block
// per thread, each pair computed as on one thread: the same bits for every team.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/attention.hpp"
#include "gpipe/backend/host/kernels/bf16.hpp"
#include "gpipe/backend/host/kernels/gemm.hpp"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {
namespace detail {

// How a team cuts `units` heads' work (forward: (sample, head) pairs; backward: (sample,
// key/value head) pairs, `per_unit` query heads each) into blocks: by the GEMMs' rule
// (host::gemm_split_min_work multiply-adds a block at least), a head costing T^2 d per product
// it runs (half of T T d products: causal) over 2 products forward and 5 backward.
inline host::BlockSplit attention_split(std::size_t threads, const AttentionGeometry& g,
                                        std::size_t units, std::size_t products) {
  return host::block_split(units, products * g.tokens * g.tokens * g.head_size / 2, threads, 1,
                           host::gemm_split_min_work);
}

// Sample b's key starts (host::document_starts) into `start` when there are documents; the
// mask's start array for host::AttentionHead (null without documents).
inline const std::size_t* sample_starts(const std::int32_t* document, std::size_t b,
                                        std::size_t tokens, std::vector<std::size_t>& start) {
  if (document == nullptr) return nullptr;
  host::document_starts(document + b * tokens, tokens, start);
  return start.data();
}

// Query head h of one sample's packed rows `row` (q, k, v at the geometry's columns, its key/value
// head g.kv_head(h)), keys masked from `starts` (null: causal only).
template <class T>
host::AttentionHead<T> packed_head(const AttentionGeometry& g, const T* row, std::size_t h,
                                   const std::size_t* starts) {
  const std::size_t d = g.head_size, kv = g.kv_head(h);
  return {row + g.q + h * d,
          row + g.k + kv * d,
          row + g.v + kv * d,
          g.ld,
          g.ld,
          g.ld,
          g.tokens,
          d,
          starts};
}

}  // namespace detail

/// The causal attention core on float or double activations (see the top of this file and
/// CausalAttentionOp's contract).
template <class T>
struct LayerKernels<CausalAttentionOp, host::KernelContext<T>> {
  /// qkv (rows, g.ld) -> o (rows, H d) and lse (rows, H), both overwritten.
  static void forward(host::KernelContext<T>& ctx, const AttentionGeometry& g, const T* qkv, T* o,
                      T* lse, const std::int32_t* document = nullptr) {
    g.check();
    const std::size_t H = g.heads, d = g.head_size, tokens = g.tokens, pairs = g.samples * H;
    const host::BlockSplit split = detail::attention_split(ctx.threads(), g, pairs, 2);
    ctx.in_blocks(pairs, split, [&](std::size_t first, std::size_t count) {
      std::vector<T> scratch(host::attention_forward_scratch);
      std::vector<std::size_t> start;
      for (std::size_t pair = first; pair < first + count; ++pair) {
        const std::size_t b = pair / H, h = pair % H;
        const T* row = qkv + b * tokens * g.ld;
        const host::AttentionHead<T> head =
            detail::packed_head(g, row, h, detail::sample_starts(document, b, tokens, start));
        host::attention_forward_head(head, o + b * tokens * H * d + h * d, H * d,
                                     lse + b * tokens * H + h, H, scratch.data());
      }
    });
  }

  /// dqkv's q, k and v heads (rows, g.ld), overwritten, from the forward's qkv, o and lse and
  /// dout (rows, H d); delta (rows, H) is scratch.
  static void backward(host::KernelContext<T>& ctx, const AttentionGeometry& g, const T* qkv,
                       const T* o, const T* lse, const T* dout, T* dqkv, T* delta,
                       const std::int32_t* document = nullptr) {
    g.check();
    const std::size_t H = g.heads, d = g.head_size, tokens = g.tokens, hd = H * d;
    // delta = rowsum(do .* o) per head
    ctx.in_blocks(g.rows(), hd, [&](std::size_t first, std::size_t count) {
      for (std::size_t r = first; r < first + count; ++r)
        for (std::size_t h = 0; h < H; ++h) {
          const T* a = dout + r * hd + h * d;
          const T* b = o + r * hd + h * d;
          T sum = 0;
          for (std::size_t i = 0; i < d; ++i) sum += a[i] * b[i];
          delta[r * H + h] = sum;
        }
    });
    const std::size_t units = g.samples * g.kv_heads;
    const host::BlockSplit split = detail::attention_split(ctx.threads(), g, units, 5 * g.group());
    ctx.in_blocks(units, split, [&](std::size_t first, std::size_t count) {
      std::vector<T> scratch(host::attention_backward_scratch);
      std::vector<std::size_t> start;
      for (std::size_t unit = first; unit < first + count; ++unit) {
        const std::size_t b = unit / g.kv_heads, kv = unit % g.kv_heads;
        const T* row = qkv + b * tokens * g.ld;
        T* drow = dqkv + b * tokens * g.ld;
        T* dk = drow + g.k + kv * d;
        T* dv = drow + g.v + kv * d;
        for (std::size_t t = 0; t < tokens; ++t) {
          std::fill_n(dk + t * g.ld, d, T(0));
          std::fill_n(dv + t * g.ld, d, T(0));
        }
        const std::size_t* starts = detail::sample_starts(document, b, tokens, start);
        for (std::size_t h = kv * g.group(); h < (kv + 1) * g.group(); ++h) {
          const host::AttentionHead<T> head = detail::packed_head(g, row, h, starts);
          const std::size_t first_row = b * tokens;
          host::attention_backward_head(head, lse + first_row * H + h, H, delta + first_row * H + h,
                                        H, dout + first_row * hd + h * d, hd, drow + g.q + h * d,
                                        g.ld, dk, dv, g.ld, scratch.data());
        }
      }
    });
  }
};

/// The causal attention core on bf16 activations: each head's q, k, v (and in backward o's
/// delta, do) widened to float, the float algorithm run on them, results rounded once; lse and
/// delta are float. The widened operands are (T, d) per head, in each block's float scratch
/// (KernelContext<bf16>::block_scratch), never a (T, T).
template <>
struct LayerKernels<CausalAttentionOp, host::KernelContext<bf16>> {
  /// As the float forward; o rounded to bf16, lse float.
  static void forward(host::KernelContext<bf16>& ctx, const AttentionGeometry& g, const bf16* qkv,
                      bf16* o, float* lse, const std::int32_t* document = nullptr) {
    g.check();
    const std::size_t H = g.heads, d = g.head_size, tokens = g.tokens, pairs = g.samples * H;
    const std::size_t td = tokens * d;
    const host::BlockSplit split = detail::attention_split(ctx.threads(), g, pairs, 2);
    ctx.in_blocks(pairs, split, [&](std::size_t first, std::size_t count) {
      // q, k, v, o (T, d) dense, then the tile scratch
      float* q = ctx.block_scratch(first / split.block, 4 * td + host::attention_forward_scratch);
      float *k = q + td, *v = k + td, *out = v + td, *tile = out + td;
      std::vector<std::size_t> start;
      std::size_t widened = static_cast<std::size_t>(-1);  // the (sample, kv head) in k and v
      for (std::size_t pair = first; pair < first + count; ++pair) {
        const std::size_t b = pair / H, h = pair % H, kv = g.kv_head(h);
        const bf16* row = qkv + b * tokens * g.ld;
        widen(tokens, d, row + g.q + h * d, g.ld, q);
        if (widened != b * g.kv_heads + kv) {
          widen(tokens, d, row + g.k + kv * d, g.ld, k);
          widen(tokens, d, row + g.v + kv * d, g.ld, v);
          widened = b * g.kv_heads + kv;
        }
        const host::AttentionHead<float> head{
            q, k, v, d, d, d, tokens, d, detail::sample_starts(document, b, tokens, start)};
        host::attention_forward_head(head, out, d, lse + b * tokens * H + h, H, tile);
        for (std::size_t t = 0; t < tokens; ++t)
          host::to_bf16(d, out + t * d, o + (b * tokens + t) * H * d + h * d);
      }
    });
  }

  /// As the float backward; dqkv's heads rounded to bf16, delta float.
  static void backward(host::KernelContext<bf16>& ctx, const AttentionGeometry& g, const bf16* qkv,
                       const bf16* o, const float* lse, const bf16* dout, bf16* dqkv, float* delta,
                       const std::int32_t* document = nullptr) {
    g.check();
    const std::size_t H = g.heads, d = g.head_size, tokens = g.tokens, hd = H * d, td = tokens * d;
    ctx.in_blocks(g.rows(), hd, [&](std::size_t first, std::size_t count) {
      for (std::size_t r = first; r < first + count; ++r)
        for (std::size_t h = 0; h < H; ++h) {
          const bf16* a = dout + r * hd + h * d;
          const bf16* b = o + r * hd + h * d;
          float sum = 0;
          for (std::size_t i = 0; i < d; ++i) sum += float(a[i]) * float(b[i]);
          delta[r * H + h] = sum;
        }
    });
    const std::size_t units = g.samples * g.kv_heads;
    const host::BlockSplit split = detail::attention_split(ctx.threads(), g, units, 5 * g.group());
    ctx.in_blocks(units, split, [&](std::size_t first, std::size_t count) {
      // q, k, v, do, dq, dk, dv (T, d) dense, then the tile scratch
      float* q = ctx.block_scratch(first / split.block, 7 * td + host::attention_backward_scratch);
      float *k = q + td, *v = k + td, *go = v + td, *dq = go + td, *dk = dq + td, *dv = dk + td,
            *tile = dv + td;
      std::vector<std::size_t> start;
      for (std::size_t unit = first; unit < first + count; ++unit) {
        const std::size_t b = unit / g.kv_heads, kv = unit % g.kv_heads;
        const bf16* row = qkv + b * tokens * g.ld;
        bf16* drow = dqkv + b * tokens * g.ld;
        widen(tokens, d, row + g.k + kv * d, g.ld, k);
        widen(tokens, d, row + g.v + kv * d, g.ld, v);
        std::fill_n(dk, td, 0.0f);
        std::fill_n(dv, td, 0.0f);
        const std::size_t* starts = detail::sample_starts(document, b, tokens, start);
        const std::size_t first_row = b * tokens;
        for (std::size_t h = kv * g.group(); h < (kv + 1) * g.group(); ++h) {
          widen(tokens, d, row + g.q + h * d, g.ld, q);
          widen(tokens, d, dout + first_row * hd + h * d, hd, go);
          const host::AttentionHead<float> head{q, k, v, d, d, d, tokens, d, starts};
          host::attention_backward_head(head, lse + first_row * H + h, H, delta + first_row * H + h,
                                        H, go, d, dq, d, dk, dv, d, tile);
          narrow(tokens, d, dq, drow + g.q + h * d, g.ld);
        }
        narrow(tokens, d, dk, drow + g.k + kv * d, g.ld);
        narrow(tokens, d, dv, drow + g.v + kv * d, g.ld);
      }
    });
  }

 private:
  /// dst (rows, d) dense = src (rows, d), rows ld apart, widened.
  static void widen(std::size_t rows, std::size_t d, const bf16* src, std::size_t ld, float* dst) {
    for (std::size_t r = 0; r < rows; ++r) host::from_bf16(d, src + r * ld, dst + r * d);
  }
  /// dst (rows, d), rows ld apart, = src (rows, d) dense, rounded.
  static void narrow(std::size_t rows, std::size_t d, const float* src, bf16* dst, std::size_t ld) {
    for (std::size_t r = 0; r < rows; ++r) host::to_bf16(d, src + r * d, dst + r * ld);
  }
};

}  // namespace gpipe
