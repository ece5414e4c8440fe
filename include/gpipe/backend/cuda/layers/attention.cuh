#pragma once
// The causal attention core on the CUDA backend, the algorithm of the host's
// (gpipe/backend/host/layers/attention.hpp) on cuBLAS strided-batched GEMMs:
//   forward, per sample, batched over heads: S = scale q k^T into the probabilities' rows (row
//     length H T), then a causal softmax, one warp per row, then o = P v;
//   backward, per head, batched over samples: dP = do v^T into the (samples, T, T) scratch and
//     dv = P^T do, then dS = P .* (dP - rowsum(dP .* P)) one warp per row, then dq = scale dS k
//     and dk = scale dS^T q.
// The (T, T) products are computed whole and the masked part set to 0, as on the host.
// Deterministic: cuBLAS gives the same bits on the same GPU, and each row's sums run in a fixed
// order (per lane, then a fixed shuffle tree).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/attention.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

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
                                                std::size_t heads, float* probs) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = detail::global_thread() / 32; r < rows; r += detail::grid_threads() / 32) {
    const std::size_t t = r / heads % tokens;
    float* p = probs + r * tokens;
    float max = -INFINITY;
    for (std::size_t u = lane; u <= t; u += 32) max = fmaxf(max, p[u]);
    max = detail::warp_max(max);
    float sum = 0.0f;
    for (std::size_t u = lane; u <= t; u += 32) sum += p[u] = expf(p[u] - max);
    const float inv = 1.0f / detail::warp_sum(sum);
    for (std::size_t u = lane; u < tokens; u += 32) p[u] = u <= t ? p[u] * inv : 0.0f;
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
/// causal softmax, in float, with the host's layout (see the top of this file). Rows are
/// samples x T; qkv holds q, k, v side by side, 3 H d per row, head h at column h d of each.
template <>
struct LayerKernels<CausalAttentionOp, cuda::KernelContext<float>> {
  /// qkv (samples T, 3 H d) -> probs (samples T, H T): per head the causal softmax of
  /// q k^T / sqrt(d), masked entries 0, kept for backward; and o (samples T, H d) = P v per head.
  /// Both overwritten.
  static void forward(cuda::KernelContext<float>& k, std::size_t samples, std::size_t tokens,
                      std::size_t heads, std::size_t d, const float* qkv, float* probs, float* o) {
    if (samples == 0) return;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens;
    for (std::size_t b = 0; b < samples; ++b) {
      const float* q = qkv + b * tokens * ld_qkv;
      float* p = probs + b * tokens * ld_p;
      // S_h (T, T) = scale q_h k_h^T, head h at column h d of q and k, h T of P
      cuda::gemm_strided_batched(k.blas(), false, true, tokens, tokens, d, scale, {q, ld_qkv, d},
                                 {q + D, ld_qkv, d}, 0.0f, p, ld_p, tokens, heads);
    }
    const std::size_t rows = samples * tokens * heads;
    GPIPE_CUDA_LAUNCH(cuda::attention_causal_softmax_kernel,
                      cuda::detail::grid_for(rows, cuda::attention_warps_per_block),
                      32 * cuda::attention_warps_per_block, k.stream())
    (rows, tokens, heads, probs);
    GPIPE_CUDA_CHECK_LAUNCH("attention_causal_softmax_kernel");
    for (std::size_t b = 0; b < samples; ++b) {
      // o_h (T, d) = P_h v_h
      cuda::gemm_strided_batched(k.blas(), false, false, tokens, d, tokens, 1.0f,
                                 {probs + b * tokens * ld_p, ld_p, tokens},
                                 {qkv + b * tokens * ld_qkv + 2 * D, ld_qkv, d}, 0.0f,
                                 o + b * tokens * D, D, d, heads);
    }
  }

  /// dqkv (samples T, 3 H d), overwritten, from qkv, the forward's probs and dout
  /// (samples T, H d). scratch: (samples T, T) floats, as the layer's workspace (T per row)
  /// provides; its contents are not kept.
  static void backward(cuda::KernelContext<float>& k, std::size_t samples, std::size_t tokens,
                       std::size_t heads, std::size_t d, const float* qkv, const float* probs,
                       const float* dout, float* dqkv, float* scratch) {
    if (samples == 0) return;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens;
    const std::size_t qkv_stride = tokens * ld_qkv, tt = tokens * tokens, rows = samples * tokens;
    for (std::size_t h = 0; h < heads; ++h) {
      const float* q = qkv + h * d;
      const float* kh = q + D;
      const float* v = q + 2 * D;
      float* dq = dqkv + h * d;
      float* dk = dq + D;
      float* dv = dq + 2 * D;
      const cuda::BatchedOperand p{probs + h * tokens, ld_p, tokens * ld_p};
      const cuda::BatchedOperand g{dout + h * d, D, tokens * D};
      // dP (T, T) = do_h v_h^T;  dv_h = P^T do_h
      cuda::gemm_strided_batched(k.blas(), false, true, tokens, tokens, d, 1.0f, g,
                                 {v, ld_qkv, qkv_stride}, 0.0f, scratch, tokens, tt, samples);
      cuda::gemm_strided_batched(k.blas(), true, false, tokens, d, tokens, 1.0f, p, g, 0.0f, dv,
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
};

/// The causal attention core on bf16 activations (gpipe::MixedBf16): qkv (and in backward the
/// probabilities and the output gradient) widened to float into the context's wide() scratch, the
/// float kernels above run there (scores, softmax and both products in float, as the host's bf16
/// context does), and the results rounded once: the probabilities are stored as bf16 for the
/// backward; o is P v of the float P.
template <>
struct LayerKernels<CausalAttentionOp, cuda::KernelContext<bf16>> {
  /// The float kernels the widened operands run through.
  using Fp32 = LayerKernels<CausalAttentionOp, cuda::KernelContext<float>>;

  /// As the float forward: probs (samples T, H T) and o (samples T, H d), both rounded to bf16.
  static void forward(cuda::KernelContext<bf16>& k, std::size_t samples, std::size_t tokens,
                      std::size_t heads, std::size_t d, const bf16* qkv, bf16* probs, bf16* o) {
    if (samples == 0) return;
    const std::size_t rows = samples * tokens, D = heads * d;
    const std::size_t nq = k.padded(rows * 3 * D), np = k.padded(rows * heads * tokens);
    float* q = k.wide(nq + np + k.padded(rows * D));
    float* p = q + nq;
    float* out = p + np;
    k.convert(rows * 3 * D, qkv, q);
    Fp32::forward(k.fp32(), samples, tokens, heads, d, q, p, out);
    k.convert(rows * heads * tokens, p, probs);
    k.convert(rows * D, out, o);
  }

  /// As the float backward, from the bf16 probabilities; dqkv rounded to bf16. The bf16 scratch
  /// is not used: the float (samples T, T) scratch is part of wide().
  static void backward(cuda::KernelContext<bf16>& k, std::size_t samples, std::size_t tokens,
                       std::size_t heads, std::size_t d, const bf16* qkv, const bf16* probs,
                       const bf16* dout, bf16* dqkv, bf16*) {
    if (samples == 0) return;
    const std::size_t rows = samples * tokens, D = heads * d;
    const std::size_t nq = k.padded(rows * 3 * D), np = k.padded(rows * heads * tokens),
                      nd = k.padded(rows * D);
    float* q = k.wide(2 * nq + np + nd + k.padded(rows * tokens));
    float* p = q + nq;
    float* g = p + np;
    float* dq = g + nd;
    float* scratch = dq + nq;
    k.convert(rows * 3 * D, qkv, q);
    k.convert(rows * heads * tokens, probs, p);
    k.convert(rows * D, dout, g);
    Fp32::backward(k.fp32(), samples, tokens, heads, d, q, p, g, dq, scratch);
    k.convert(rows * 3 * D, dq, dqkv);
  }
};

}  // namespace gpipe
