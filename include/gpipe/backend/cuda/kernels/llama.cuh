#pragma once
// The Llama block's own kernels (gpipe/model/llama.hpp): the rotary embedding on the q and k heads
// of a qkv row, in place, and SwiGLU's gate. Activations stored as T (float or bf16: widened on
// load, rounded once on store). Host reference: gpipe/backend/host/layers/llama.hpp, whose
// contracts (RopeOp, SwiGLUOp) these follow; RoPE's angles, cosines and sines are computed in
// double as there, SwiGLU in float.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/llama.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/kernels/positions.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

namespace detail {
// s = sin(pi x), c = cos(pi x) in double: on the GPU sincospi, whose argument reduction is exact
// (sin and cos of a large radian argument would take the slow reduction, with a stack frame);
// elsewhere (the emulator) libm's on x reduced to [-1, 1] exactly.
__host__ __device__ __forceinline__ void sincos_pi(double x, double* s, double* c) {
#ifdef __CUDA_ARCH__
  sincospi(x, s, c);
#else
  const double r = x - 2.0 * std::nearbyint(x / 2);
  constexpr double pi = 3.14159265358979323846;
  *s = std::sin(pi * r);
  *c = std::cos(pi * r);
#endif
}
}  // namespace detail

/// x (rows, ld)'s first `heads` heads of head_size (even) rotated in place (RopeOp), a thread per
/// (row, frequency), its angle's cos and sin shared by the row's heads; position (rows) or, where
/// null, row % tokens. `sign` -1 rotates back.
template <class T>
__global__ void rope_kernel(std::size_t rows, std::size_t tokens, std::size_t heads,
                            std::size_t head_size, std::size_t ld, double base,
                            const std::uint32_t* position, T* x, double sign) {
  const std::size_t half = head_size / 2;
  for (std::size_t i = detail::global_thread(); i < rows * half; i += detail::grid_threads()) {
    const std::size_t r = i / half, f = i % half;
    const double p = static_cast<double>(position == nullptr ? r % tokens : position[r]);
    // angle / pi, the argument of sincos_pi
    constexpr double inv_pi = 0.318309886183790671538;
    const double turns =
        p * pow(base, -2.0 * static_cast<double>(f) / static_cast<double>(head_size)) * inv_pi;
    double s = 0, c = 0;
    detail::sincos_pi(turns, &s, &c);
    s *= sign;
    for (std::size_t h = 0; h < heads; ++h) {
      T* head = x + r * ld + h * head_size;
      const double a = detail::widen(head[f]), b = detail::widen(head[f + half]);
      head[f] = detail::narrow<T>(static_cast<float>(a * c - b * s));
      head[f + half] = detail::narrow<T>(static_cast<float>(b * c + a * s));
    }
  }
}

/// RopeOp's rotate on `stream`; with document ids their positions first (document_positions),
/// into `scratch` (rows uint32: rope_scratch(rows) floats), which stays in use until the launches
/// run.
template <class T>
void rope(std::size_t rows, std::size_t tokens, std::size_t heads, std::size_t head_size,
          std::size_t ld, double base, const std::int32_t* document, T* x, bool transpose,
          float* scratch, cudaStream_t stream) {
  if (rows == 0 || heads == 0 || head_size < 2) return;
  std::uint32_t* position = nullptr;
  if (document != nullptr) {
    position = reinterpret_cast<std::uint32_t*>(scratch);
    document_positions(rows, tokens, document, position, stream);
  }
  const std::size_t n = rows * heads * head_size;
  detail::record_kernel("rope_kernel", {rows, heads, head_size}, 3.0 * static_cast<double>(n),
                        detail::bytes_of<T>(n), detail::bytes_of<T>(n), stream);
  GPIPE_CUDA_LAUNCH(rope_kernel<T>, detail::grid_for(rows * (head_size / 2)), detail::block_size,
                    stream)
  (rows, tokens, heads, head_size, ld, base, position, x, transpose ? -1.0 : 1.0);
  GPIPE_CUDA_CHECK_LAUNCH("rope_kernel");
}
/// Floats of scratch that rope needs for `rows` rows with document ids.
inline std::size_t rope_scratch(std::size_t rows) { return rows; }

/// y (rows, F) = silu(g) u for x (rows, 2F) = [g | u], in float.
template <class T>
__global__ void swiglu_forward_kernel(std::size_t rows, std::size_t F, const T* x, T* y) {
  for (std::size_t i = detail::global_thread(); i < rows * F; i += detail::grid_threads()) {
    const std::size_t r = i / F, c = i % F;
    const float g = detail::widen(x[r * 2 * F + c]), u = detail::widen(x[r * 2 * F + F + c]);
    y[i] = detail::narrow<T>(g / (1.0f + expf(-g)) * u);
  }
}

/// dx (rows, 2F) = [dy u silu'(g) | dy silu(g)], silu'(g) = s (1 + g (1 - s)), s the sigmoid.
template <class T>
__global__ void swiglu_backward_kernel(std::size_t rows, std::size_t F, const T* x, const T* dy,
                                       T* dx) {
  for (std::size_t i = detail::global_thread(); i < rows * F; i += detail::grid_threads()) {
    const std::size_t r = i / F, c = i % F;
    const float g = detail::widen(x[r * 2 * F + c]), u = detail::widen(x[r * 2 * F + F + c]);
    const float d = detail::widen(dy[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    dx[r * 2 * F + c] = detail::narrow<T>(d * u * (s * (1.0f + g * (1.0f - s))));
    dx[r * 2 * F + F + c] = detail::narrow<T>(d * (g * s));
  }
}

/// swiglu_forward_kernel on `stream`.
template <class T>
void swiglu_forward(std::size_t rows, std::size_t F, const T* x, T* y, cudaStream_t stream) {
  if (rows == 0 || F == 0) return;
  const std::size_t n = rows * F;
  detail::record_kernel("swiglu_forward_kernel", {rows, F, 0}, 5.0 * static_cast<double>(n),
                        detail::bytes_of<T>(2 * n), detail::bytes_of<T>(n), stream);
  GPIPE_CUDA_LAUNCH(swiglu_forward_kernel<T>, detail::grid_for(n), detail::block_size, stream)
  (rows, F, x, y);
  GPIPE_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
}

/// swiglu_backward_kernel on `stream`: dx overwritten.
template <class T>
void swiglu_backward(std::size_t rows, std::size_t F, const T* x, const T* dy, T* dx,
                     cudaStream_t stream) {
  if (rows == 0 || F == 0) return;
  const std::size_t n = rows * F;
  detail::record_kernel("swiglu_backward_kernel", {rows, F, 0}, 10.0 * static_cast<double>(n),
                        detail::bytes_of<T>(3 * n), detail::bytes_of<T>(2 * n), stream);
  GPIPE_CUDA_LAUNCH(swiglu_backward_kernel<T>, detail::grid_for(n), detail::block_size, stream)
  (rows, F, x, dy, dx);
  GPIPE_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
}

}  // namespace gpipe::cuda
