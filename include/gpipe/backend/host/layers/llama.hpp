#pragma once
// The Llama block's own kernels on the host (model/llama.hpp): the rotary embedding in place and
// SwiGLU's gate, split over the context's team by samples (RoPE) or rows (SwiGLU). RoPE has one
// body for every activation type (float, bf16, double in the tests), computed in double; SwiGLU
// runs float on SIMD packs with simd::exp (relative error below 2e-7, as the CUDA kernel's expf
// in float), bf16 and double in double.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/positions.hpp"
#include "gpipe/backend/host/kernels/simd.hpp"
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

/// SwiGLU's gate on the host (SwiGLUOp's contract): float on SIMD packs (simd::exp), bf16 and
/// double in double.
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
    for (std::size_t r = first; r < first + count; ++r) {
      const T* g = x + r * 2 * F;
      if constexpr (std::is_same_v<T, float>) {
        host::simd::transform(
            F, [](auto g, auto u) { return g / (1.0f + host::simd::exp(-g)) * u; }, y + r * F, g,
            g + F);
      } else {
        for (std::size_t c = 0; c < F; ++c) {
          const auto gc = static_cast<double>(g[c]), u = static_cast<double>(g[F + c]);
          y[r * F + c] = static_cast<T>(gc / (1.0 + std::exp(-gc)) * u);
        }
      }
    }
  });
}

template <class T>
void LayerKernels<SwiGLUOp, host::KernelContext<T>>::backward(host::KernelContext<T>& k,
                                                              std::size_t rows, std::size_t F,
                                                              const T* x, const T* dy, T* dx) {
  k.in_blocks(rows, F, [&](std::size_t first, std::size_t count) {
    for (std::size_t r = first; r < first + count; ++r) {
      const T *g = x + r * 2 * F, *d = dy + r * F;
      T* dg = dx + r * 2 * F;
      if constexpr (std::is_same_v<T, float>) {
        // dg, then du over it: dx may not alias x, so g and u are still there
        host::simd::transform(
            F,
            [](auto g, auto u, auto d) {
              const auto s = 1.0f / (1.0f + host::simd::exp(-g));
              return d * u * s * (1.0f + g * (1.0f - s));
            },
            dg, g, g + F, d);
        host::simd::transform(
            F, [](auto g, auto d) { return d * g / (1.0f + host::simd::exp(-g)); }, dg + F, g, d);
      } else {
        for (std::size_t c = 0; c < F; ++c) {
          const auto gc = static_cast<double>(g[c]), u = static_cast<double>(g[F + c]);
          const auto dc = static_cast<double>(d[c]);
          const double s = 1.0 / (1.0 + std::exp(-gc));
          dg[c] = static_cast<T>(dc * u * s * (1.0 + gc * (1.0 - s)));
          dg[F + c] = static_cast<T>(dc * gc * s);
        }
      }
    }
  });
}

GPIPE_HOST_INSTANTIATION(struct LayerKernels<RopeOp, host::KernelContext<float>>);
GPIPE_HOST_INSTANTIATION(struct LayerKernels<SwiGLUOp, host::KernelContext<float>>);

}  // namespace gpipe
