#pragma once
// GELUTanh on the host: y = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), and
// dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2 / pi) (1 + 3 0.044715 x^2).

#include <cmath>
#include <cstddef>
#include <numbers>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {

template <class T>
struct LayerKernels<GeluTanhOp, host::Kernels<T>> {
  static constexpr T a = T(0.044715);
  static constexpr T c = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>;  // sqrt(2/pi)

  static void forward(host::Kernels<T>&, std::size_t n, const T* x, T* y) {
    for (std::size_t i = 0; i < n; ++i) {
      const T v = x[i];
      y[i] = T(0.5) * v * (T(1) + std::tanh(c * (v + a * v * v * v)));
    }
  }
  static void backward(host::Kernels<T>&, std::size_t n, const T* x, const T* dy, T* dx) {
    for (std::size_t i = 0; i < n; ++i) {
      const T v = x[i];
      const T th = std::tanh(c * (v + a * v * v * v));
      const T slope =
          T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * c * (T(1) + T(3) * a * v * v);
      dx[i] = dy[i] * slope;
    }
  }
};

}  // namespace gpipe
