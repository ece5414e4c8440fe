#pragma once
// Parameter-free elementwise layers: ReLU, GELU (exact erf form, torch.nn.GELU()) and GELUTanh
// (tanh approximation, torch.nn.GELU(approximate='tanh'), GPT-2's). All take their width from the
// layer before them: ReLU::with_features<N> is the layer.

#include <cstddef>

#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {
namespace detail {

// An elementwise layer of width N whose kernels are Op::forward / Op::backward(ctx, n, ...).
template <class Op, std::size_t N>
struct Elementwise : ParameterFree {
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr std::size_t stash_per_row = 0;
  static constexpr std::size_t grad_stash_per_row = 0;
  // one pass over its values: Remat::selective recomputes its output (model/layer.hpp)
  static constexpr bool cheap_to_recompute = true;

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    Op::forward(ctx, a.rows * N, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    Op::backward(ctx, a.rows * N, a.x, a.dy, a.dx);
  }
};

}  // namespace detail

/// The kernels of ReLU, GELU and GELUTanh, per backend: `LayerKernels<Op, Ctx>` provides
/// `forward(ctx, n, x, y)` and `backward(ctx, n, x, dy, dx)`, elementwise over n values.
template <class Op>
struct ElementwiseOp {
  /// y (n) = f(x (n)), overwritten.
  template <class Ctx, class T>
  static void forward(Ctx& ctx, std::size_t n, const T* x, T* y) {
    LayerKernels<Op, Ctx>::forward(ctx, n, x, y);
  }
  /// dx (n) = dy (n) * f'(x (n)), overwritten; needs only the layer input x.
  template <class Ctx, class T>
  static void backward(Ctx& ctx, std::size_t n, const T* x, const T* dy, T* dx) {
    LayerKernels<Op, Ctx>::backward(ctx, n, x, dy, dx);
  }
};
/// Kernel tag of ReLU: a backend runs it with `LayerKernels<ReluOp, Ctx>`.
struct ReluOp : ElementwiseOp<ReluOp> {};
/// Kernel tag of GELU (erf form): a backend runs it with `LayerKernels<GeluOp, Ctx>`.
struct GeluOp : ElementwiseOp<GeluOp> {};
/// Kernel tag of GELUTanh: a backend runs it with `LayerKernels<GeluTanhOp, Ctx>`.
struct GeluTanhOp : ElementwiseOp<GeluTanhOp> {};

/// y = max(x, 0)
struct ReLU {
  /// The layer of width N: (rows, N) to (rows, N), no parameters, nothing stashed; cheap to
  /// recompute (Remat::selective drops its output inside a chain).
  template <std::size_t N>
  using with_features = detail::Elementwise<ReluOp, N>;
  /// Marks a width_generic_layer: the width comes from the layer before.
  using width_generic = void;
  /// 0: its width comes from the layer before, so it cannot open a pipeline.
  static constexpr std::size_t natural_in_features = 0;
};

/// y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
struct GELU {
  /// The layer of width N: (rows, N) to (rows, N), no parameters, nothing stashed; cheap to
  /// recompute (Remat::selective drops its output inside a chain).
  template <std::size_t N>
  using with_features = detail::Elementwise<GeluOp, N>;
  /// Marks a width_generic_layer: the width comes from the layer before.
  using width_generic = void;
  /// 0: its width comes from the layer before, so it cannot open a pipeline.
  static constexpr std::size_t natural_in_features = 0;
};

/// y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
struct GELUTanh {
  /// The layer of width N: (rows, N) to (rows, N), no parameters, nothing stashed; cheap to
  /// recompute (Remat::selective drops its output inside a chain).
  template <std::size_t N>
  using with_features = detail::Elementwise<GeluTanhOp, N>;
  /// Marks a width_generic_layer: the width comes from the layer before.
  using width_generic = void;
  /// 0: its width comes from the layer before, so it cannot open a pipeline.
  static constexpr std::size_t natural_in_features = 0;
};

}  // namespace gpipe
