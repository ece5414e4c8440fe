#pragma once
// RMSNorm<N>: Llama's root-mean-square normalization (Hugging Face's LlamaRMSNorm, eps 1e-5).
// weight (N) = 1 at initialization. Keeps rstd per row from forward for both backward ops.

#include <array>
#include <cstddef>
#include <span>

#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {

/// The kernels of RMSNorm, per backend (LayerKernels<RMSNormOp, Ctx>), on (rows, cols) of the
/// context's value_type T, with weight and gradients in master_t<T>:
///   forward(ctx, rows, cols, eps, x, weight, y, stats (rows, 2) out)
///   backward_input(ctx, rows, cols, x, dy, weight, stats, dx)
///   backward_weight(ctx, rows, cols, x, dy, stats, dweight +=)
/// stats holds each row's rstd as LayerNorm's stats do: (0, rstd) in float or double; for bf16
/// rstd's 32 float bits in the row's two elements, high half first (so no alignment is asked of
/// the stash, wherever a chain puts it).
struct RMSNormOp {};

namespace detail {
// LayerKernels<RMSNormOp, Ctx> with a residual add fused in (model/layer.hpp), as LayerNorm's
// (model/layer_norm.hpp):
//   forward_add(ctx, rows, cols, eps, x, r, weight, y, stats): x = x + r rounded to T, in place,
//     then y and stats from it, as forward's;
//   backward_input_add(ctx, rows, cols, x, dy, weight, stats, r, dx): dx = backward_input's dx
//     rounded to T, plus r.
template <class Ctx, class T = typename Ctx::value_type>
concept rms_norm_adds = has_layer_kernels<RMSNormOp, Ctx> &&
    requires(Ctx& c, std::size_t n, T* x, const T* r, const master_t<T>* w, T* s) {
  LayerKernels<RMSNormOp, Ctx>::forward_add(c, n, n, 1e-5, x, r, w, x, s);
  LayerKernels<RMSNormOp, Ctx>::backward_input_add(c, n, n, r, r, w, r, r, x);
};
}  // namespace detail

/// Root-mean-square normalization over the N features of each row, as Hugging Face's
/// LlamaRMSNorm: y = x rstd weight, rstd = 1 / sqrt(mean(x^2) + eps); no mean subtracted, no bias.
template <std::size_t N>
struct RMSNorm {
  static_assert(N > 0, "gpipe: RMSNorm needs a positive size");
  /// Added to the mean square before the square root, Llama's rms_norm_eps.
  static constexpr double eps = 1e-5;

  static constexpr std::size_t in_features = N;   ///< Width of x.
  static constexpr std::size_t out_features = N;  ///< Width of y, the same.
  static constexpr std::size_t num_params = N;    ///< weight (N).
  /// rstd per row in two elements (a float's bits in two bf16 slots).
  static constexpr std::size_t stash_per_row = 2;
  /// B and W both use the forward's rstd; W needs nothing from B.
  static constexpr std::size_t grad_stash_per_row = 0;
  /// Two passes over a row: Remat::selective drops its output and rstd after forward and
  /// computes them again before backward (see gpipe/model/layer.hpp).
  static constexpr bool cheap_to_recompute = true;

  /// "weight" (N) at offset 0.
  static constexpr std::array<ParamSpec, 1> param_specs() {
    return {ParamSpec{.name = "weight", .shape = {N, 0}, .rank = 1, .offset = 0}};
  }

  /// weight = 1, as Hugging Face's; draws nothing from the generator.
  static void init(std::span<float> params, Rng&) {
    for (float& p : params) p = 1.0f;
  }

  /// y (rows, N), and rstd per row into the stash.
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<RMSNormOp, Ctx>::forward(ctx, a.rows, N, eps, a.x, a.params, a.y, a.stash);
  }
  /// dx (rows, N) = rstd (g - x_hat mean(g x_hat)), g = dy * weight, x_hat = x rstd, the mean
  /// over the row; overwritten.
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    LayerKernels<RMSNormOp, Ctx>::backward_input(ctx, a.rows, N, a.x, a.dy, a.params, a.stash,
                                                 a.dx);
  }
  /// forward of the input x + r, formed in place in x (its memory is writable when r is given):
  /// a residual's add fused into the norm after it, where the backend's kernels have it.
  template <class Ctx>
  requires detail::rms_norm_adds<Ctx>
  static void forward_adding_input(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
                                   const typename Ctx::value_type* r) {
    LayerKernels<RMSNormOp, Ctx>::forward_add(
        ctx, a.rows, N, eps, const_cast<typename Ctx::value_type*>(a.x), r, a.params, a.y, a.stash);
  }
  /// backward_input's dx plus r (a residual's input gradient), where the kernels have it.
  template <class Ctx>
  requires detail::rms_norm_adds<Ctx>
  static void backward_input_adding(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a,
                                    const typename Ctx::value_type* r) {
    LayerKernels<RMSNormOp, Ctx>::backward_input_add(ctx, a.rows, N, a.x, a.dy, a.params, a.stash,
                                                     r, a.dx);
  }
  /// dweight (N) += sum_rows dy * x_hat.
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    LayerKernels<RMSNormOp, Ctx>::backward_weight(ctx, a.rows, N, a.x, a.dy, a.stash, a.grads);
  }
};

}  // namespace gpipe
