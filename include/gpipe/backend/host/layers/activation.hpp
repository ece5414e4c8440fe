#pragma once
// ReLU and GELU on the host: the elementwise kernels of kernels/elementwise.hpp.

#include <cstddef>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/elementwise.hpp"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {

template <class T>
struct LayerKernels<ReluOp, host::Kernels<T>> {
  static void forward(host::Kernels<T>&, std::size_t n, const T* x, T* y) {
    host::relu_forward(n, x, y);
  }
  static void backward(host::Kernels<T>&, std::size_t n, const T* x, const T* dy, T* dx) {
    host::relu_backward(n, x, dy, dx);
  }
};

template <class T>
struct LayerKernels<GeluOp, host::Kernels<T>> {
  static void forward(host::Kernels<T>&, std::size_t n, const T* x, T* y) {
    host::gelu_forward(n, x, y);
  }
  static void backward(host::Kernels<T>&, std::size_t n, const T* x, const T* dy, T* dx) {
    host::gelu_backward(n, x, dy, dx);
  }
};

}  // namespace gpipe
