#pragma once
// TransformerBlock<D, H>: GPT-2's pre-norm block, as nanoGPT's Block without dropout:
//   x = x + attn(ln_1(x)),   attn = CausalSelfAttention<D, H>
//   y = x + mlp(ln_2(x)),    mlp = c_fc Linear<D, 4D>, GELUTanh, c_proj Linear<4D, D>
// One entry of nn.Sequential, with nanoGPT's names: "i.ln_1.weight", "i.attn.c_attn.weight"
// (3D, D), "i.attn.c_proj.weight" (D, D), "i.ln_2.weight", "i.mlp.c_fc.weight" (4D, D),
// "i.mlp.c_proj.weight" (D, 4D), each with its ".bias". Parameters start as PyTorch's modules do
// (Linear: uniform in +-1/sqrt(in); LayerNorm: 1 and 0).
// Stash per row 15 D + 2 H + 4: the first residual's output (D), ln_1's and ln_2's outputs (D
// each) and statistics (2 each), qkv (3 D), o (D), the log-sum-exps (2 H), c_fc's output (4 D),
// GELU's (4 D). Remat::selective drops the norms' and GELU's, 6 D + 4 (the chain's cheap stash).

#include <cstddef>

#include "gpipe/model/activation.hpp"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/layer_norm.hpp"
#include "gpipe/model/linear.hpp"
#include "gpipe/model/residual.hpp"

namespace gpipe {
namespace detail {

template <std::size_t D, std::size_t H, std::size_t T>
using TransformerBody = Chain<
    ResidualOf<bind_chain_t<D, T, LayerNorm<D>, CausalSelfAttention<D, H>>>,
    ResidualOf<bind_chain_t<D, T, LayerNorm<D>, Linear<D, 4 * D>, GELUTanh, Linear<4 * D, D>>>>;

template <std::size_t D, std::size_t H, std::size_t T>
struct TransformerBlockOf : TransformerBody<D, H, T> {
  static constexpr std::size_t heads = H;
  static constexpr std::size_t sequential_size = 1;
  static constexpr std::size_t tokens_per_sample = T;
  static constexpr auto param_specs() {
    return named_specs<TransformerBody<D, H, T>, 12>(
        {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
         "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
         "mlp.c_proj.weight", "mlp.c_proj.bias"});
  }
};

}  // namespace detail

/// GPT-2's pre-norm Transformer block of width D with H heads, as nanoGPT's Block without dropout:
/// x = x + attn(ln_1(x)), then y = x + mlp(ln_2(x)), mlp = `Linear<D, 4D>`, GELUTanh,
/// `Linear<4D, D>`.
/// One entry of nn.Sequential with nanoGPT's parameter names ("i.ln_1.weight",
/// "i.attn.c_attn.weight", ..., "i.mlp.c_proj.bias"); needs a token model (Embedding first).
template <std::size_t D, std::size_t H>
struct TransformerBlock : detail::HeadedSequenceLayer<D, H, detail::TransformerBlockOf> {};

}  // namespace gpipe
