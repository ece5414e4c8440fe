#pragma once
// GELUTanh on the CUDA backend: the formulas of the host reference
// (gpipe/backend/host/layers/gelu_tanh.hpp) as an activation's math (kernels/elementwise.cuh).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/gelu_tanh.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/layers/activation.cuh"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe::cuda {

/// GELU's tanh approximation, with u = c (x + a x^3); host reference:
/// LayerKernels<GeluTanhOp, host::KernelContext<T>>.
struct GeluTanhMath {
  static constexpr float a = 0.044715f;                ///< the cubic term's coefficient in u
  static constexpr float c = 0.79788456080286535588f;  ///< sqrt(2/pi)
  static constexpr double flops = 9;                   ///< per element forward
  static constexpr double backward_flops = 18;         ///< per element backward
  /// 0.5 x (1 + tanh u)
  __device__ __forceinline__ static float forward(float x) {
    return 0.5f * x * (1.0f + tanhf(c * (x + a * x * x * x)));
  }
  /// dy (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 a x^2))
  __device__ __forceinline__ static float backward(float x, float dy) {
    const float th = tanhf(c * (x + a * x * x * x));
    return dy * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * c * (1.0f + 3.0f * a * x * x));
  }
};

}  // namespace gpipe::cuda

namespace gpipe {

/// GELUTanh's kernels on the CUDA backend: cuda::GeluTanhMath's.
template <class T>
struct LayerKernels<GeluTanhOp, cuda::KernelContext<T>>
    : detail::CudaElementwise<cuda::GeluTanhMath, T> {};

}  // namespace gpipe
