#pragma once
// The causal attention core on the CUDA backend on cuBLAS strided-batched GEMMs, the
// probabilities in the context's scratch (kept only while a call runs; the stash holds the
// log-sum-exp):
//   forward, per sample, batched over heads: S = scale q k^T into the scratch (row length H T),
//     then a causal softmax that also writes each row's log-sum-exp, one warp per row, then
//     o = P v;
//   backward: S again, P = e^(S - lse); per head, batched over samples: dP = do v^T into the
//     (samples, T, T) scratch and dv = P^T do, then dS = P .* (dP - rowsum(dP .* P)) one warp per
//     row, then dq = scale dS k and dk = scale dS^T q.
// The (T, T) products are computed whole and the masked part set to 0, as on the host.
// Deterministic: cuBLAS gives the same bits on the same GPU, and each row's sums run in a fixed
// order (per lane, then a fixed shuffle tree).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/attention.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/kernels/gemm.cuh"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe::cuda {

/// Warps per block of the attention softmax kernels, one row of P each (256 threads a block).
inline constexpr int attention_warps_per_block = 8;

/// One warp per row r < rows of P, rows `tokens` long; the row's query position is (r / heads) %
/// tokens (P is (samples, T, H, T)). Entries u <= t become the softmax of the row's entries
/// u <= t, entries above become 0.
__global__ void attention_causal_softmax_kernel(std::size_t rows, std::size_t tokens,
                                                std::size_t heads, float* probs, float* lse) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = detail::global_thread() / 32; r < rows; r += detail::grid_threads() / 32) {
    const std::size_t t = r / heads % tokens;
    float* p = probs + r * tokens;
    float max = -INFINITY;
    for (std::size_t u = lane; u <= t; u += 32) max = fmaxf(max, p[u]);
    max = detail::warp_max(max);
    float sum = 0.0f;
    for (std::size_t u = lane; u <= t; u += 32) sum += p[u] = expf(p[u] - max);
    sum = detail::warp_sum(sum);
    const float inv = 1.0f / sum;
    for (std::size_t u = lane; u < tokens; u += 32) p[u] = u <= t ? p[u] * inv : 0.0f;
    if (lane == 0) lse[r] = max + logf(sum);
  }
}

/// One warp per row r < rows of P as attention_causal_softmax_kernel's, holding the scaled
/// scores: entries u <= t become e^(S - lse[r]) (the forward's probabilities), entries above 0.
__global__ void attention_probabilities_kernel(std::size_t rows, std::size_t tokens,
                                               std::size_t heads, const float* lse, float* probs) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = detail::global_thread() / 32; r < rows; r += detail::grid_threads() / 32) {
    const std::size_t t = r / heads % tokens;
    float* p = probs + r * tokens;
    for (std::size_t u = lane; u < tokens; u += 32) p[u] = u <= t ? expf(p[u] - lse[r]) : 0.0f;
  }
}

/// Head h, one warp per row (b, t) of the scratch ds (samples T, T) holding dP: entries u <= t
/// become P (dP - sum_u' dP P), entries above 0. P's row is probs + (b T + t) H T + h T.
__global__ void attention_softmax_backward_kernel(std::size_t rows, std::size_t tokens,
                                                  std::size_t heads, std::size_t h,
                                                  const float* probs, float* ds) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = detail::global_thread() / 32; r < rows; r += detail::grid_threads() / 32) {
    const std::size_t t = r % tokens;
    const float* p = probs + r * heads * tokens + h * tokens;
    float* g = ds + r * tokens;
    float dot = 0.0f;
    for (std::size_t u = lane; u <= t; u += 32) dot += g[u] * p[u];
    dot = detail::warp_sum(dot);
    for (std::size_t u = lane; u < tokens; u += 32) g[u] = u <= t ? p[u] * (g[u] - dot) : 0.0f;
  }
}

}  // namespace gpipe::cuda

namespace gpipe {

/// The causal attention core on the CUDA backend: cuBLAS strided-batched GEMMs and a warp-per-row
/// causal softmax, in float, with the host's layout (see the top of this file). GPT-2's packing
/// only (kv_heads = heads, q, k, v the thirds of a row), no documents; the probabilities live in
/// the context's scratch (samples T, H T), recomputed in backward from the log-sum-exp.
template <>
struct LayerKernels<CausalAttentionOp, cuda::KernelContext<float>> {
  /// qkv (samples T, 3 H d) -> o (samples T, H d) and lse (samples T, H), both overwritten.
  static void forward(cuda::KernelContext<float>& k, const AttentionGeometry& g, const float* qkv,
                      float* o, float* lse, const std::int32_t* document = nullptr) {
    check(g, document);
    if (g.samples == 0) return;
    float* probs = k.scratch(g.rows() * g.heads * g.tokens);
    scores(k, g, qkv, probs);
    const std::size_t tokens = g.tokens, heads = g.heads, d = g.head_size, D = heads * d;
    const std::size_t ld_qkv = 3 * D, ld_p = heads * tokens, rows = g.rows() * heads;
    GPIPE_CUDA_LAUNCH(cuda::attention_causal_softmax_kernel,
                      cuda::detail::grid_for(rows, cuda::attention_warps_per_block),
                      32 * cuda::attention_warps_per_block, k.stream())
    (rows, tokens, heads, probs, lse);
    GPIPE_CUDA_CHECK_LAUNCH("attention_causal_softmax_kernel");
    for (std::size_t b = 0; b < g.samples; ++b) {
      // o_h (T, d) = P_h v_h
      cuda::gemm_strided_batched(k.blas(), false, false, tokens, d, tokens, 1.0f,
                                 {probs + b * tokens * ld_p, ld_p, tokens},
                                 {qkv + b * tokens * ld_qkv + 2 * D, ld_qkv, d}, 0.0f,
                                 o + b * tokens * D, D, d, heads);
    }
  }

  /// dqkv (samples T, 3 H d), overwritten, from qkv, the forward's lse and dout (samples T, H d);
  /// o and delta are not used.
  static void backward(cuda::KernelContext<float>& k, const AttentionGeometry& g, const float* qkv,
                       const float*, const float* lse, const float* dout, float* dqkv, float*,
                       const std::int32_t* document = nullptr) {
    check(g, document);
    if (g.samples == 0) return;
    const std::size_t tokens = g.tokens, heads = g.heads, d = g.head_size, samples = g.samples;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens;
    const std::size_t qkv_stride = tokens * ld_qkv, tt = tokens * tokens, rows = samples * tokens;
    float* probs = k.scratch(rows * ld_p + rows * tokens);
    float* scratch = probs + rows * ld_p;
    scores(k, g, qkv, probs);
    GPIPE_CUDA_LAUNCH(cuda::attention_probabilities_kernel,
                      cuda::detail::grid_for(rows * heads, cuda::attention_warps_per_block),
                      32 * cuda::attention_warps_per_block, k.stream())
    (rows * heads, tokens, heads, lse, probs);
    GPIPE_CUDA_CHECK_LAUNCH("attention_probabilities_kernel");
    for (std::size_t h = 0; h < heads; ++h) {
      const float* q = qkv + h * d;
      const float* kh = q + D;
      const float* v = q + 2 * D;
      float* dq = dqkv + h * d;
      float* dk = dq + D;
      float* dv = dq + 2 * D;
      const cuda::BatchedOperand p{probs + h * tokens, ld_p, tokens * ld_p};
      const cuda::BatchedOperand go{dout + h * d, D, tokens * D};
      // dP (T, T) = do_h v_h^T;  dv_h = P^T do_h
      cuda::gemm_strided_batched(k.blas(), false, true, tokens, tokens, d, 1.0f, go,
                                 {v, ld_qkv, qkv_stride}, 0.0f, scratch, tokens, tt, samples);
      cuda::gemm_strided_batched(k.blas(), true, false, tokens, d, tokens, 1.0f, p, go, 0.0f, dv,
                                 ld_qkv, qkv_stride, samples);
      GPIPE_CUDA_LAUNCH(cuda::attention_softmax_backward_kernel,
                        cuda::detail::grid_for(rows, cuda::attention_warps_per_block),
                        32 * cuda::attention_warps_per_block, k.stream())
      (rows, tokens, heads, h, probs, scratch);
      GPIPE_CUDA_CHECK_LAUNCH("attention_softmax_backward_kernel");
      // dq_h = scale dS k_h;  dk_h = scale dS^T q_h
      const cuda::BatchedOperand ds{scratch, tokens, tt};
      cuda::gemm_strided_batched(k.blas(), false, false, tokens, d, tokens, scale, ds,
                                 {kh, ld_qkv, qkv_stride}, 0.0f, dq, ld_qkv, qkv_stride, samples);
      cuda::gemm_strided_batched(k.blas(), true, false, tokens, d, tokens, scale, ds,
                                 {q, ld_qkv, qkv_stride}, 0.0f, dk, ld_qkv, qkv_stride, samples);
    }
  }

 private:
  static void check(const AttentionGeometry& g, const std::int32_t* document) {
    g.check();
    const AttentionGeometry packed =
        AttentionGeometry::packed(g.samples, g.tokens, g.heads, g.head_size);
    gpipe::detail::require(g.kv_heads == g.heads && g.ld == packed.ld && g.q == packed.q &&
                               g.k == packed.k && g.v == packed.v && document == nullptr,
                           "CUDA attention runs GPT-2's packing of q, k and v, no documents");
  }
  // probs (samples T, H T) = per head, scale q k^T
  static void scores(cuda::KernelContext<float>& k, const AttentionGeometry& g, const float* qkv,
                     float* probs) {
    const std::size_t tokens = g.tokens, heads = g.heads, d = g.head_size, D = heads * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const std::size_t ld_qkv = 3 * D, ld_p = heads * tokens;
    for (std::size_t b = 0; b < g.samples; ++b) {
      const float* q = qkv + b * tokens * ld_qkv;
      float* p = probs + b * tokens * ld_p;
      cuda::gemm_strided_batched(k.blas(), false, true, tokens, tokens, d, scale, {q, ld_qkv, d},
                                 {q + D, ld_qkv, d}, 0.0f, p, ld_p, tokens, heads);
    }
  }
};

/// The causal attention core on bf16 activations (gpipe::MixedBf16): qkv (and in backward the
/// output gradient) widened to float into the context's wide() scratch, the float kernels above
/// run there, and the results rounded once; lse is float.
template <>
struct LayerKernels<CausalAttentionOp, cuda::KernelContext<bf16>> {
  /// The float kernels the widened operands run through.
  using Fp32 = LayerKernels<CausalAttentionOp, cuda::KernelContext<float>>;

  /// As the float forward: o rounded to bf16.
  static void forward(cuda::KernelContext<bf16>& k, const AttentionGeometry& g, const bf16* qkv,
                      bf16* o, float* lse, const std::int32_t* document = nullptr) {
    if (g.samples == 0) return;
    const std::size_t rows = g.rows(), D = g.heads * g.head_size;
    const std::size_t nq = k.padded(rows * g.ld);
    float* q = k.wide(nq + k.padded(rows * D));
    float* out = q + nq;
    k.convert(rows * g.ld, qkv, q);
    Fp32::forward(k.fp32(), g, q, out, lse, document);
    k.convert(rows * D, out, o);
  }

  /// As the float backward; dqkv rounded to bf16.
  static void backward(cuda::KernelContext<bf16>& k, const AttentionGeometry& g, const bf16* qkv,
                       const bf16*, const float* lse, const bf16* dout, bf16* dqkv, float* delta,
                       const std::int32_t* document = nullptr) {
    if (g.samples == 0) return;
    const std::size_t rows = g.rows(), D = g.heads * g.head_size;
    const std::size_t nq = k.padded(rows * g.ld), nd = k.padded(rows * D);
    float* q = k.wide(2 * nq + nd);
    float* go = q + nq;
    float* dq = go + nd;
    k.convert(rows * g.ld, qkv, q);
    k.convert(rows * D, dout, go);
    Fp32::backward(k.fp32(), g, q, nullptr, lse, go, dq, delta, document);
    k.convert(rows * g.ld, dq, dqkv);
  }
};

}  // namespace gpipe
