#pragma once
// CausalSelfAttention<D, H>: GPT-2's multi-head causal self-attention over the T tokens of each
// sample (T from the model's Embedding), as nanoGPT's CausalSelfAttention without dropout:
//   qkv = x W_attn^T + b_attn                        c_attn: weight (3D, D), bias (3D)
//   q, k, v = the three D-wide thirds of qkv; head h takes columns [h d, (h + 1) d), d = D / H
//   S_h = q_h k_h^T / sqrt d,  P_h = softmax(S_h) over keys u <= t (query t)        (T, T)
//   o(:, h d : (h + 1) d) = P_h v_h
//   y = o W_proj^T + b_proj                          c_proj: weight (D, D), bias (D)
// It is a chain Linear<D, 3D>, the attention core, Linear<D, D>, so it keeps qkv (3D per row) and
// o (D, c_proj's input); the core keeps only each head's log-sum-exp per row,
//   L_t = log sum_{u <= t} e^(S_tu),
// never P, so nothing it keeps grows with T. With Remat::always all of it is recomputed;
// Remat::selective keeps all of it (the core is not cheap_to_recompute: o costs a whole attention
// forward, and the probabilities Megatron's selective recomputation drops are never stored).
// The core is flash attention (FlashAttention-2's order), per sample and head in tiles of query
// rows by key rows, so no (T, T) matrix is ever whole:
//   forward, per query tile, over its key tiles u <= t, an online softmax (m, l per row):
//     m' = max(m, rowmax S),  l = l e^(m - m') + rowsum e^(S - m'),
//     acc = acc e^(m - m') + e^(S - m') v,  m = m';   at the end o = acc / l, L = m + log l;
//   backward, first D_t = rowsum(do .* o) per head (= rowsum(dP .* P), since o = P v), then per
//   tile P recomputed from q, k and L:
//     P = e^(S - L),  dv += P^T do,  dP = do v^T,  dS = P .* (dP - D),
//     dq += dS k / sqrt d,  dk += dS^T q / sqrt d.
// So backward_input needs o, which the chain passes as BackwardInputArgs::y (c_proj keeps it).
// With packed documents (the Args' `document`) a token attends only to the tokens u <= t of its
// own run of equal ids in its sample (CausalAttentionOp's contract).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "gpipe/error.hpp"
#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/linear.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe {

/// Where the heads of one attention call lie, for the kernels of CausalAttentionOp: rows =
/// samples * tokens token rows, each sample's consecutive. A row of qkv (and of its gradient
/// dqkv) is `ld` elements; query head h < heads of width d = head_size is at columns
/// [q + h d, q + (h + 1) d), key and value head g < kv_heads at [k + g d, ...) and [v + g d, ...).
/// Query head h reads key/value head h / (heads / kv_heads) (grouped-query attention; GPT-2 has
/// kv_heads = heads). The output o and its gradient are (rows, heads d), dense.
struct AttentionGeometry {
  std::size_t samples = 0;    ///< sequences, `tokens` rows each
  std::size_t tokens = 0;     ///< T, rows per sample
  std::size_t heads = 0;      ///< H, query heads
  std::size_t kv_heads = 0;   ///< KVH, key/value heads: H is a multiple of it
  std::size_t head_size = 0;  ///< d, the width of every head
  std::size_t ld = 0;         ///< elements per row of qkv and dqkv
  std::size_t q = 0;          ///< first column of query head 0
  std::size_t k = 0;          ///< first column of key head 0
  std::size_t v = 0;          ///< first column of value head 0

  /// GPT-2's packing: q, k, v the three H d-wide thirds of a 3 H d row, kv_heads = heads.
  static constexpr AttentionGeometry packed(std::size_t samples, std::size_t tokens,
                                            std::size_t heads, std::size_t head_size) {
    const std::size_t D = heads * head_size;
    return {samples, tokens, heads, heads, head_size, 3 * D, 0, D, 2 * D};
  }
  /// samples * tokens.
  constexpr std::size_t rows() const { return samples * tokens; }
  /// Query heads per key/value head, H / KVH.
  constexpr std::size_t group() const { return heads / kv_heads; }
  /// The key/value head that query head h reads.
  constexpr std::size_t kv_head(std::size_t h) const { return h / group(); }

  /// Throws `gpipe::Error` unless heads, kv_heads and head_size are positive, heads is a multiple
  /// of kv_heads, and every head lies inside a row.
  void check() const {
    const std::string shape = "(heads " + std::to_string(heads) + ", kv_heads " +
                              std::to_string(kv_heads) + ", head_size " +
                              std::to_string(head_size) + ")";
    detail::require(heads > 0 && kv_heads > 0 && head_size > 0,
                    "attention needs positive heads, kv_heads and head_size " + shape);
    detail::require(heads % kv_heads == 0,
                    "attention's query heads must be a multiple of its key/value heads " + shape);
    detail::require(q + heads * head_size <= ld && k + kv_heads * head_size <= ld &&
                        v + kv_heads * head_size <= ld,
                    "attention's q, k and v heads " + shape + " at columns " + std::to_string(q) +
                        ", " + std::to_string(k) + ", " + std::to_string(v) +
                        " do not fit in a row of " + std::to_string(ld));
  }
};

/// The kernels of the attention core, per backend (LayerKernels<CausalAttentionOp, Ctx>), T the
/// context's value_type, g an AttentionGeometry (the core's top of file has the algorithm):
///   forward(ctx, g, qkv (rows, ld), o (rows, H d) out, lse (rows, H) out, document = nullptr)
///   backward(ctx, g, qkv, o, lse, do (rows, H d), dqkv (rows, ld) out, delta (rows, H) scratch,
///            document = nullptr)
/// lse and delta are master_t<T> (float for bf16): lse the forward's log-sum-exp of each query
/// row's scaled scores, delta scratch for rowsum(do .* o). backward overwrites the q, k and v
/// heads of dqkv and leaves its other columns alone. `document` (rows) of std::int32_t, when not
/// null, masks further: token t attends only to the tokens u <= t of its own run of equal ids in
/// its sample (two runs of one id are two documents), which for ids that differ run to run is
/// "the same document id".
struct CausalAttentionOp {};

namespace detail {

// master_view(p, what): p viewed as the (rows, n) array of master_t<T> that a layer keeps in a
// buffer of 2n elements of T per row (its stash or workspace): master_t<T> is float for bf16 and T
// itself for float and double, so 2n elements hold n of them. Throws `gpipe::Error` where the
// buffer is not aligned for master_t<T> (a bf16 buffer at an odd element offset), naming `what`.
template <class T>
auto* master_view(T* p, const char* what) {
  using M = master_t<std::remove_const_t<T>>;
  static_assert(sizeof(M) <= 2 * sizeof(T), "gpipe: 2 elements per value hold a master_t value");
  using View = std::conditional_t<std::is_const_v<T>, const M*, M*>;
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(M) != 0)
    throw Error(std::string("gpipe: a layer's ") + what + " is not aligned for its " +
                std::to_string(sizeof(M)) +
                "-byte values (a bf16 buffer at an odd offset: keep every width before it in its "
                "chain even)");
  return reinterpret_cast<View>(p);
}

// The parameter-free core, grouped-query: qkv rows of (H + 2 KVH) hd = [q heads | k heads |
// v heads] -> (rows, H hd) o, scale 1 / sqrt(hd), masked by the args' document ids; query head h
// reads key/value head h / (H / KVH). GPT-2's is KVH = H (CausalAttentionCore), Llama's
// LlamaBlock's KVH <= H.
template <std::size_t H, std::size_t KVH, std::size_t hd, std::size_t T>
struct GroupedAttentionCore : ParameterFree {
  static constexpr std::size_t in_features = (H + 2 * KVH) * hd;
  static constexpr std::size_t out_features = H * hd;
  // Each head's log-sum-exp L: H master_t values in 2H elements (detail::master_view).
  static constexpr std::size_t stash_per_row = 2 * H;
  static constexpr std::size_t grad_stash_per_row = 0;
  // backward: D_t = rowsum(do .* o) per head, H master_t values in 2H elements.
  static constexpr std::size_t workspace_per_row = 2 * H;

  static constexpr AttentionGeometry geometry(std::size_t rows) {
    return {rows / T, T, H, KVH, hd, in_features, 0, H * hd, (H + KVH) * hd};
  }

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<CausalAttentionOp, Ctx>::forward(ctx, geometry(a.rows), a.x, a.y,
                                                  master_view(a.stash, "stash"), a.document);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    require(a.y != nullptr,
            "the attention core's backward needs its output o (BackwardInputArgs::y), which a "
            "Chain passes to every layer but its last");
    LayerKernels<CausalAttentionOp, Ctx>::backward(
        ctx, geometry(a.rows), a.x, a.y, master_view(a.stash, "stash"), a.dy, a.dx,
        master_view(a.workspace, "workspace"), a.document);
  }
};

// GPT-2's core: (rows, 3D) qkv -> (rows, D) o, H heads of D / H (AttentionGeometry::packed).
template <std::size_t D, std::size_t H, std::size_t T>
using CausalAttentionCore = GroupedAttentionCore<H, H, D / H, T>;

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
/// in its sample (with packed documents, in its run of equal document ids). One entry of
/// nn.Sequential with parameters "i.c_attn.weight" (3D, D), "i.c_attn.bias" (3D), "i.c_proj.weight"
/// (D, D), "i.c_proj.bias" (D). Stashes 4D + 2H elements per row whatever T (qkv, o, and each
/// head's log-sum-exp: flash attention, no probabilities); its backward needs 2H elements of
/// workspace per row; needs a token model (Embedding first).
template <std::size_t D, std::size_t H>
struct CausalSelfAttention : detail::HeadedSequenceLayer<D, H, detail::CausalSelfAttentionOf> {};

}  // namespace gpipe
