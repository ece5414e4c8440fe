#pragma once
// LayerNorm on the host: the kernels of kernels/layer_norm.hpp.

#include <cstddef>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/layer_norm.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer_norm.hpp"

namespace gpipe {

template <class T>
struct LayerKernels<LayerNormOp, host::Kernels<T>> {
  static void forward(host::Kernels<T>&, std::size_t rows, std::size_t cols, double eps, const T* x,
                      const T* gamma, const T* beta, T* y, T* stats) {
    host::layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats);
  }
  static void backward_input(host::Kernels<T>&, std::size_t rows, std::size_t cols, const T* x,
                             const T* dy, const T* gamma, const T* stats, T* dx) {
    host::layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx);
  }
  static void backward_weight(host::Kernels<T>&, std::size_t rows, std::size_t cols, const T* x,
                              const T* dy, const T* stats, T* dgamma, T* dbeta) {
    host::layer_norm_backward_weight(rows, cols, x, dy, stats, dgamma, dbeta);
  }
};

}  // namespace gpipe
