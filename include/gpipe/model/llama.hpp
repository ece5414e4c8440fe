#pragma once
// LlamaBlock<D, H, KVH, F, RopeBase>: the decoder layer of Hugging Face's LlamaForCausalLM
// (LlamaDecoderLayer), without biases or dropout, hd = D / H:
//   n = input_layernorm(x),          x = x + o_proj(attn(rope(q_proj n), rope(k_proj n), v_proj n))
//   m = post_attention_layernorm(x), y = x + down_proj(silu(gate_proj m) * up_proj m)
// Two residual chains of layers, each a fused piece of that formula:
//   RMSNorm<D> | LlamaQKV (q, k, v in one GEMM, RoPE on q and k in place) | the attention core
//   (grouped-query, kernels of CausalAttentionOp) | Linear<H hd, D, false>
//   RMSNorm<D> | gate and up in one GEMM | SwiGLU: silu(gate) * up | Linear<F, D, false>
// A row of qkv is [q heads (H hd) | k heads (KVH hd) | v heads (KVH hd)], as the attention kernels
// read it (AttentionGeometry: query head h reads key/value head h / (H / KVH)), so the three weight
// matrices lie in that order in the parameter array and one GEMM makes the row; each keeps
// Hugging Face's name and shape. Rotary embedding, as LlamaRotaryEmbedding with rotate_half: in
// each q and k head, frequency i < hd/2 pairs elements i and i + hd/2,
//   (a, b) -> (a cos - b sin, b cos + a sin),  angle = position * RopeBase^(-2i/hd),
// position = the token's index in its sample, or in its run of equal document ids when the args
// carry ids (ForwardArgs::document). The angles, cosines and sines are computed in double, where
// Hugging Face computes them in float32: the rotation is exact to the activations' rounding
// instead of carrying float32's angle error (about position * 6e-8 radians).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "gpipe/model/attention.hpp"
#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/linear.hpp"
#include "gpipe/model/residual.hpp"
#include "gpipe/model/rms_norm.hpp"

namespace gpipe {

/// The rotary embedding's kernel, per backend (LayerKernels<RopeOp, Ctx>), on the first `heads`
/// heads of width `head_size` (even) of each row of x (rows, ld), in place:
///   rotate(ctx, rows, tokens, heads, head_size, ld, base, document, x, transpose)
/// rows = samples * tokens; row r is position r % tokens, or with `document` (rows, not null) its
/// distance from the first row of its run of equal ids in its sample. Per head and frequency
/// i < head_size / 2, with angle = position * base^(-2i / head_size),
///   (x_i, x_{i + hd/2}) <- (x_i cos - x_{i+hd/2} sin, x_{i+hd/2} cos + x_i sin);
/// `transpose`: the inverse rotation (sin negated), which maps a gradient of the rotated values
/// to the gradient of the values before rotation. cos and sin in double, each result rounded once.
struct RopeOp {};

/// The SwiGLU gate's kernels, per backend (LayerKernels<SwiGLUOp, Ctx>), x (rows, 2F) = [g | u]:
///   forward(ctx, rows, F, x, y (rows, F))              y = silu(g) u, silu(g) = g / (1 + e^-g)
///   backward(ctx, rows, F, x, dy, dx (rows, 2F))       dg = dy u silu'(g), du = dy silu(g)
/// in float or wider (at least master_t's precision), each result rounded once to the activation
/// type; silu'(g) = s (1 + g (1 - s)), s = 1 / (1 + e^-g).
struct SwiGLUOp {};

namespace detail {

// Linear<In, (Outs + ...), false> whose weight is several matrices (Outs_j, In) stacked in order,
// each its own tensor (named "0", "1", ... here; a composite renames them): one GEMM for all.
template <std::size_t In, std::size_t... Outs>
struct StackedLinear : Linear<In, (Outs + ...), false> {
  static constexpr auto param_specs() {
    std::array<ParamSpec, sizeof...(Outs)> out{};
    constexpr std::array<std::string_view, 4> names{"0", "1", "2", "3"};
    static_assert(sizeof...(Outs) <= names.size());
    std::size_t k = 0, offset = 0;
    for (std::size_t rows : {Outs...}) {
      out[k] = ParamSpec{.name = names[k], .shape = {rows, In}, .rank = 2, .offset = offset};
      offset += rows * In;
      ++k;
    }
    return out;
  }
};

// The q, k, v projections and RoPE on q and k: (rows, D) -> (rows, (H + 2 KVH) hd). B and W
// rotate dy back (the transpose) in their workspace before the Linear's own B and W.
template <std::size_t D, std::size_t H, std::size_t KVH, std::size_t Base, std::size_t T>
struct LlamaQKV : StackedLinear<D, H*(D / H), KVH*(D / H), KVH*(D / H)> {
  using Proj = StackedLinear<D, H*(D / H), KVH*(D / H), KVH*(D / H)>;
  static constexpr std::size_t hd = D / H;
  static constexpr std::size_t width = (H + 2 * KVH) * hd;
  // dy rotated back, for the Linear's B and W.
  static constexpr std::size_t workspace_per_row = width;

  template <class Ctx>
  static void rotate(Ctx& ctx, std::size_t rows, const std::int32_t* document,
                     typename Ctx::value_type* x, bool transpose) {
    LayerKernels<RopeOp, Ctx>::rotate(ctx, rows, T, H + KVH, hd, width, static_cast<double>(Base),
                                      document, x, transpose);
  }

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    Proj::forward(ctx, a);
    rotate(ctx, a.rows, a.document, a.y, false);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * width, a.dy, a.workspace);
    rotate(ctx, a.rows, a.document, a.workspace, true);
    BackwardInputArgs<typename Ctx::value_type> b = a;
    b.dy = a.workspace;
    Proj::backward_input(ctx, b);
  }
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * width, a.dy, a.workspace);
    rotate(ctx, a.rows, a.document, a.workspace, true);
    BackwardWeightArgs<typename Ctx::value_type> w = a;
    w.dy = a.workspace;
    Proj::backward_weight(ctx, w);
  }
};

// SwiGLU's gate: (rows, 2F) = [gate | up] -> (rows, F) = silu(gate) * up. Its backward needs only
// x, which the chain keeps (the stacked GEMM's output).
template <std::size_t F>
struct SwiGLU : ParameterFree {
  static constexpr std::size_t in_features = 2 * F;
  static constexpr std::size_t out_features = F;
  static constexpr std::size_t stash_per_row = 0;
  static constexpr std::size_t grad_stash_per_row = 0;
  // one pass over its values: Remat::selective recomputes its output (model/layer.hpp)
  static constexpr bool cheap_to_recompute = true;

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<SwiGLUOp, Ctx>::forward(ctx, a.rows, F, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    LayerKernels<SwiGLUOp, Ctx>::backward(ctx, a.rows, F, a.x, a.dy, a.dx);
  }
};

template <std::size_t D, std::size_t H, std::size_t KVH, std::size_t F, std::size_t Base,
          std::size_t T>
using LlamaBody =
    Chain<ResidualOf<bind_chain_t<D, T, RMSNorm<D>, LlamaQKV<D, H, KVH, Base, T>,
                                  GroupedAttentionCore<H, KVH, D / H, T>, Linear<D, D, false>>>,
          ResidualOf<bind_chain_t<D, T, RMSNorm<D>, StackedLinear<D, F, F>, SwiGLU<F>,
                                  Linear<F, D, false>>>>;

template <std::size_t D, std::size_t H, std::size_t KVH, std::size_t F, std::size_t Base,
          std::size_t T>
struct LlamaBlockOf : LlamaBody<D, H, KVH, F, Base, T> {
  static constexpr std::size_t heads = H;
  static constexpr std::size_t kv_heads = KVH;
  static constexpr std::size_t sequential_size = 1;
  static constexpr std::size_t tokens_per_sample = T;
  static constexpr auto param_specs() {
    return named_specs<LlamaBody<D, H, KVH, F, Base, T>, 9>(
        {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
         "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
         "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"});
  }
};

// Shows up as llama_heads_check<width<D>, heads<H>, kv_heads<KVH>>: D must be a multiple of H
// (head size D / H, even for RoPE's pairs) and H a multiple of KVH.
template <std::size_t N>
struct width {};
template <std::size_t N>
struct heads {};
template <std::size_t N>
struct kv_heads {};
template <class D, class H, class KVH>
struct llama_heads_check;
template <std::size_t D, std::size_t H, std::size_t KVH>
struct llama_heads_check<width<D>, heads<H>, kv_heads<KVH>> {
  static_assert(H > 0 && KVH > 0, "gpipe: LlamaBlock needs positive heads H and kv_heads KVH");
  static_assert(H == 0 || D % H == 0,
                "gpipe: LlamaBlock's width D must be a multiple of its heads H "
                "(llama_heads_check<width<D>, heads<H>, kv_heads<KVH>> names them)");
  static_assert(KVH == 0 || H % KVH == 0,
                "gpipe: LlamaBlock's heads H must be a multiple of its key/value heads KVH "
                "(llama_heads_check<width<D>, heads<H>, kv_heads<KVH>> names them)");
  static_assert(H == 0 || D % H != 0 || (D / H) % 2 == 0,
                "gpipe: LlamaBlock's head size D / H must be even: RoPE rotates pairs "
                "(llama_heads_check<width<D>, heads<H>, kv_heads<KVH>> names them)");
  static constexpr bool value = H > 0 && KVH > 0 && D % H == 0 && H % KVH == 0;
};

}  // namespace detail

/// The decoder layer of Hugging Face's LlamaForCausalLM: width D, H query heads sharing KVH
/// key/value heads (grouped-query attention), MLP width F, rotary base RopeBase (Llama 3: 500000).
/// x = x + attn(input_layernorm(x)), then y = x + mlp(post_attention_layernorm(x)), RMSNorms,
/// RoPE on q and k, causal attention with scale 1 / sqrt(D / H) (within each document where the
/// step packs documents), mlp = down_proj(silu(gate_proj(x)) * up_proj(x)); no biases, no dropout.
/// One entry of nn.Sequential with Hugging Face's names: "i.input_layernorm.weight",
/// "i.self_attn.{q,k,v,o}_proj.weight", "i.post_attention_layernorm.weight",
/// "i.mlp.{gate,up,down}_proj.weight". Needs a token model (TokenEmbedding first). D not a
/// multiple of H, H not a multiple of KVH, or an odd head size, is a compile error naming them.
template <std::size_t D, std::size_t H, std::size_t KVH, std::size_t F,
          std::size_t RopeBase = 10000>
struct LlamaBlock {
  static_assert(
      detail::llama_heads_check<detail::width<D>, detail::heads<H>, detail::kv_heads<KVH>>::value);
  static_assert(F > 0 && RopeBase > 1, "gpipe: LlamaBlock needs F > 0 and RopeBase > 1");
  /// Marks a sequence_layer: the model's tokens per sample T binds it.
  using sequence_generic = void;
  /// D, the width it takes and gives.
  static constexpr std::size_t natural_in_features = D;
  /// The layer for samples of T tokens (T consecutive rows).
  template <std::size_t T>
  using with_tokens = detail::LlamaBlockOf<D, H, KVH, F, RopeBase, T>;
};

}  // namespace gpipe
