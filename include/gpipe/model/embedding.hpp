#pragma once
// Embedding<V, T, D>: GPT-2's token + position embedding, the first layer of a token model.
//   y(b, t, :) = wte[id(b, t), :] + wpe[p(b, t), :]  wte (V, D) "wte.weight", wpe (T, D)
//   "wpe.weight"
// Its input rows are token ids, one per row, carried as floats (exact below 2^24); a sample is T
// consecutive rows, so row r is token t = r % T of its sample (micro-batches start at sample
// boundaries). Its position p is t, or with packed documents (the Args' `document`) t minus the
// first token of its run of equal ids in the sample: positions restart at 0 where a run starts.
// The ids are constant, so the input gradient is zero; W scatter-adds dy into the rows of wte
// that the ids name, in a deterministic order, and sums dy over samples into wpe.
//
// Fixing T makes the pipeline a token model (Pipeline::tokens_per_sample = T); it must be the
// pipeline's first layer. TokenEmbedding<V, T, D> is Llama's: the token table alone.

#include <array>
#include <cmath>
#include <cstddef>
#include <span>

#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe {

/// The kernels of Embedding, per backend (LayerKernels<EmbeddingOp, Ctx>):
///   forward(ctx, rows, T, D, ids (rows), wte (V, D), wpe (T, D), y (rows, D), document = nullptr)
///   backward_weight(ctx, rows, T, D, ids (rows), dy (rows, D), dwte (V, D) +=, dwpe (T, D) +=,
///                   document = nullptr)
/// document (rows) of std::int32_t, when not null, gives each row's document id: row r's position
/// (its row of wpe) is then its distance from the first row of its run of equal ids within its
/// sample (runs end at sample borders; two runs of one id are two documents), else r % T.
struct EmbeddingOp {};

/// GPT-2's token + position embedding, the first layer of a token model: V token ids, samples of
/// T tokens, width D. Input rows are token ids carried as floats (exact below 2^24); the output
/// row of token t of a sample is wte[id] + wpe[t], or with packed documents wte[id] + wpe[p], p
/// counted from 0 where t's run of equal document ids starts. Fixes the model's tokens per sample
/// to T.
template <std::size_t V, std::size_t T, std::size_t D>
struct Embedding {
  static_assert(V > 0 && T > 0 && D > 0, "gpipe: Embedding needs positive sizes");
  static_assert(V <= (std::size_t{1} << 24),
                "gpipe: Embedding's token ids travel as floats, exact up to 2^24 = 16777216");

  /// Token ids range over [0, V); Pipeline::vocab_size reports it.
  static constexpr std::size_t vocab_size = V;
  /// Rows per sample: row r of a micro-batch is position r % T (micro-batches start at samples).
  static constexpr std::size_t tokens_per_sample = T;
  static constexpr std::size_t in_features = 1;   ///< the token id
  static constexpr std::size_t out_features = D;  ///< The embedding width.
  /// wte (V * D floats, row-major) then wpe (T * D).
  static constexpr std::size_t num_params = V * D + T * D;
  static constexpr std::size_t stash_per_row = 0;       ///< W needs only the ids x and dy.
  static constexpr std::size_t grad_stash_per_row = 0;  ///< W needs nothing from B.

  /// "wte.weight" (V, D) at offset 0 and "wpe.weight" (T, D) at offset V * D, as GPT-2's names.
  static constexpr std::array<ParamSpec, 2> param_specs() {
    return {ParamSpec{.name = "wte.weight", .shape = {V, D}, .rank = 2, .offset = 0},
            ParamSpec{.name = "wpe.weight", .shape = {T, D}, .rank = 2, .offset = V * D}};
  }

  /// GPT-2's scale: standard deviation 0.02 (uniform in +-0.02 sqrt 3, as Rng draws uniformly).
  static void init(std::span<float> params, Rng& rng) {
    const float bound = 0.02f * std::sqrt(3.0f);
    for (float& p : params) p = rng.uniform(-bound, bound);
  }

  /// y (rows, D): row r = wte[x[r], :] + wpe[p_r, :], rows a whole number of samples; p_r is
  /// r % T, or its place in its document run (EmbeddingOp).
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<EmbeddingOp, Ctx>::forward(ctx, a.rows, T, D, a.x, a.params, a.params + V * D, a.y,
                                            a.document);
  }
  /// d(loss)/d(id) = 0: y is piecewise constant in the id.
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.fill(a.rows, typename Ctx::value_type(0.0f), a.dx);
  }
  /// dwte (V, D) += dy rows scatter-added at their ids (in a deterministic order), dwpe (T, D) +=
  /// dy rows scatter-added at their positions p_r (summed over the samples without documents).
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    LayerKernels<EmbeddingOp, Ctx>::backward_weight(ctx, a.rows, T, D, a.x, a.dy, a.grads,
                                                    a.grads + V * D, a.document);
  }
};

/// Llama's token embedding, the first layer of a token model: V token ids, samples of T tokens,
/// width D; the token table only, as Hugging Face's embed_tokens (positions enter later, by RoPE).
/// Input rows are token ids carried as floats; the output row of a token is wte[id]. Fixes the
/// model's tokens per sample to T. Runs on Embedding's kernels, without their position table.
template <std::size_t V, std::size_t T, std::size_t D>
struct TokenEmbedding {
  static_assert(V > 0 && T > 0 && D > 0, "gpipe: TokenEmbedding needs positive sizes");
  static_assert(V <= (std::size_t{1} << 24),
                "gpipe: TokenEmbedding's token ids travel as floats, exact up to 2^24 = 16777216");

  /// Token ids range over [0, V); Pipeline::vocab_size reports it.
  static constexpr std::size_t vocab_size = V;
  /// Rows per sample: T consecutive rows are one sample (micro-batches start at samples).
  static constexpr std::size_t tokens_per_sample = T;
  static constexpr std::size_t in_features = 1;         ///< the token id
  static constexpr std::size_t out_features = D;        ///< The embedding width.
  static constexpr std::size_t num_params = V * D;      ///< The table (V * D floats, row-major).
  static constexpr std::size_t stash_per_row = 0;       ///< W needs only the ids x and dy.
  static constexpr std::size_t grad_stash_per_row = 0;  ///< W needs nothing from B.

  /// "weight" (V, D) at offset 0: Hugging Face's "model.embed_tokens.weight" under its own name.
  static constexpr std::array<ParamSpec, 1> param_specs() {
    return {ParamSpec{.name = "weight", .shape = {V, D}, .rank = 2, .offset = 0}};
  }

  /// Standard deviation 0.02, Llama's initializer_range (uniform in +-0.02 sqrt 3, as Rng draws
  /// uniformly).
  static void init(std::span<float> params, Rng& rng) { Embedding<V, T, D>::init(params, rng); }

  /// y (rows, D): row r = wte[x[r], :].
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    LayerKernels<EmbeddingOp, Ctx>::forward(
        ctx, a.rows, T, D, a.x, a.params,
        static_cast<const master_t<typename Ctx::value_type>*>(nullptr), a.y);
  }
  /// d(loss)/d(id) = 0: y is piecewise constant in the id.
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.fill(a.rows, typename Ctx::value_type(0.0f), a.dx);
  }
  /// dwte (V, D) += dy rows scatter-added at their ids, in a deterministic order.
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    LayerKernels<EmbeddingOp, Ctx>::backward_weight(
        ctx, a.rows, T, D, a.x, a.dy, a.grads,
        static_cast<master_t<typename Ctx::value_type>*>(nullptr));
  }
};

}  // namespace gpipe
