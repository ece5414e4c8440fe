#pragma once
// The causal attention core on the host: per sample and head, GEMMs on strided views of qkv
// (row length 3D) and of the probabilities (row length H T), and a row-wise causal softmax.
// Each (T, T) product is computed whole; the masked upper triangle of P is stored as 0.
// With a team (host::KernelContext's in_blocks) the (sample, head) pairs are cut into blocks, one
// per thread, each pair computed as on one thread; in backward each block takes the (T, T) of the
// scratch that belongs to its number, so there are at most `samples` blocks.

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/gemm.hpp"
#include "gpipe/backend/host/kernels/simd.hpp"
#include "gpipe/backend/host/kernels/softmax.hpp"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {

/// The causal attention core on the host (see the top of this file), on rows = samples * T
/// token rows, each sample's T rows consecutive, with H heads of width d and D = H d.
template <class T>
struct LayerKernels<CausalAttentionOp, host::KernelContext<T>> {
  /// From qkv (rows, 3D), each row q, k, v of D each, head h at columns [h d, (h + 1) d) of
  /// each: probs (rows, H T) = per head, the causal softmax of q k^T / sqrt(d) (row t of a
  /// sample, head h, at columns [h T, (h + 1) T), keys after t stored as 0), and o (rows, D) =
  /// per head, P v. Both overwritten; probs is what backward needs.
  static void forward(host::KernelContext<T>& ctx, std::size_t samples, std::size_t tokens,
                      std::size_t heads, std::size_t d, const T* qkv, T* probs, T* o) {
    const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens, pairs = samples * heads;
    const T scale = T(1) / std::sqrt(static_cast<T>(d));
    ctx.in_blocks(pairs, pair_split(ctx, pairs, tokens, d), [&](std::size_t first, std::size_t n) {
      for (std::size_t pair = first; pair < first + n; ++pair) {
        const std::size_t b = pair / heads, h = pair % heads;
        const T* q = qkv + b * tokens * ld_qkv + h * d;
        const T* k = q + D;
        const T* v = q + 2 * D;
        T* p = probs + b * tokens * ld_p + h * tokens;
        // S (T, T) = scale q k^T, then P = causal softmax of each row
        host::gemm(false, true, tokens, tokens, d, scale, q, k, T(0), p, {ld_qkv, ld_qkv, ld_p});
        for (std::size_t t = 0; t < tokens; ++t) causal_softmax(p + t * ld_p, t + 1, tokens);
        // o_h (T, d) = P v_h
        host::gemm(false, false, tokens, d, tokens, T(1), p, v, T(0), o + b * tokens * D + h * d,
                   {ld_p, ld_qkv, D});
      }
    });
  }

  /// dqkv (rows, 3D), overwritten, from the forward's qkv and probs and dout (rows, D):
  /// dv = P^T dout, dS = P .* (dP - rowsum(dP .* P)) with dP = dout v^T, dq = dS k / sqrt(d),
  /// dk = dS^T q / sqrt(d). scratch is (samples T, T) workspace, a (T, T) per sample, its
  /// contents left undefined.
  static void backward(host::KernelContext<T>& ctx, std::size_t samples, std::size_t tokens,
                       std::size_t heads, std::size_t d, const T* qkv, const T* probs,
                       const T* dout, T* dqkv, T* scratch) {
    const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens, pairs = samples * heads;
    const T scale = T(1) / std::sqrt(static_cast<T>(d));
    // a block per (T, T) of the scratch at most: one per sample
    const host::BlockSplit split = pair_split(ctx, pairs, tokens, d, samples);
    ctx.in_blocks(pairs, split, [&](std::size_t first, std::size_t count) {
      T* ds = scratch + first / split.block * tokens * tokens;  // (T, T): dP, then dS in place
      for (std::size_t pair = first; pair < first + count; ++pair) {
        const std::size_t b = pair / heads, h = pair % heads;
        const std::size_t head = b * tokens * ld_qkv + h * d;
        const T* q = qkv + head;
        const T* k = q + D;
        const T* v = q + 2 * D;
        T* dq = dqkv + head;
        T* dk = dq + D;
        T* dv = dq + 2 * D;
        const T* p = probs + b * tokens * ld_p + h * tokens;
        const T* dout_h = dout + b * tokens * D + h * d;
        host::gemm(false, true, tokens, tokens, d, T(1), dout_h, v, T(0), ds, {D, ld_qkv, tokens});
        host::gemm(true, false, tokens, d, tokens, T(1), p, dout_h, T(0), dv, {ld_p, D, ld_qkv});
        for (std::size_t t = 0; t < tokens; ++t)
          softmax_backward(p + t * ld_p, ds + t * tokens, t + 1, tokens);
        host::gemm(false, false, tokens, d, tokens, scale, ds, k, T(0), dq,
                   {tokens, ld_qkv, ld_qkv});
        host::gemm(true, false, tokens, d, tokens, scale, ds, q, T(0), dk,
                   {tokens, ld_qkv, ld_qkv});
      }
    });
  }

 private:
  /// How a team cuts `pairs` (sample, head) pairs, each two (T, T, d) products (forward; backward
  /// four), into at most max_blocks blocks: by the GEMMs' rule (host::gemm_split_min_work
  /// multiply-adds a block at least).
  static host::BlockSplit pair_split(const host::KernelContext<T>& ctx, std::size_t pairs,
                                     std::size_t tokens, std::size_t d,
                                     std::size_t max_blocks = std::size_t(-1)) {
    return host::block_split(pairs, 2 * tokens * tokens * d, std::min(ctx.threads(), max_blocks), 1,
                             host::gemm_split_min_work);
  }

  /// row[0, n) <- softmax(row[0, n)), row[n, len) <- 0
  static void causal_softmax(T* row, std::size_t n, std::size_t len) {
    const T max = detail::row_max(row, n);
    const T inv = static_cast<T>(1 / detail::exp_shifted(row, max, n, row));
    host::simd::transform(
        n, [inv](auto e) { return e * inv; }, row, row);
    std::fill(row + n, row + len, T(0));
  }
  /// g[0, n) <- p .* (g - sum(g .* p)) over the unmasked keys, g[n, len) <- 0
  static void softmax_backward(const T* p, T* g, std::size_t n, std::size_t len) {
    T dot = 0;
    for (std::size_t j = 0; j < n; ++j) dot += g[j] * p[j];
    for (std::size_t j = 0; j < n; ++j) g[j] = p[j] * (g[j] - dot);
    std::fill(g + n, g + len, T(0));
  }
};

/// The causal attention core on bf16 activations: each sample's qkv (and in backward its
/// probabilities and output gradient) widened to float, the float kernels above run on it, and
/// the results rounded once: the probabilities are computed in float and stored as bf16 for the
/// backward; o is P v of the float P. Samples are split over the team, each block with its own
/// float buffers (a sample's qkv, probabilities, output and, in backward, (T, T) scratch).
template <>
struct LayerKernels<CausalAttentionOp, host::KernelContext<bf16>> {
  /// The float kernels each sample runs through.
  using Fp32 = LayerKernels<CausalAttentionOp, host::KernelContext<float>>;

  /// As the float forward: probs (rows, H T) and o (rows, D), both rounded to bf16.
  static void forward(host::KernelContext<bf16>& ctx, std::size_t samples, std::size_t tokens,
                      std::size_t heads, std::size_t d, const bf16* qkv, bf16* probs, bf16* o) {
    const std::size_t D = heads * d, per_sample = tokens * (3 * D + heads * tokens + D);
    const host::BlockSplit blocks = ctx.split(samples, 4 * tokens * tokens * D);
    ctx.in_blocks(samples, blocks, [&](std::size_t first, std::size_t count) {
      float* q = ctx.block_scratch(first / blocks.block, per_sample);
      float* p = q + tokens * 3 * D;
      float* out = p + tokens * heads * tokens;
      host::KernelContext<float> solo;
      for (std::size_t b = first; b < first + count; ++b) {
        host::from_bf16(tokens * 3 * D, qkv + b * tokens * 3 * D, q);
        Fp32::forward(solo, 1, tokens, heads, d, q, p, out);
        host::to_bf16(tokens * heads * tokens, p, probs + b * tokens * heads * tokens);
        host::to_bf16(tokens * D, out, o + b * tokens * D);
      }
    });
  }

  /// As the float backward, from the bf16 probabilities; dqkv rounded to bf16. The bf16 scratch
  /// is not used: each block widens into float buffers of its own.
  static void backward(host::KernelContext<bf16>& ctx, std::size_t samples, std::size_t tokens,
                       std::size_t heads, std::size_t d, const bf16* qkv, const bf16* probs,
                       const bf16* dout, bf16* dqkv, bf16*) {
    const std::size_t D = heads * d;
    const std::size_t per_sample = tokens * (3 * D + heads * tokens + D + 3 * D + tokens);
    const host::BlockSplit blocks = ctx.split(samples, 8 * tokens * tokens * D);
    ctx.in_blocks(samples, blocks, [&](std::size_t first, std::size_t count) {
      float* q = ctx.block_scratch(first / blocks.block, per_sample);
      float* p = q + tokens * 3 * D;
      float* g = p + tokens * heads * tokens;
      float* dq = g + tokens * D;
      float* scratch = dq + tokens * 3 * D;
      host::KernelContext<float> solo;
      for (std::size_t b = first; b < first + count; ++b) {
        host::from_bf16(tokens * 3 * D, qkv + b * tokens * 3 * D, q);
        host::from_bf16(tokens * heads * tokens, probs + b * tokens * heads * tokens, p);
        host::from_bf16(tokens * D, dout + b * tokens * D, g);
        Fp32::backward(solo, 1, tokens, heads, d, q, p, g, dq, scratch);
        host::to_bf16(tokens * 3 * D, dq, dqkv + b * tokens * 3 * D);
      }
    });
  }
};

}  // namespace gpipe
