#pragma once
// ReLU, GELU and LayerNorm on the CUDA backend: the kernels of kernels/elementwise.cuh and
// kernels/layer_norm.cuh (which the kernel conformance tests check against the host's), launched
// on the context's stream.

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

/// ReLU's kernels on the CUDA backend (kernels/elementwise.cuh), on the context's stream.
template <>
struct LayerKernels<ReluOp, cuda::Kernels> {
  /// y(n) = max(x, 0).
  static void forward(cuda::Kernels& k, std::size_t n, const float* x, float* y) {
    cuda::relu_forward(n, x, y, k.stream());
  }
  /// dx(n) = dy where x > 0, else 0; x is the forward's input.
  static void backward(cuda::Kernels& k, std::size_t n, const float* x, const float* dy,
                       float* dx) {
    cuda::relu_backward(n, x, dy, dx, k.stream());
  }
};

/// GELU's (exact, erf) kernels on the CUDA backend (kernels/elementwise.cuh), on its stream.
template <>
struct LayerKernels<GeluOp, cuda::Kernels> {
  /// y(n) = 0.5 x (1 + erf(x / sqrt 2)).
  static void forward(cuda::Kernels& k, std::size_t n, const float* x, float* y) {
    cuda::gelu_forward(n, x, y, k.stream());
  }
  /// dx(n) = dy (Phi(x) + x phi(x)), Phi and phi the standard normal CDF and density.
  static void backward(cuda::Kernels& k, std::size_t n, const float* x, const float* dy,
                       float* dx) {
    cuda::gelu_backward(n, x, dy, dx, k.stream());
  }
};

/// LayerNorm's kernels on the CUDA backend (kernels/layer_norm.cuh) on (rows, cols), on the
/// context's stream, the weight gradient's partial sums in its scratch; the forward's stats (rows,
/// 2) = (mean, rstd) kept for the two backward ops.
template <>
struct LayerKernels<LayerNormOp, cuda::Kernels> {
  /// y(rows, cols) = (x - mean) rstd gamma + beta per row, rstd = 1 / sqrt(biased variance +
  /// eps); writes stats(rows, 2).
  static void forward(cuda::Kernels& k, std::size_t rows, std::size_t cols, double eps,
                      const float* x, const float* gamma, const float* beta, float* y,
                      float* stats) {
    cuda::layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats, k.stream());
  }
  /// dx(rows, cols), overwritten, from x, dy, gamma and the forward's stats.
  static void backward_input(cuda::Kernels& k, std::size_t rows, std::size_t cols, const float* x,
                             const float* dy, const float* gamma, const float* stats, float* dx) {
    cuda::layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx, k.stream());
  }
  /// dgamma(cols) += sum over rows of dy xhat, dbeta(cols) += sum over rows of dy.
  static void backward_weight(cuda::Kernels& k, std::size_t rows, std::size_t cols, const float* x,
                              const float* dy, const float* stats, float* dgamma, float* dbeta) {
    cuda::layer_norm_backward_weight(
        rows, cols, x, dy, stats, dgamma, dbeta,
        k.scratch(cuda::layer_norm_backward_weight_scratch(rows, cols)), k.stream());
  }
};

}  // namespace gpipe
