#pragma once
// Linear<In, Out>: y = x W^T + b, as torch.nn.Linear. weight (Out, In), bias (Out).
// Linear<In, Out, false>: y = x W^T, as torch.nn.Linear(bias=False) (GPT-2's LM head); weight only.
// After a GELUTanh in a chain (GPT-2's MLP), a context with GELU's derivative in its GEMMs'
// epilogues computes GELU's input gradient in the Linear's input-gradient GEMM
// (detail::LayerPair below).

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>

#include "gpipe/model/activation.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {

/// Fully connected layer, as torch.nn.Linear: y (rows, Out) = x (rows, In) W^T + b, with weight W
/// (Out, In) and, when `Bias`, bias b (Out). Its backward needs only x, so it stashes nothing.
template <std::size_t In, std::size_t Out, bool Bias = true>
struct Linear {
  static_assert(In > 0 && Out > 0, "gpipe: Linear needs positive sizes");

  static constexpr std::size_t in_features = In;    ///< Width of x.
  static constexpr std::size_t out_features = Out;  ///< Width of y.
  /// The weight (Out * In floats, row-major) then the bias (Out), if any.
  static constexpr std::size_t num_params = Out * In + (Bias ? Out : 0);
  static constexpr std::size_t stash_per_row = 0;       ///< B uses dy and W; W uses x and dy.
  static constexpr std::size_t grad_stash_per_row = 0;  ///< W needs nothing from B.

  /// "weight" (Out, In) at offset 0 and, when `Bias`, "bias" (Out) at offset Out * In.
  static constexpr auto param_specs() {
    constexpr ParamSpec weight{.name = "weight", .shape = {Out, In}, .rank = 2, .offset = 0};
    if constexpr (Bias)
      return std::array<ParamSpec, 2>{
          weight, ParamSpec{.name = "bias", .shape = {Out, 0}, .rank = 1, .offset = Out * In}};
    else
      return std::array<ParamSpec, 1>{weight};
  }

  /// PyTorch's default: kaiming_uniform_(a = sqrt 5) for the weight and U(-1/sqrt In, 1/sqrt In)
  /// for the bias, which are the same bound.
  static void init(std::span<float> params, Rng& rng) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(In));
    for (float& p : params) p = rng.uniform(-bound, bound);
  }

  /// y (rows, Out) = x (rows, In) W^T + b: the context's linear_forward where it has one (the
  /// host and CUDA backends fuse the bias into their GEMMs), else a GEMM and a bias pass. W is read
  /// from the compute copy (with_compute_params), b from the float master.
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    with_compute_params(a, 0, [&](const auto* w) { forward_with(ctx, a, w); });
  }

  /// dx (rows, In) = dy (rows, Out) W
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    with_compute_params(
        a, 0, [&](const auto* w) { ctx.gemm(false, false, a.rows, In, Out, 1, a.dy, w, 0, a.dx); });
  }

  /// dW (Out, In) += dy^T x,  db (Out) += sum_rows dy: the context's linear_backward_weight
  /// where it has one (the CUDA backend sums dy's columns in the GEMM's epilogue), else a GEMM
  /// and a bias-gradient pass.
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    if constexpr (Bias && requires {
                    ctx.linear_backward_weight(a.rows, In, Out, a.dy, a.x, a.grads, a.grads);
                  }) {
      ctx.linear_backward_weight(a.rows, In, Out, a.dy, a.x, a.grads, a.grads + Out * In);
    } else {
      ctx.gemm(true, false, Out, In, a.rows, 1, a.dy, a.x, 1, a.grads);
      if constexpr (Bias) ctx.bias_grad(a.rows, Out, a.dy, a.grads + Out * In);
    }
  }

 private:
  // forward with the weights read from w: the compute copy or the float master.
  template <class Ctx, class W>
  static void forward_with(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a, const W* w) {
    if constexpr (!Bias) {
      ctx.gemm(false, true, a.rows, Out, In, 1, a.x, w, 0, a.y);
    } else if constexpr (requires { ctx.linear_forward(a.rows, In, Out, a.x, w, a.params, a.y); }) {
      ctx.linear_forward(a.rows, In, Out, a.x, w, a.params + Out * In, a.y);
    } else {
      ctx.gemm(false, true, a.rows, Out, In, 1, a.x, w, 0, a.y);
      ctx.bias_add(a.rows, Out, a.params + Out * In, a.y);
    }
  }
};

namespace detail {

// GELUTanh then Linear<In, Out>: GELU's input gradient dx = (dy W) * GELUTanh'(x) as one GEMM
// whose epilogue applies GELU's derivative, where the context has linear_backward_input_gelu_tanh;
// the gradient between them (the Linear's dx) is never stored. GELUTanh has no W op to read it.
template <std::size_t In, std::size_t Out, bool Bias>
struct LayerPair<Elementwise<GeluTanhOp, In>, Linear<In, Out, Bias>> {
  template <class Ctx, class T = typename Ctx::value_type>
  requires requires(Ctx& c, const T* t, T* u) {
    { c.linear_backward_input_gelu_tanh(std::size_t{}, In, Out, t, t, t, u) } -> std::same_as<bool>;
  }
  static bool backward_input(Ctx& ctx, const BackwardInputArgs<T>& gelu,
                             const BackwardInputArgs<T>& linear) {
    bool done = false;
    with_compute_params(linear, 0, [&](const auto* w) {
      done =
          ctx.linear_backward_input_gelu_tanh(linear.rows, In, Out, linear.dy, w, gelu.x, gelu.dx);
    });
    return done;
  }
};

}  // namespace detail

}  // namespace gpipe
