#pragma once
// ReLU, GELU and LayerNorm on the CUDA backend: the context's own kernels (kernels/elementwise.cuh,
// kernels/layer_norm.cuh, which the kernel conformance tests check against the host's).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/activation.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer_norm.hpp"

namespace gpipe {

template <>
struct LayerKernels<ReluOp, cuda::Kernels> {
  static void forward(cuda::Kernels& k, std::size_t n, const float* x, float* y) {
    k.relu_forward(n, x, y);
  }
  static void backward(cuda::Kernels& k, std::size_t n, const float* x, const float* dy,
                       float* dx) {
    k.relu_backward(n, x, dy, dx);
  }
};

template <>
struct LayerKernels<GeluOp, cuda::Kernels> {
  static void forward(cuda::Kernels& k, std::size_t n, const float* x, float* y) {
    k.gelu_forward(n, x, y);
  }
  static void backward(cuda::Kernels& k, std::size_t n, const float* x, const float* dy,
                       float* dx) {
    k.gelu_backward(n, x, dy, dx);
  }
};

template <>
struct LayerKernels<LayerNormOp, cuda::Kernels> {
  static void forward(cuda::Kernels& k, std::size_t rows, std::size_t cols, double eps,
                      const float* x, const float* gamma, const float* beta, float* y,
                      float* stats) {
    k.layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats);
  }
  static void backward_input(cuda::Kernels& k, std::size_t rows, std::size_t cols, const float* x,
                             const float* dy, const float* gamma, const float* stats, float* dx) {
    k.layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx);
  }
  static void backward_weight(cuda::Kernels& k, std::size_t rows, std::size_t cols, const float* x,
                              const float* dy, const float* stats, float* dgamma, float* dbeta) {
    k.layer_norm_backward_weight(rows, cols, x, dy, stats, dgamma, dbeta);
  }
};

}  // namespace gpipe
