#pragma once
// LayerNorm<N>: torch.nn.LayerNorm(N) (eps 1e-5, elementwise affine). weight (N) = 1, bias (N) = 0
// at initialization. Keeps (mean, rstd) per row from forward for both backward ops.

#include <array>
#include <cstddef>
#include <span>

#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {

/// The kernels of LayerNorm, per backend (LayerKernels<LayerNormOp, Ctx>), on (rows, cols):
///   forward(ctx, rows, cols, eps, x, gamma, beta, y, stats (rows, 2) = (mean, rstd))
///   backward_input(ctx, rows, cols, x, dy, gamma, stats, dx)
///   backward_weight(ctx, rows, cols, x, dy, stats, dgamma +=, dbeta +=)
struct LayerNormOp {};

namespace detail {
// LayerKernels<LayerNormOp, Ctx> with a residual add fused in (model/layer.hpp), T the context's
// value_type, gamma and beta master_t<T>:
//   forward_add(ctx, rows, cols, eps, x, r, gamma, beta, y, stats): x = x + r rounded to T, in
//     place, then y and stats from it, as forward's;
//   backward_input_add(ctx, rows, cols, x, dy, gamma, stats, r, dx): dx = backward_input's dx
//     rounded to T, plus r.
template <class Ctx, class T = typename Ctx::value_type>
concept layer_norm_adds = has_layer_kernels<LayerNormOp, Ctx> &&
    requires(Ctx& c, std::size_t n, T* x, const T* r, const master_t<T>* g, T* s) {
  LayerKernels<LayerNormOp, Ctx>::forward_add(c, n, n, 1e-5, x, r, g, g, x, s);
  LayerKernels<LayerNormOp, Ctx>::backward_input_add(c, n, n, r, r, g, r, r, x);
};
}  // namespace detail

/// Layer normalization over the N features of each row, as torch.nn.LayerNorm(N):
/// y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps), var biased (divided by N).
template <std::size_t N>
struct LayerNorm {
  static_assert(N > 0, "gpipe: LayerNorm needs a positive size");
  /// Added to the variance before the square root, PyTorch's default.
  static constexpr double eps = 1e-5;

  static constexpr std::size_t in_features = N;   ///< Width of x.
  static constexpr std::size_t out_features = N;  ///< Width of y, the same.
  /// weight (N) then bias (N).
  static constexpr std::size_t num_params = 2 * N;
  static constexpr std::size_t stash_per_row = 2;  ///< (mean, rstd)
  /// B and W both use the forward's statistics; W needs nothing from B.
  static constexpr std::size_t grad_stash_per_row = 0;
  /// Two passes over a row: Remat::selective drops its output and statistics after forward and
  /// computes them again before backward (see gpipe/model/layer.hpp).
  static constexpr bool cheap_to_recompute = true;

  /// "weight" (N) at offset 0, "bias" (N) at offset N.
  static constexpr std::array<ParamSpec, 2> param_specs() {
    return {ParamSpec{.name = "weight", .shape = {N, 0}, .rank = 1, .offset = 0},
            ParamSpec{.name = "bias", .shape = {N, 0}, .rank = 1, .offset = N}};
  }

  /// weight = 1, bias = 0, as PyTorch; draws nothing from the generator.
  static void init(std::span<float> params, Rng&) {
    for (std::size_t i = 0; i < N; ++i) params[i] = 1.0f, params[N + i] = 0.0f;
  }

  /// y (rows, N), and per row (mean, rstd) into the stash.
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<LayerNormOp, Ctx>::forward(ctx, a.rows, N, eps, a.x, a.params, a.params + N, a.y,
                                            a.stash);
  }
  /// dx (rows, N) = rstd (g - mean(g) - x_hat mean(g x_hat)), g = dy * weight, means over the
  /// row, x_hat = (x - mean) * rstd from the stash; overwritten.
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    LayerKernels<LayerNormOp, Ctx>::backward_input(ctx, a.rows, N, a.x, a.dy, a.params, a.stash,
                                                   a.dx);
  }
  /// forward of the input x + r, formed in place in x (its memory is writable when r is given):
  /// a residual's add fused into the norm after it, where the backend's kernels have it.
  template <class Ctx>
  requires detail::layer_norm_adds<Ctx>
  static void forward_adding_input(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
                                   const typename Ctx::value_type* r) {
    LayerKernels<LayerNormOp, Ctx>::forward_add(ctx, a.rows, N, eps,
                                                const_cast<typename Ctx::value_type*>(a.x), r,
                                                a.params, a.params + N, a.y, a.stash);
  }
  /// backward_input's dx plus r (a residual's input gradient), where the kernels have it.
  template <class Ctx>
  requires detail::layer_norm_adds<Ctx>
  static void backward_input_adding(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a,
                                    const typename Ctx::value_type* r) {
    LayerKernels<LayerNormOp, Ctx>::backward_input_add(ctx, a.rows, N, a.x, a.dy, a.params, a.stash,
                                                       r, a.dx);
  }
  /// dweight (N) += sum_rows dy * x_hat,  dbias (N) += sum_rows dy.
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    LayerKernels<LayerNormOp, Ctx>::backward_weight(ctx, a.rows, N, a.x, a.dy, a.stash, a.grads,
                                                    a.grads + N);
  }
};

}  // namespace gpipe
