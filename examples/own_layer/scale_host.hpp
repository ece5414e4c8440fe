#pragma once
// Scale's kernels on the host backend: plain loops over host memory, for any scalar type T (float
// in training, double in gpipe::testing::check_layer's finite differences).

#include <cstddef>
#include <gpipe/gpipe.hpp>

#include "scale.hpp"

namespace gpipe {

template <class T>
struct LayerKernels<ScaleOp, host::Kernels<T>> {
  // y(rows, n) = x(rows, n) * w(n)
  static void forward(host::Kernels<T>&, std::size_t rows, std::size_t n, const T* x, const T* w,
                      T* y) {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < n; ++j) y[r * n + j] = x[r * n + j] * w[j];
  }
  // dw(n) += sum over rows of dy(rows, n) * x(rows, n)
  static void backward_weight(host::Kernels<T>&, std::size_t rows, std::size_t n, const T* x,
                              const T* dy, T* dw) {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < n; ++j) dw[j] += dy[r * n + j] * x[r * n + j];
  }
};

}  // namespace gpipe
