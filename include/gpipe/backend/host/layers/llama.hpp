#pragma once
// The Llama block's own kernels on the host (model/llama.hpp): the rotary embedding in place and
// SwiGLU's gate, one body for every activation type (float, bf16, double in the tests), computed
// in double and rounded once; split over the context's team by samples (RoPE) or rows (SwiGLU).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/positions.hpp"
#include "gpipe/backend/host/linkage.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/llama.hpp"

namespace gpipe {

/// The rotary embedding on the host (RopeOp's contract), per sample: its positions from the
/// document ids (host::document_positions; without them, the row's index in its sample), then per
/// row the hd/2 angles of its position (a table of every position's, computed once a call),
/// shared by its heads.
template <class T>
struct LayerKernels<RopeOp, host::KernelContext<T>> {
  /// x (rows, ld): its first `heads` heads rotated in place (RopeOp).
  static void rotate(host::KernelContext<T>& k, std::size_t rows, std::size_t tokens,
                     std::size_t heads, std::size_t head_size, std::size_t ld, double base,
                     const std::int32_t* document, T* x, bool transpose);
};

/// SwiGLU's gate on the host (SwiGLUOp's contract).
template <class T>
struct LayerKernels<SwiGLUOp, host::KernelContext<T>> {
  /// y(rows, F) = silu(g) u, x (rows, 2F) = [g | u].
  static void forward(host::KernelContext<T>& k, std::size_t rows, std::size_t F, const T* x, T* y);
  /// dx(rows, 2F) = [dy u silu'(g) | dy silu(g)].
  static void backward(host::KernelContext<T>& k, std::size_t rows, std::size_t F, const T* x,
                       const T* dy, T* dx);
};

// Defined out of the classes, so that a program on gpipe::compiled compiles none of them (the
// float ones are instantiated in the library: GPIPE_HOST_INSTANTIATION below).

template <class T>
void LayerKernels<RopeOp, host::KernelContext<T>>::rotate(host::KernelContext<T>& k,
                                                          std::size_t rows, std::size_t tokens,
                                                          std::size_t heads, std::size_t head_size,
                                                          std::size_t ld, double base,
                                                          const std::int32_t* document, T* x,
                                                          bool transpose) {
  const std::size_t half = head_size / 2, samples = rows / tokens;
  // cos and sin of every (position, frequency) once a call (positions are below `tokens`), not
  // once a row: (tokens, half) each
  std::vector<double> cos(tokens * half), sin(tokens * half);
  for (std::size_t i = 0; i < half; ++i) {
    const double inv_freq =
        std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_size));
    for (std::size_t p = 0; p < tokens; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      cos[p * half + i] = std::cos(angle);
      sin[p * half + i] = transpose ? -std::sin(angle) : std::sin(angle);
    }
  }
  k.in_blocks(samples, tokens * heads * head_size, [&](std::size_t first, std::size_t count) {
    std::vector<std::size_t> position;
    for (std::size_t b = first; b < first + count; ++b) {
      host::document_positions(tokens, tokens,
                               document == nullptr ? nullptr : document + b * tokens, position);
      for (std::size_t t = 0; t < tokens; ++t) {
        const double* c_t = cos.data() + position[t] * half;
        const double* s_t = sin.data() + position[t] * half;
        T* row = x + (b * tokens + t) * ld;
        for (std::size_t h = 0; h < heads; ++h) {
          T* head = row + h * head_size;
          for (std::size_t i = 0; i < half; ++i) {
            const double a = static_cast<double>(head[i]), c = static_cast<double>(head[i + half]);
            head[i] = static_cast<T>(a * c_t[i] - c * s_t[i]);
            head[i + half] = static_cast<T>(c * c_t[i] + a * s_t[i]);
          }
        }
      }
    }
  });
}

template <class T>
void LayerKernels<SwiGLUOp, host::KernelContext<T>>::forward(host::KernelContext<T>& k,
                                                             std::size_t rows, std::size_t F,
                                                             const T* x, T* y) {
  k.in_blocks(rows, F, [&](std::size_t first, std::size_t count) {
    for (std::size_t r = first; r < first + count; ++r)
      for (std::size_t c = 0; c < F; ++c) {
        const double g = static_cast<double>(x[r * 2 * F + c]);
        const double u = static_cast<double>(x[r * 2 * F + F + c]);
        y[r * F + c] = static_cast<T>(g / (1.0 + std::exp(-g)) * u);
      }
  });
}

template <class T>
void LayerKernels<SwiGLUOp, host::KernelContext<T>>::backward(host::KernelContext<T>& k,
                                                              std::size_t rows, std::size_t F,
                                                              const T* x, const T* dy, T* dx) {
  k.in_blocks(rows, F, [&](std::size_t first, std::size_t count) {
    for (std::size_t r = first; r < first + count; ++r)
      for (std::size_t c = 0; c < F; ++c) {
        const double g = static_cast<double>(x[r * 2 * F + c]);
        const double u = static_cast<double>(x[r * 2 * F + F + c]);
        const double d = static_cast<double>(dy[r * F + c]);
        const double s = 1.0 / (1.0 + std::exp(-g));
        dx[r * 2 * F + c] = static_cast<T>(d * u * s * (1.0 + g * (1.0 - s)));
        dx[r * 2 * F + F + c] = static_cast<T>(d * g * s);
      }
  });
}

GPIPE_HOST_INSTANTIATION(struct LayerKernels<RopeOp, host::KernelContext<float>>);
GPIPE_HOST_INSTANTIATION(struct LayerKernels<SwiGLUOp, host::KernelContext<float>>);

}  // namespace gpipe
