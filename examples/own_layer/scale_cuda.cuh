#pragma once
// Scale's kernels on the CUDA backend, for a .cu file: launched on the device's stream
// (k.stream()) with GPIPE_CUDA_LAUNCH (= kernel<<<grid, block, 0, stream>>>, which also runs on
// the project's CUDA emulator), every launch checked. W gives each feature one thread that walks
// the rows in order: no atomics, the same sums in the same order on every run.

#include <cstddef>
#include <gpipe/cuda.cuh>

#include "scale.hpp"

// y(rows, n) = x(rows, n) * w(n), one thread per element (grid-stride)
__global__ void scale_forward_kernel(std::size_t rows, std::size_t n, const float* x,
                                     const float* w, float* y) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < rows * n; i += stride)
    y[i] = x[i] * w[i % n];
}

// dw(n) += sum over rows of dy(rows, n) * x(rows, n), one thread per feature
__global__ void scale_backward_weight_kernel(std::size_t rows, std::size_t n, const float* x,
                                             const float* dy, float* dw) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += stride) {
    float sum = 0;
    for (std::size_t r = 0; r < rows; ++r) sum += dy[r * n + j] * x[r * n + j];
    dw[j] += sum;
  }
}

namespace gpipe {

template <>
struct LayerKernels<ScaleOp, cuda::Kernels> {
  static constexpr unsigned block = 256;

  static void forward(cuda::Kernels& k, std::size_t rows, std::size_t n, const float* x,
                      const float* w, float* y) {
    if (rows * n == 0) return;
    GPIPE_CUDA_LAUNCH(scale_forward_kernel, blocks_for(rows * n), block, k.stream())
    (rows, n, x, w, y);
    GPIPE_CUDA_CHECK_LAUNCH("scale_forward_kernel");
  }
  static void backward_weight(cuda::Kernels& k, std::size_t rows, std::size_t n, const float* x,
                              const float* dy, float* dw) {
    if (n == 0) return;
    GPIPE_CUDA_LAUNCH(scale_backward_weight_kernel, blocks_for(n), block, k.stream())
    (rows, n, x, dy, dw);
    GPIPE_CUDA_CHECK_LAUNCH("scale_backward_weight_kernel");
  }

 private:
  static unsigned blocks_for(std::size_t items) {
    const std::size_t blocks = (items + block - 1) / block;
    return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  }
};

}  // namespace gpipe
