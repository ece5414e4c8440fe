#pragma once
// GELUTanh on the host: y = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), and
// dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2 / pi) (1 + 3 0.044715 x^2).
// float runs on SIMD packs with simd::tanh (absolute error below 2e-7, where tanh is added to 1);
// double, the precision of the finite-difference tests, calls std::tanh.

#include <cmath>
#include <cstddef>
#include <numbers>
#include <type_traits>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/simd.hpp"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {

/// GELUTanh on the host, over n elements (the formulas at the top of this file): float on SIMD
/// packs with simd::tanh, double with std::tanh.
template <class T>
struct LayerKernels<GeluTanhOp, host::KernelContext<T>> {
  /// The cubic term's coefficient in u = c (x + a x^3).
  static constexpr T a = T(0.044715);
  static constexpr T c = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>;  ///< sqrt(2/pi)

  /// y(n) = 0.5 x (1 + tanh u), u = c (x + a x^3); y may be x.
  static void forward(host::KernelContext<T>& k, std::size_t n, const T* x, T* y) {
    k.in_blocks(n, 1, [&](std::size_t i, std::size_t count) {
      host::simd::transform(
          count, [](auto v) { return T(0.5) * v * (T(1) + tanh_of(c * (v + a * v * v * v))); },
          y + i, x + i);
    });
  }
  /// dx(n) = dy (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 a x^2)); x is the forward's
  /// input.
  static void backward(host::KernelContext<T>& k, std::size_t n, const T* x, const T* dy, T* dx) {
    k.in_blocks(n, 1, [&](std::size_t i, std::size_t count) {
      host::simd::transform(
          count,
          [](auto v, auto g) {
            const auto th = tanh_of(c * (v + a * v * v * v));
            return g * (T(0.5) * (T(1) + th) +
                        T(0.5) * v * (T(1) - th * th) * c * (T(1) + T(3) * a * v * v));
          },
          dx + i, x + i, dy + i);
    });
  }

 private:
  template <class V>
  static V tanh_of(V u) {
    if constexpr (std::is_same_v<T, float>) {
      return host::simd::tanh(u);
    } else {  // double: element by element (packs of two), std::tanh's accuracy
      V out = u;
      if constexpr (std::is_same_v<V, T>) {
        out = std::tanh(u);
      } else {
        for (std::size_t i = 0; i < host::simd::width_v<T>; ++i) out[i] = std::tanh(u[i]);
      }
      return out;
    }
  }
};

/// GELU (tanh form) on bf16 activations: the float kernel on widened blocks, rounded once.
template <>
struct LayerKernels<GeluTanhOp, host::KernelContext<bf16>>
    : detail::WidenedElementwise<GeluTanhOp> {};

}  // namespace gpipe
