#pragma once
// RMSNorm, the rotary embedding and SwiGLU's gate on the CUDA backend: the kernels of
// kernels/rms_norm.cuh and kernels/llama.cuh on the context's stream, scratch from the context.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/llama.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>
#include <cstdint>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/llama.cuh"
#include "gpipe/backend/cuda/kernels/rms_norm.cuh"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/llama.hpp"
#include "gpipe/model/rms_norm.hpp"

namespace gpipe {

/// RMSNorm's kernels on the CUDA backend, on (rows, cols) of float or bf16 activations; weight and
/// its gradient in float, rstd in stats (rows, 2) as RMSNormOp says.
template <class T>
struct LayerKernels<RMSNormOp, cuda::KernelContext<T>> {
  /// y(rows, cols) = x rstd weight, rstd = 1 / sqrt(mean(x^2) + eps) into stats; overwritten.
  static void forward(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                      const T* x, const float* weight, T* y, T* stats) {
    cuda::rms_norm_forward(rows, cols, eps, x, weight, y, stats, k.stream());
  }
  /// dx(rows, cols), overwritten, from x, dy, weight and the forward's stats.
  static void backward_input(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                             const T* x, const T* dy, const float* weight, const T* stats, T* dx) {
    cuda::rms_norm_backward_input(rows, cols, x, dy, weight, stats, dx, k.stream());
  }
  /// x = x + r (a residual's add, in place), then forward from it, in one kernel.
  static void forward_add(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                          T* x, const T* r, const float* weight, T* y, T* stats) {
    cuda::residual_rms_norm_forward(rows, cols, eps, x, r, weight, y, stats, k.stream());
  }
  /// backward_input's dx plus r (a residual's input gradient), in one kernel.
  static void backward_input_add(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                                 const T* x, const T* dy, const float* weight, const T* stats,
                                 const T* r, T* dx) {
    cuda::residual_rms_norm_backward_input(rows, cols, x, dy, weight, stats, r, dx, k.stream());
  }
  /// dweight(cols) += sum over rows of dy x rstd, in float, deterministic.
  static void backward_weight(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                              const T* x, const T* dy, const T* stats, float* dweight) {
    cuda::rms_norm_backward_weight(rows, cols, x, dy, stats, dweight,
                                   k.scratch(cuda::rms_norm_backward_weight_scratch(rows, cols)),
                                   k.stream());
  }
};

/// The rotary embedding on the CUDA backend (RopeOp's contract); with document ids, their
/// positions go through the context's scratch.
template <class T>
struct LayerKernels<RopeOp, cuda::KernelContext<T>> {
  /// x (rows, ld): its first `heads` heads rotated in place (RopeOp).
  static void rotate(cuda::KernelContext<T>& k, std::size_t rows, std::size_t tokens,
                     std::size_t heads, std::size_t head_size, std::size_t ld, double base,
                     const std::int32_t* document, T* x, bool transpose) {
    float* scratch = document == nullptr ? nullptr : k.scratch(cuda::rope_scratch(rows));
    cuda::rope(rows, tokens, heads, head_size, ld, base, document, x, transpose, scratch,
               k.stream());
  }
};

/// SwiGLU's gate on the CUDA backend (SwiGLUOp's contract), in float.
template <class T>
struct LayerKernels<SwiGLUOp, cuda::KernelContext<T>> {
  /// y(rows, F) = silu(g) u, x (rows, 2F) = [g | u].
  static void forward(cuda::KernelContext<T>& k, std::size_t rows, std::size_t F, const T* x,
                      T* y) {
    cuda::swiglu_forward(rows, F, x, y, k.stream());
  }
  /// dx(rows, 2F) = [dy u silu'(g) | dy silu(g)], overwritten.
  static void backward(cuda::KernelContext<T>& k, std::size_t rows, std::size_t F, const T* x,
                       const T* dy, T* dx) {
    cuda::swiglu_backward(rows, F, x, dy, dx, k.stream());
  }
};

}  // namespace gpipe
