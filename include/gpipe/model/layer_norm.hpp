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

template <std::size_t N>
struct LayerNorm {
  static_assert(N > 0, "gpipe: LayerNorm needs a positive size");
  static constexpr double eps = 1e-5;

  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr std::size_t num_params = 2 * N;
  static constexpr std::size_t stash_per_row = 2;  ///< (mean, rstd)
  static constexpr std::size_t grad_stash_per_row = 0;

  static constexpr std::array<ParamSpec, 2> param_specs() {
    return {ParamSpec{.name = "weight", .shape = {N, 0}, .rank = 1, .offset = 0},
            ParamSpec{.name = "bias", .shape = {N, 0}, .rank = 1, .offset = N}};
  }

  static void init(std::span<float> params, Rng&) {
    for (std::size_t i = 0; i < N; ++i) params[i] = 1.0f, params[N + i] = 0.0f;
  }

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<LayerNormOp, Ctx>::forward(ctx, a.rows, N, eps, a.x, a.params, a.params + N, a.y,
                                            a.stash);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    LayerKernels<LayerNormOp, Ctx>::backward_input(ctx, a.rows, N, a.x, a.dy, a.params, a.stash,
                                                   a.dx);
  }
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    LayerKernels<LayerNormOp, Ctx>::backward_weight(ctx, a.rows, N, a.x, a.dy, a.stash, a.grads,
                                                    a.grads + N);
  }
};

}  // namespace gpipe
