#pragma once
// GELUTanh on the CUDA backend: the formulas of the host reference
// (gpipe/backend/host/layers/gelu_tanh.hpp), one element per thread, 16-byte packs where aligned.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/gelu_tanh.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe::cuda {
namespace detail {
inline constexpr float gelu_tanh_a = 0.044715f;
inline constexpr float sqrt_2_over_pi = 0.79788456080286535588f;
}  // namespace detail

/// y(n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <int V, class T>
__global__ void gelu_tanh_forward_kernel(std::size_t n, const T* x, T* y) {
  detail::map<V>(
      n,
      [](float v) {
        return 0.5f * v *
               (1.0f + tanhf(detail::sqrt_2_over_pi * (v + detail::gelu_tanh_a * v * v * v)));
      },
      y, x);
}

/// dx(n) = dy (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 0.044715 x^2))
template <int V, class T>
__global__ void gelu_tanh_backward_kernel(std::size_t n, const T* x, const T* dy, T* dx) {
  detail::map<V>(
      n,
      [](float v, float g) {
        const float th = tanhf(detail::sqrt_2_over_pi * (v + detail::gelu_tanh_a * v * v * v));
        return g * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * detail::sqrt_2_over_pi *
                                             (1.0f + 3.0f * detail::gelu_tanh_a * v * v));
      },
      dx, x, dy);
}

/// y(n) = GELUTanh(x), float or bf16 (computed in float), on `stream`; y may alias x.
template <class T>
inline void gelu_tanh_forward(std::size_t n, const T* x, T* y, cudaStream_t stream) {
  detail::launch_map<gelu_tanh_forward_kernel<4, T>, gelu_tanh_forward_kernel<1, T>>(
      "gelu_tanh_forward_kernel", n, detail::aligned<4>(x, y), stream, x, y);
}
/// dx(n) = dy GELUTanh'(x), on `stream`.
template <class T>
inline void gelu_tanh_backward(std::size_t n, const T* x, const T* dy, T* dx, cudaStream_t stream) {
  detail::launch_map<gelu_tanh_backward_kernel<4, T>, gelu_tanh_backward_kernel<1, T>>(
      "gelu_tanh_backward_kernel", n, detail::aligned<4>(x, dy, dx), stream, x, dy, dx);
}

}  // namespace gpipe::cuda

namespace gpipe {

/// GELUTanh's kernels on the CUDA backend (GELU's tanh approximation), one element per thread,
/// for float or bf16 activations (bf16: widened on load, float math, rounded once on store).
template <class T>
struct LayerKernels<GeluTanhOp, cuda::KernelContext<T>> {
  /// y(n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); y may be x.
  static void forward(cuda::KernelContext<T>& k, std::size_t n, const T* x, T* y) {
    cuda::gelu_tanh_forward(n, x, y, k.stream());
  }
  /// dx(n) = dy GELUTanh'(x); x is the forward's input.
  static void backward(cuda::KernelContext<T>& k, std::size_t n, const T* x, const T* dy, T* dx) {
    cuda::gelu_tanh_backward(n, x, dy, dx, k.stream());
  }
};

}  // namespace gpipe
