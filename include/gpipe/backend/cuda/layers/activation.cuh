#pragma once
// ReLU, GELU and LayerNorm on the CUDA backend: the kernels of kernels/elementwise.cuh and
// kernels/layer_norm.cuh (which the kernel conformance tests check against the host's), launched
// on the context's stream, each one kernel templated on the activations' type (float or bf16:
// no widened copies); detail::CudaElementwise serves every elementwise layer (GELUTanh too).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/activation.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/kernels/layer_norm.cuh"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer_norm.hpp"

namespace gpipe {

namespace detail {

// The kernels of an elementwise layer op on the CUDA backend: Math's (kernels/elementwise.cuh) on
// the context's stream, for float or bf16 activations (bf16: widened on load, float math, rounded
// once on store).
template <class Math, class T>
struct CudaElementwise {
  // y(n) = Math::forward(x); y may be x.
  static void forward(cuda::KernelContext<T>& k, std::size_t n, const T* x, T* y) {
    cuda::activation_forward<Math>(n, x, y, k.stream());
  }
  // dx(n) = Math::backward(x, dy); x is the forward's input.
  static void backward(cuda::KernelContext<T>& k, std::size_t n, const T* x, const T* dy, T* dx) {
    cuda::activation_backward<Math>(n, x, dy, dx, k.stream());
  }
};

}  // namespace detail

/// ReLU's kernels on the CUDA backend: cuda::ReluMath's.
template <class T>
struct LayerKernels<ReluOp, cuda::KernelContext<T>> : detail::CudaElementwise<cuda::ReluMath, T> {};
/// GELU's (exact, erf) kernels on the CUDA backend: cuda::GeluMath's.
template <class T>
struct LayerKernels<GeluOp, cuda::KernelContext<T>> : detail::CudaElementwise<cuda::GeluMath, T> {};

/// LayerNorm's kernels on the CUDA backend (kernels/layer_norm.cuh) on (rows, cols) of float or
/// bf16 activations, on the context's stream, the weight gradient's partial sums in its scratch.
/// The forward's stats (rows, 2) for the two backward ops are (mean, rstd) for float; for bf16
/// rstd's 32 bits in the row's two stash slots (high half first, as on the host), the mean
/// recomputed from x by the backward kernels themselves.
template <class T>
struct LayerKernels<LayerNormOp, cuda::KernelContext<T>> {
  /// y(rows, cols) = (x - mean) rstd gamma + beta per row, rstd = 1 / sqrt(biased variance +
  /// eps), stored as T; writes stats(rows, 2).
  static void forward(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                      const T* x, const float* gamma, const float* beta, T* y, T* stats) {
    cuda::layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats, k.stream());
  }
  /// dx(rows, cols), overwritten, from x, dy, gamma and the forward's stats.
  static void backward_input(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                             const T* x, const T* dy, const float* gamma, const T* stats, T* dx) {
    cuda::layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx, k.stream());
  }
  /// x = x + r (a residual's add, in place), then forward from it: one kernel where it can.
  static void forward_add(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols, double eps,
                          T* x, const T* r, const float* gamma, const float* beta, T* y, T* stats) {
    cuda::residual_layer_norm_forward(rows, cols, eps, x, r, gamma, beta, y, stats, k.stream());
  }
  /// backward_input's dx plus r (a residual's input gradient): one kernel where it can.
  static void backward_input_add(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                                 const T* x, const T* dy, const float* gamma, const T* stats,
                                 const T* r, T* dx) {
    cuda::residual_layer_norm_backward_input(rows, cols, x, dy, gamma, stats, r, dx, k.stream());
  }
  /// dgamma(cols) += sum over rows of dy xhat, dbeta(cols) += sum over rows of dy, in float.
  static void backward_weight(cuda::KernelContext<T>& k, std::size_t rows, std::size_t cols,
                              const T* x, const T* dy, const T* stats, float* dgamma,
                              float* dbeta) {
    cuda::layer_norm_backward_weight(
        rows, cols, x, dy, stats, dgamma, dbeta,
        k.scratch(cuda::layer_norm_backward_weight_scratch<T>(rows, cols)), k.stream());
  }
};

}  // namespace gpipe
