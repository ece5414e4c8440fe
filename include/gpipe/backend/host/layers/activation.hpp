#pragma once
// ReLU and GELU on the host: the elementwise kernels of kernels/elementwise.hpp, split over the
// context's team by elements (KernelContext::in_blocks).

#include <cstddef>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/elementwise.hpp"
#include "gpipe/backend/host/linkage.hpp"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {

/// ReLU on the host, over n elements, on SIMD packs.
template <class T>
struct LayerKernels<ReluOp, host::KernelContext<T>> {
  /// y(n) = max(x, 0); y may be x.
  static void forward(host::KernelContext<T>& k, std::size_t n, const T* x, T* y);
  /// dx(n) = dy where x > 0, else 0 (the subgradient at 0 is 0, as in PyTorch); x is the
  /// forward's input.
  static void backward(host::KernelContext<T>& k, std::size_t n, const T* x, const T* dy, T* dx);
};

/// Exact (erf) GELU on the host, over n elements, with std::erf and std::exp per element.
template <class T>
struct LayerKernels<GeluOp, host::KernelContext<T>> {
  /// y(n) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
  static void forward(host::KernelContext<T>& k, std::size_t n, const T* x, T* y);
  /// dx(n) = dy (Phi(x) + x phi(x)), Phi and phi the standard normal's CDF and density; x is
  /// the forward's input.
  static void backward(host::KernelContext<T>& k, std::size_t n, const T* x, const T* dy, T* dx);
};

// Defined out of the classes, so that a program on gpipe::compiled compiles none of them (the
// float ones are instantiated in the library: GPIPE_HOST_INSTANTIATION below).

template <class T>
void LayerKernels<ReluOp, host::KernelContext<T>>::forward(host::KernelContext<T>& k, std::size_t n,
                                                           const T* x, T* y) {
  k.in_blocks(n, 1, [&](std::size_t i, std::size_t c) { host::relu_forward(c, x + i, y + i); });
}

template <class T>
void LayerKernels<ReluOp, host::KernelContext<T>>::backward(host::KernelContext<T>& k,
                                                            std::size_t n, const T* x, const T* dy,
                                                            T* dx) {
  k.in_blocks(n, 1,
              [&](std::size_t i, std::size_t c) { host::relu_backward(c, x + i, dy + i, dx + i); });
}

template <class T>
void LayerKernels<GeluOp, host::KernelContext<T>>::forward(host::KernelContext<T>& k, std::size_t n,
                                                           const T* x, T* y) {
  k.in_blocks(n, 1, [&](std::size_t i, std::size_t c) { host::gelu_forward(c, x + i, y + i); });
}

template <class T>
void LayerKernels<GeluOp, host::KernelContext<T>>::backward(host::KernelContext<T>& k,
                                                            std::size_t n, const T* x, const T* dy,
                                                            T* dx) {
  k.in_blocks(n, 1,
              [&](std::size_t i, std::size_t c) { host::gelu_backward(c, x + i, dy + i, dx + i); });
}

GPIPE_HOST_INSTANTIATION(struct LayerKernels<ReluOp, host::KernelContext<float>>);
GPIPE_HOST_INSTANTIATION(struct LayerKernels<GeluOp, host::KernelContext<float>>);

/// ReLU on bf16 activations: the float kernel on widened blocks, rounded once.
template <>
struct LayerKernels<ReluOp, host::KernelContext<bf16>> : detail::WidenedElementwise<ReluOp> {};
/// Exact GELU on bf16 activations: the float kernel on widened blocks, rounded once.
template <>
struct LayerKernels<GeluOp, host::KernelContext<bf16>> : detail::WidenedElementwise<GeluOp> {};

}  // namespace gpipe
