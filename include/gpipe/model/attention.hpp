#pragma once
// CausalSelfAttention<D, H>: GPT-2's multi-head causal self-attention over the T tokens of each
// sample (T from the model's Embedding), as nanoGPT's CausalSelfAttention without dropout:
//   qkv = x W_attn^T + b_attn                        c_attn: weight (3D, D), bias (3D)
//   q, k, v = the three D-wide thirds of qkv; head h takes columns [h d, (h + 1) d), d = D / H
//   P_h = softmax(q_h k_h^T / sqrt d) over keys t' <= t (query t), 0 for t' > t      (T, T)
//   o(:, h d : (h + 1) d) = P_h v_h
//   y = o W_proj^T + b_proj                          c_proj: weight (D, D), bias (D)
// It is a chain Linear<D, 3D>, the attention core, Linear<D, D>, so it keeps qkv (3D per row), o
// (D) and every head's probabilities (H T per row: the (T, T) matrices of a sample, row t of
// each in the row of token t); with Remat::always they are recomputed in backward, not kept.
// The core's backward, per sample and head (dS = d loss / d(q k^T / sqrt d)):
//   dP = do_h v_h^T,  dv_h = P_h^T do_h,  dS = P_h .* (dP - rowsum(dP .* P_h)),
//   dq_h = dS k_h / sqrt d,  dk_h = dS^T q_h / sqrt d.

#include <array>
#include <cstddef>
#include <string_view>

#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/linear.hpp"

namespace gpipe {

/// The kernels of the attention core, per backend (LayerKernels<CausalAttentionOp, Ctx>), on rows
/// = samples T tokens, heads of width d (D = H d):
///   forward(ctx, samples, T, H, d, qkv (rows, 3D), probs (rows, H T) out, o (rows, D) out)
///   backward(ctx, samples, T, H, d, qkv, probs, do (rows, D), dqkv (rows, 3D) out,
///            scratch (rows, T): a (T, T) per sample)
struct CausalAttentionOp {};

namespace detail {

// The parameter-free core: (rows, 3D) qkv -> (rows, D) o.
template <std::size_t D, std::size_t H, std::size_t T>
struct CausalAttentionCore : ParameterFree {
  static constexpr std::size_t in_features = 3 * D;
  static constexpr std::size_t out_features = D;
  static constexpr std::size_t stash_per_row = H * T;  // the probabilities
  static constexpr std::size_t grad_stash_per_row = 0;
  static constexpr std::size_t workspace_per_row = T;  // a (T, T) per sample, for dP

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<CausalAttentionOp, Ctx>::forward(ctx, a.rows / T, T, H, D / H, a.x, a.stash, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    LayerKernels<CausalAttentionOp, Ctx>::backward(ctx, a.rows / T, T, H, D / H, a.x, a.stash, a.dy,
                                                   a.dx, a.workspace);
  }
};

// Body's parameter tensors under the names of a fixed table (in Body's order), as one entry of
// nn.Sequential: "i.<name>".
template <class Body, std::size_t N>
constexpr std::array<ParamSpec, N> named_specs(const std::array<std::string_view, N>& names) {
  static_assert(N == Body::param_specs().size(), "gpipe: one name per parameter tensor");
  std::array<ParamSpec, N> out = Body::param_specs();
  for (std::size_t k = 0; k < N; ++k) {
    out[k].name = names[k];
    out[k].path = {};
    out[k].depth = 0;
  }
  return out;
}

template <std::size_t D, std::size_t H, std::size_t T>
struct CausalSelfAttentionOf : Chain<Linear<D, 3 * D>, CausalAttentionCore<D, H, T>, Linear<D, D>> {
  using Body = Chain<Linear<D, 3 * D>, CausalAttentionCore<D, H, T>, Linear<D, D>>;
  static constexpr std::size_t sequential_size = 1;
  static constexpr std::size_t tokens_per_sample = T;
  static constexpr auto param_specs() {
    return named_specs<Body, 4>({"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"});
  }
};

}  // namespace detail

/// GPT-2's multi-head causal self-attention of width D with H heads (D a multiple of H), as
/// nanoGPT's without dropout: (rows, D) to (rows, D), each token attending to the tokens up to it
/// in its sample. One entry of nn.Sequential with parameters "i.c_attn.weight" (3D, D),
/// "i.c_attn.bias" (3D), "i.c_proj.weight" (D, D), "i.c_proj.bias" (D). Stashes 4D + H T floats
/// per row (qkv, o, the attention probabilities); needs a token model (Embedding first).
template <std::size_t D, std::size_t H>
struct CausalSelfAttention : detail::HeadedSequenceLayer<D, H, detail::CausalSelfAttentionOf> {};

}  // namespace gpipe
