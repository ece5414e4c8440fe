#pragma once
// Elementwise kernels: activations, sums, fill, scale. Kernels are <op>_<dir>_kernel (plain
// <op>_kernel where an op has no direction; an activation's math is the Math argument of
// activation_<dir>_kernel), launchers <op>_<dir>(..., stream). Each reads and writes every
// element once (16-byte packs where the pointers are aligned), so each is bound by memory
// bandwidth. The host reference of each op is in gpipe/backend/host/kernels/elementwise.hpp.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/elementwise.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

namespace detail {

// Per element of an elementwise pass: floating-point operations, bytes read, bytes written (its
// launch record).
struct PerElement {
  double flops, read, written;
};

// Launches kernel<4> when every pointer allows 16-byte packs, else kernel<1>; one thread per pack.
template <auto Kernel4, auto Kernel1, class... Args>
void launch_map(const char* name, std::size_t n, bool vectorized, cudaStream_t stream,
                PerElement cost, Args... args) {
  if (n == 0) return;
  record_map(name, n, cost.flops, cost.read, cost.written, stream);
  if (vectorized) {
    GPIPE_CUDA_LAUNCH(Kernel4, grid_for(n / 4 + 1), block_size, stream)(n, args...);
  } else {
    GPIPE_CUDA_LAUNCH(Kernel1, grid_for(n), block_size, stream)(n, args...);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw_cuda_error(error, name, __FILE__, __LINE__);
}

}  // namespace detail

// An activation's math is a struct of two static device functions on one element, in float:
//   forward(x) = f(x),  backward(x, dy) = dy f'(x),
// and their floating-point operations per element, `flops` and `backward_flops` (a
// transcendental function counts as one), for the launch records (launch_log.cuh).
// activation_forward / activation_backward map them over arrays; ReluMath and GeluMath are here,
// GeluTanhMath beside its layer (layers/gelu_tanh.cuh).

/// ReLU; host reference: host::relu_forward, host::relu_backward.
struct ReluMath {
  static constexpr double flops = 1;           ///< per element forward
  static constexpr double backward_flops = 1;  ///< per element backward
  /// max(x, 0)
  __device__ __forceinline__ static float forward(float x) { return x > 0.0f ? x : 0.0f; }
  /// dy where x > 0, else 0 (the subgradient at 0 is 0)
  __device__ __forceinline__ static float backward(float x, float dy) {
    return x > 0.0f ? dy : 0.0f;
  }
};

/// Exact GELU, x Phi(x); host reference: host::gelu_forward, host::gelu_backward.
struct GeluMath {
  static constexpr float inv_sqrt2 = 0.70710678118654752440f;     ///< 1 / sqrt(2)
  static constexpr float inv_sqrt_2pi = 0.39894228040143267794f;  ///< phi(0) = 1 / sqrt(2 pi)
  static constexpr double flops = 5;                              ///< per element forward
  static constexpr double backward_flops = 12;                    ///< per element backward
  /// 0.5 x (1 + erf(x / sqrt 2))
  __device__ __forceinline__ static float forward(float x) {
    return 0.5f * x * (1.0f + erff(x * inv_sqrt2));
  }
  /// dy (Phi(x) + x phi(x))
  __device__ __forceinline__ static float backward(float x, float dy) {
    const float cdf = 0.5f * (1.0f + erff(x * inv_sqrt2));
    const float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

/// y(n) = Math::forward(x)
template <class Math, int V, class T>
__global__ void activation_forward_kernel(std::size_t n, const T* x, T* y) {
  detail::map<V>(
      n, [](float v) { return Math::forward(v); }, y, x);
}
/// y(n) = Math::forward(x(n)), float or bf16 (computed in float), on `stream`; y may alias x.
template <class Math, class T>
void activation_forward(std::size_t n, const T* x, T* y, cudaStream_t stream) {
  detail::launch_map<activation_forward_kernel<Math, 4, T>, activation_forward_kernel<Math, 1, T>>(
      "activation_forward_kernel", n, detail::aligned<4>(x, y), stream,
      {Math::flops, sizeof(T), sizeof(T)}, x, y);
}

/// dx(n) = Math::backward(x, dy)
template <class Math, int V, class T>
__global__ void activation_backward_kernel(std::size_t n, const T* x, const T* dy, T* dx) {
  detail::map<V>(
      n, [](float v, float g) { return Math::backward(v, g); }, dx, x, dy);
}
/// dx(n) = Math::backward(x(n), dy(n)), on `stream`.
template <class Math, class T>
void activation_backward(std::size_t n, const T* x, const T* dy, T* dx, cudaStream_t stream) {
  detail::launch_map<activation_backward_kernel<Math, 4, T>,
                     activation_backward_kernel<Math, 1, T>>(
      "activation_backward_kernel", n, detail::aligned<4>(x, dy, dx), stream,
      {Math::backward_flops, 2.0 * sizeof(T), sizeof(T)}, x, dy, dx);
}

/// y(n) = a + b   (y may alias a or b)
template <int V, class T>
__global__ void add_kernel(std::size_t n, const T* a, const T* b, T* y) {
  detail::map<V>(
      n, [](float u, float v) { return u + v; }, y, a, b);
}
/// y(n) = a + b, on `stream`; y may alias a or b.
template <class T>
void add(std::size_t n, const T* a, const T* b, T* y, cudaStream_t stream) {
  detail::launch_map<add_kernel<4, T>, add_kernel<1, T>>("add_kernel", n,
                                                         detail::aligned<4>(a, b, y), stream,
                                                         {1, 2.0 * sizeof(T), sizeof(T)}, a, b, y);
}

/// y(n) += x
template <int V, class T>
__global__ void accumulate_kernel(std::size_t n, const T* x, T* y) {
  detail::map<V>(
      n, [](float u, float v) { return u + v; }, y, y, x);
}
/// y(n) += x, on `stream`.
template <class T>
void accumulate(std::size_t n, const T* x, T* y, cudaStream_t stream) {
  detail::launch_map<accumulate_kernel<4, T>, accumulate_kernel<1, T>>(
      "accumulate_kernel", n, detail::aligned<4>(x, y), stream, {1, 2.0 * sizeof(T), sizeof(T)}, x,
      y);
}

/// y(n) = value
template <int V, class T>
__global__ void fill_kernel(std::size_t n, float value, T* y) {
  detail::map<V>(
      n, [value] { return value; }, y);
}
/// y(n) = value, on `stream`.
template <class T>
void fill(std::size_t n, float value, T* y, cudaStream_t stream) {
  detail::launch_map<fill_kernel<4, T>, fill_kernel<1, T>>("fill_kernel", n, detail::aligned<4>(y),
                                                           stream, {0, 0, sizeof(T)}, value, y);
}

/// y(n) *= alpha
template <int V, class T>
__global__ void scale_kernel(std::size_t n, float alpha, T* y) {
  detail::map<V>(
      n, [alpha](float v) { return alpha * v; }, y, y);
}
/// y(n) *= alpha, on `stream` (gemm's beta C when k == 0).
template <class T>
void scale(std::size_t n, float alpha, T* y, cudaStream_t stream) {
  detail::launch_map<scale_kernel<4, T>, scale_kernel<1, T>>(
      "scale_kernel", n, detail::aligned<4>(y), stream, {1, sizeof(T), sizeof(T)}, alpha, y);
}

/// y(n) = x(n) stored as Y: floats rounded to bf16 (nearest, ties to even), bf16 widened to
/// float (exact)
template <int V, class X, class Y>
__global__ void convert_kernel(std::size_t n, const X* x, Y* y) {
  detail::map<V>(
      n, [](float v) { return v; }, y, x);
}
/// y(n) = x(n) as Y (gpipe::MixedBf16's weight casts and widenings), on `stream`.
template <class X, class Y>
void convert(std::size_t n, const X* x, Y* y, cudaStream_t stream) {
  detail::launch_map<convert_kernel<4, X, Y>, convert_kernel<1, X, Y>>(
      "convert_kernel", n, detail::aligned<4>(x, y), stream, {0, sizeof(X), sizeof(Y)}, x, y);
}

/// chunk_sums[c] = the sum of squares of x's chunk c in double, in the fixed order of
/// backend/common.hpp (gpipe::detail::squares_chunk): one block of squares_lanes threads a chunk.
template <class T>
__global__ void chunk_squares_kernel(std::size_t n, const T* x, double* chunk_sums) {
  constexpr std::size_t lanes = gpipe::detail::squares_lanes;
  __shared__ double lane[lanes];
  const std::size_t j = threadIdx.x;
  const std::size_t begin = static_cast<std::size_t>(blockIdx.x) * gpipe::detail::squares_chunk;
  const std::size_t end =
      n - begin < gpipe::detail::squares_chunk ? n : begin + gpipe::detail::squares_chunk;
  double sum = 0;
  for (std::size_t i = begin + j; i < end; i += lanes) {
    const double v = x[i];
    sum += v * v;  // the square is exact in double: fused or not, one rounding
  }
  lane[j] = sum;
  __syncthreads();
  for (std::size_t half = lanes / 2; half > 0; half /= 2) {
    if (j < half) lane[j] += lane[j + half];
    __syncthreads();
  }
  if (j == 0) chunk_sums[blockIdx.x] = lane[0];
}
/// out[0] = values[0] + values[1] + ... in that order (one thread).
template <class T>
__global__ void sum_in_order_kernel(std::size_t count, const T* values, T* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  T total = 0;
  for (std::size_t i = 0; i < count; ++i) total += values[i];
  out[0] = total;
}
/// out[0] (device memory) = the sum of x(n)'s squares in double, in the fixed order of
/// backend/common.hpp; chunk_sums: scratch of (n + squares_chunk - 1) / squares_chunk doubles.
GPIPE_CUDA_INLINE void sum_of_squares(std::size_t n, const float* x, double* out,
                                      double* chunk_sums, cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void sum_of_squares(std::size_t n, const float* x, double* out,
                                      double* chunk_sums, cudaStream_t stream) {
  const std::size_t chunks = (n + gpipe::detail::squares_chunk - 1) / gpipe::detail::squares_chunk;
  detail::record_launch({.kernel = "chunk_squares_kernel",
                         .shape = {n, chunks, 0},
                         .flops = 2.0 * static_cast<double>(n),
                         .bytes_read = sizeof(float) * static_cast<double>(n),
                         .bytes_written = sizeof(double) * static_cast<double>(chunks),
                         .stream = stream});
  detail::record_launch({.kernel = "sum_in_order_kernel",
                         .shape = {chunks, 0, 0},
                         .flops = static_cast<double>(chunks),
                         .bytes_read = sizeof(double) * static_cast<double>(chunks),
                         .bytes_written = sizeof(double),
                         .stream = stream});
  if (chunks > 0) {
    GPIPE_CUDA_LAUNCH(chunk_squares_kernel<float>, static_cast<unsigned>(chunks),
                      static_cast<unsigned>(gpipe::detail::squares_lanes), stream)
    (n, x, chunk_sums);
  }
  GPIPE_CUDA_LAUNCH(sum_in_order_kernel<double>, 1, 1, stream)(chunks, chunk_sums, out);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) detail::throw_cuda_error(error, "sum_of_squares", __FILE__, __LINE__);
}
#endif

}  // namespace gpipe::cuda
