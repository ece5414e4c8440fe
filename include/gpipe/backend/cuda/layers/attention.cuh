#pragma once
// The causal attention core on the CUDA backend: plain kernels, one thread per query row or key
// row of one head, the maths and storage of the host reference
// (gpipe/backend/host/layers/attention.hpp): the probabilities are kept per query row (row
// length H T, zero above the diagonal), and backward goes head by head through a (samples, T, T)
// scratch of dS. Deterministic: every sum runs in one thread, in key or query order.
// Not tuned: a flash-style kernel with tiles in shared memory is the next step.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/attention.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe::cuda {

// Thread (b, h, t): P(b, h, t, :) = causal softmax(q_t . k_t' scale), o(b, t, h) = P v.
__global__ void attention_forward_kernel(std::size_t samples, std::size_t tokens, std::size_t heads,
                                         std::size_t d, float scale, const float* qkv, float* probs,
                                         float* o) {
  const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens;
  for (std::size_t i = detail::global_thread(); i < samples * heads * tokens;
       i += detail::grid_threads()) {
    const std::size_t b = i / (heads * tokens), h = i / tokens % heads, t = i % tokens;
    const float* q = qkv + (b * tokens + t) * ld_qkv + h * d;
    float* p = probs + (b * tokens + t) * ld_p + h * tokens;
    float max = -INFINITY;
    for (std::size_t u = 0; u <= t; ++u) {
      const float* k = qkv + (b * tokens + u) * ld_qkv + D + h * d;
      float s = 0.0f;
      for (std::size_t j = 0; j < d; ++j) s += q[j] * k[j];
      p[u] = s * scale;
      max = fmaxf(max, p[u]);
    }
    float sum = 0.0f;
    for (std::size_t u = 0; u <= t; ++u) sum += p[u] = expf(p[u] - max);
    const float inv = 1.0f / sum;
    for (std::size_t u = 0; u <= t; ++u) p[u] *= inv;
    for (std::size_t u = t + 1; u < tokens; ++u) p[u] = 0.0f;
    float* out = o + (b * tokens + t) * D + h * d;
    for (std::size_t j = 0; j < d; ++j) {
      float acc = 0.0f;
      for (std::size_t u = 0; u <= t; ++u)
        acc += p[u] * qkv[(b * tokens + u) * ld_qkv + 2 * D + h * d + j];
      out[j] = acc;
    }
  }
}

// Head h, thread (b, t): dS(b, t, :) = P .* (dP - rowsum(dP .* P)) with dP = do_t . v_t', and
// dq_t = scale dS(b, t, :) k.
__global__ void attention_backward_query_kernel(std::size_t samples, std::size_t tokens,
                                                std::size_t heads, std::size_t d, std::size_t h,
                                                float scale, const float* qkv, const float* probs,
                                                const float* dout, float* dqkv, float* ds) {
  const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens;
  for (std::size_t i = detail::global_thread(); i < samples * tokens; i += detail::grid_threads()) {
    const std::size_t b = i / tokens, t = i % tokens;
    const float* p = probs + (b * tokens + t) * ld_p + h * tokens;
    const float* g = dout + (b * tokens + t) * D + h * d;
    float* row = ds + i * tokens;
    float dot = 0.0f;
    for (std::size_t u = 0; u <= t; ++u) {
      const float* v = qkv + (b * tokens + u) * ld_qkv + 2 * D + h * d;
      float dp = 0.0f;
      for (std::size_t j = 0; j < d; ++j) dp += g[j] * v[j];
      row[u] = dp;
      dot += dp * p[u];
    }
    for (std::size_t u = 0; u <= t; ++u) row[u] = p[u] * (row[u] - dot);
    for (std::size_t u = t + 1; u < tokens; ++u) row[u] = 0.0f;
    float* dq = dqkv + (b * tokens + t) * ld_qkv + h * d;
    for (std::size_t j = 0; j < d; ++j) {
      float acc = 0.0f;
      for (std::size_t u = 0; u <= t; ++u)
        acc += row[u] * qkv[(b * tokens + u) * ld_qkv + D + h * d + j];
      dq[j] = scale * acc;
    }
  }
}

// Head h, thread (b, t'): dk_t' = scale sum_{t >= t'} dS(b, t, t') q_t,
// dv_t' = sum_{t >= t'} P(b, h, t, t') do_t.
__global__ void attention_backward_key_kernel(std::size_t samples, std::size_t tokens,
                                              std::size_t heads, std::size_t d, std::size_t h,
                                              float scale, const float* qkv, const float* probs,
                                              const float* dout, float* dqkv, const float* ds) {
  const std::size_t D = heads * d, ld_qkv = 3 * D, ld_p = heads * tokens;
  for (std::size_t i = detail::global_thread(); i < samples * tokens; i += detail::grid_threads()) {
    const std::size_t b = i / tokens, u = i % tokens;
    float* dk = dqkv + (b * tokens + u) * ld_qkv + D + h * d;
    float* dv = dk + D;
    for (std::size_t j = 0; j < d; ++j) {
      float k_acc = 0.0f, v_acc = 0.0f;
      for (std::size_t t = u; t < tokens; ++t) {
        const std::size_t row = b * tokens + t;
        k_acc += ds[row * tokens + u] * qkv[row * ld_qkv + h * d + j];
        v_acc += probs[row * ld_p + h * tokens + u] * dout[row * D + h * d + j];
      }
      dk[j] = scale * k_acc;
      dv[j] = v_acc;
    }
  }
}

}  // namespace gpipe::cuda

namespace gpipe {

template <>
struct LayerKernels<CausalAttentionOp, cuda::Kernels> {
  static void forward(cuda::Kernels& k, std::size_t samples, std::size_t tokens, std::size_t heads,
                      std::size_t d, const float* qkv, float* probs, float* o) {
    if (samples == 0) return;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    GPIPE_CUDA_LAUNCH(cuda::attention_forward_kernel,
                      cuda::detail::grid_for(samples * heads * tokens, 128), 128, k.stream())
    (samples, tokens, heads, d, scale, qkv, probs, o);
    GPIPE_CUDA_CHECK_LAUNCH("attention_forward_kernel");
  }
  // scratch: (samples T, T) floats, as the layer's workspace (T per row) provides.
  static void backward(cuda::Kernels& k, std::size_t samples, std::size_t tokens, std::size_t heads,
                       std::size_t d, const float* qkv, const float* probs, const float* dout,
                       float* dqkv, float* scratch) {
    if (samples == 0) return;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const unsigned grid = cuda::detail::grid_for(samples * tokens, 128);
    for (std::size_t h = 0; h < heads; ++h) {
      GPIPE_CUDA_LAUNCH(cuda::attention_backward_query_kernel, grid, 128, k.stream())
      (samples, tokens, heads, d, h, scale, qkv, probs, dout, dqkv, scratch);
      GPIPE_CUDA_CHECK_LAUNCH("attention_backward_query_kernel");
      GPIPE_CUDA_LAUNCH(cuda::attention_backward_key_kernel, grid, 128, k.stream())
      (samples, tokens, heads, d, h, scale, qkv, probs, dout, dqkv, scratch);
      GPIPE_CUDA_CHECK_LAUNCH("attention_backward_key_kernel");
    }
  }
};

}  // namespace gpipe
