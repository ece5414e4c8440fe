#pragma once
// What a layer costs, from its static shapes, and the cut of a model into stages that balances
// that cost.
//
//   gpipe::layer_cost<L>()                 LayerCost of a bound layer: FLOPs per row, forward and
//                                          backward (B and W together)
//   gpipe::balanced_cut(costs, K)          the cut of layers with these costs into K contiguous
//                                          non-empty stages whose largest stage costs least
//   gpipe::balanced_pipeline_t<K, Ls...>   Pipeline<Stage<...>...> over Ls in order, cut so
//
// The cost model counts multiply-adds as 2 FLOPs:
//   - a weight matrix (a rank-2 parameter tensor) of E elements: 2 E forward (x W^T), 4 E backward
//     (dx = dy W and dW += dy^T x); Linear<In, Out> so costs 2 In Out and 4 In Out per row;
//   - Embedding: a lookup and a sum, D per row forward and 2 D backward ("about nothing");
//     TokenEmbedding: a lookup, D forward and D backward;
//   - the causal attention core (T tokens, width D): q k^T and P v, 4 T D per row forward, and
//     the four products of backward, 8 T D (computed whole, as the kernels do); the grouped core
//     of LlamaBlock likewise with D = H hd, its query heads' width (key/value heads are shared,
//     not fewer products);
//   - every other layer: one FLOP per input and output element forward, two backward (LayerNorm,
//     activations, residual sums: memory-bound work that is small beside the GEMMs);
//   - composite layers (Chain, Residual, TransformerBlock, CausalSelfAttention, LlamaBlock) sum
//   their
//     children, a Residual adds its sum; a Checkpoint adds its body's forward to its backward
//     (recomputed there).
// A layer of your own may declare `static constexpr gpipe::LayerCost cost_per_row()`, which
// layer_cost then uses.

#include <array>
#include <cstddef>
#include <limits>
#include <tuple>
#include <utility>

#include "gpipe/error.hpp"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/checkpoint.hpp"
#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/embedding.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/llama.hpp"
#include "gpipe/model/pipeline.hpp"
#include "gpipe/model/residual.hpp"
#include "gpipe/model/stage.hpp"

namespace gpipe {

/// FLOPs per row of a layer (see the top of this file).
struct LayerCost {
  double forward = 0;   ///< F
  double backward = 0;  ///< B and W together
  /// forward + backward: what a training step spends on a row.
  constexpr double total() const { return forward + backward; }
  /// The costs of two layers run one after the other.
  constexpr LayerCost operator+(const LayerCost& o) const {
    return {forward + o.forward, backward + o.backward};
  }
};

template <class L>
constexpr LayerCost layer_cost();

namespace detail {

// The default: weight matrices as GEMMs, plus one FLOP per input and output element.
template <class L>
constexpr LayerCost default_layer_cost() {
  double matrix = 0;
  for (const ParamSpec& s : L::param_specs())
    if (s.rank == 2) matrix += static_cast<double>(s.size());
  const double elements = static_cast<double>(L::in_features + L::out_features);
  return {2 * matrix + elements, 4 * matrix + 2 * elements};
}

template <class... Bs>
constexpr LayerCost chain_cost(const Chain<Bs...>*) {
  return (LayerCost{} + ... + layer_cost<Bs>());
}
template <class Body>
constexpr LayerCost residual_cost(const ResidualOf<Body>*) {
  const auto width = static_cast<double>(Body::out_features);
  return layer_cost<Body>() + LayerCost{width, width};
}
template <class Body>
constexpr LayerCost checkpoint_cost(const CheckpointOf<Body>*) {
  const LayerCost body = layer_cost<Body>();
  return {body.forward, body.backward + body.forward};
}

template <class L>
struct LeafCost {
  static constexpr LayerCost value = default_layer_cost<L>();
};
template <std::size_t V, std::size_t T, std::size_t D>
struct LeafCost<Embedding<V, T, D>> {
  static constexpr LayerCost value{static_cast<double>(D), 2.0 * static_cast<double>(D)};
};
template <std::size_t V, std::size_t T, std::size_t D>
struct LeafCost<TokenEmbedding<V, T, D>> {
  static constexpr LayerCost value{static_cast<double>(D), static_cast<double>(D)};
};
template <std::size_t H, std::size_t KVH, std::size_t hd, std::size_t T>
struct LeafCost<GroupedAttentionCore<H, KVH, hd, T>> {
  static constexpr double td = static_cast<double>(T) * static_cast<double>(H * hd);
  static constexpr LayerCost value{4 * td, 8 * td};
};

// Layers' costs in order, from the bound chain.
template <class... Bs>
constexpr std::array<LayerCost, sizeof...(Bs)> chain_costs(const Chain<Bs...>*) {
  return {layer_cost<Bs>()...};
}

}  // namespace detail

/// The FLOPs per row of the bound layer L: its own cost_per_row() if it declares one, else the
/// model at the top of this file.
template <class L>
constexpr LayerCost layer_cost() {
  constexpr const L* p = nullptr;
  if constexpr (requires { L::cost_per_row(); }) {
    return L::cost_per_row();
  } else if constexpr (requires { detail::checkpoint_cost(p); }) {
    return detail::checkpoint_cost(p);
  } else if constexpr (requires { detail::residual_cost(p); }) {
    return detail::residual_cost(p);
  } else if constexpr (requires { detail::chain_cost(p); }) {
    return detail::chain_cost(p);
  } else {
    return detail::LeafCost<L>::value;
  }
}

/// The cut of N layers of these costs into `stages` contiguous non-empty stages that minimizes
/// the largest stage's cost, and among those the sum of the stages' squared costs (so that the
/// stages besides the bottleneck are balanced too); among equal ones the first in lexicographic
/// order. Entry s is stage s's first layer, entries from `stages` on are N. Dynamic programming,
/// O(stages N^2). Throws gpipe::Error when stages is 0 or above N.
template <std::size_t N>
constexpr std::array<std::size_t, N + 1> balanced_cut(const std::array<double, N>& costs,
                                                      std::size_t stages) {
  if (stages == 0 || stages > N) throw Error("gpipe: balanced_cut needs 1 <= stages <= layers");
  std::array<double, N + 1> prefix{};
  for (std::size_t i = 0; i < N; ++i) prefix[i + 1] = prefix[i] + costs[i];
  auto range = [&](std::size_t b, std::size_t e) { return prefix[e] - prefix[b]; };
  constexpr double inf = std::numeric_limits<double>::infinity();
  // worst[k][i]: the least largest stage cost of layers [i, N) in k stages
  std::array<std::array<double, N + 1>, N + 1> worst{};
  for (auto& row : worst) row.fill(inf);
  worst[0][N] = 0;
  for (std::size_t k = 1; k <= stages; ++k)
    for (std::size_t i = 0; i + k <= N; ++i)
      for (std::size_t e = i + 1; e + (k - 1) <= N; ++e) {
        const double w = range(i, e) > worst[k - 1][e] ? range(i, e) : worst[k - 1][e];
        if (w < worst[k][i]) worst[k][i] = w;
      }
  const double best = worst[stages][0];
  // squares[k][i]: the least sum of squared stage costs of layers [i, N) in k stages of at most
  // `best` each, summed from the last stage to the first
  std::array<std::array<double, N + 1>, N + 1> squares{};
  for (auto& row : squares) row.fill(inf);
  squares[0][N] = 0;
  auto term = [&](std::size_t k, std::size_t i, std::size_t e) {
    const double r = range(i, e);
    return r <= best && squares[k - 1][e] < inf ? r * r + squares[k - 1][e] : inf;
  };
  for (std::size_t k = 1; k <= stages; ++k)
    for (std::size_t i = 0; i + k <= N; ++i)
      for (std::size_t e = i + 1; e + (k - 1) <= N; ++e) {
        const double t = term(k, i, e);
        if (t < squares[k][i]) squares[k][i] = t;
      }
  std::array<std::size_t, N + 1> cut{};
  cut.fill(N);
  cut[0] = 0;
  for (std::size_t s = 0; s + 1 < stages; ++s) {  // the first end that keeps both optima
    const std::size_t k = stages - s;
    for (std::size_t e = cut[s] + 1; e + (k - 1) <= N; ++e)
      if (term(k, cut[s], e) == squares[k][cut[s]]) {
        cut[s + 1] = e;
        break;
      }
  }
  return cut;
}

namespace detail {

template <class Tuple, std::size_t Begin, class Seq>
struct stage_slice;
template <class Tuple, std::size_t Begin, std::size_t... I>
struct stage_slice<Tuple, Begin, std::index_sequence<I...>> {
  using type = Stage<std::tuple_element_t<Begin + I, Tuple>...>;
};
template <class Tuple, auto Cut, class Stages>
struct cut_pipeline;
template <class Tuple, auto Cut, std::size_t... S>
struct cut_pipeline<Tuple, Cut, std::index_sequence<S...>> {
  using type = Pipeline<
      typename stage_slice<Tuple, Cut[S], std::make_index_sequence<Cut[S + 1] - Cut[S]>>::type...>;
};

template <std::size_t K, class... Layers>
struct balanced_pipeline {
  static_assert(K >= 1, "gpipe: balanced_pipeline_t needs at least one stage");
  static_assert(K <= sizeof...(Layers),
                "gpipe: balanced_pipeline_t<K, Layers...> needs at least K layers (every stage "
                "holds one)");
  using first = std::tuple_element_t<0, std::tuple<Layers...>>;
  static_assert(natural_in_features_v<first> > 0,
                "gpipe: the first layer of balanced_pipeline_t must fix its input width");
  // The layers bound as a Pipeline binds them (widths flow across stage boundaries unchanged).
  using bound = bind_chain_t<natural_in_features_v<first>, tokens_per_sample_v<first>, Layers...>;
  static constexpr std::array<double, sizeof...(Layers)> costs = [] {
    constexpr auto each = chain_costs(static_cast<const bound*>(nullptr));
    std::array<double, sizeof...(Layers)> out{};
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = each[i].total();
    return out;
  }();
  static constexpr auto cut_with_end = balanced_cut(costs, K);
  static constexpr std::array<std::size_t, K + 1> cut = [] {
    std::array<std::size_t, K + 1> c{};
    for (std::size_t s = 0; s < K; ++s) c[s] = cut_with_end[s];
    c[K] = sizeof...(Layers);
    return c;
  }();
  using type = typename cut_pipeline<std::tuple<Layers...>, cut, std::make_index_sequence<K>>::type;
};

}  // namespace detail

/// Pipeline<Stage<...>...> over Layers in order, K non-empty stages cut by balanced_cut on
/// layer_cost's total per layer (forward plus backward FLOPs from the static shapes).
template <std::size_t K, layer_spec... Layers>
using balanced_pipeline_t = typename detail::balanced_pipeline<K, Layers...>::type;

/// The cut balanced_pipeline_t<K, Layers...> makes: entry s is stage s's first layer, entry K
/// the number of layers.
template <std::size_t K, layer_spec... Layers>
inline constexpr std::array<std::size_t, K + 1> balanced_cut_v =
    detail::balanced_pipeline<K, Layers...>::cut;

}  // namespace gpipe
