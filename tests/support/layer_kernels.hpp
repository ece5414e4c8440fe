#pragma once
// A layer's own kernels (gpipe::LayerKernels<Op, Ctx>, model/kernel_context.hpp) called on a kernel
// context without naming the context's type, as the kernel tests do for every backend:
//   layer_kernels<gpipe::ReluOp>(k).forward(k, n, x, y);

#include <gpipe/model/kernel_context.hpp>

namespace gpipe::test {

/// The kernels of the layer operation Op on the backend whose kernel context `ctx` is.
template <class Op, class Ctx>
constexpr gpipe::LayerKernels<Op, Ctx> layer_kernels(Ctx& /*ctx*/) {
  return {};
}

}  // namespace gpipe::test
