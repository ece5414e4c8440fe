#pragma once
// Stage<Layers...>: the layers one device runs, in order. A Stage is a specification: its width
// comes from its first layer, or from the stage before it when the first layer is width-generic;
// Stage::bound<N, T> is the concrete chain (a gpipe::layer) when N features come in, in a model
// of T tokens per sample (0: rows are independent samples).

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {

/// The layers one device runs, in order: a specification whose width comes from its first layer,
/// or from the stage before when that layer is width-generic; `bound` is the concrete chain.
/// (Layers is not constrained by layer_spec: the body's static_assert names what a layer lacks.)
template <class... Layers>
struct Stage {
  static_assert(sizeof...(Layers) > 0, "gpipe: a Stage needs at least one layer");
  static_assert((detail::explain_layer_spec<Layers>() && ...),
                "gpipe: every layer of a Stage must be a layer_spec (the error above names what "
                "it lacks)");

  /// Entries of nn.Sequential (a Checkpoint counts the layers it wraps).
  static constexpr std::size_t num_layers = (std::size_t{0} + ... + sequential_size_v<Layers>);
  /// The width the first layer fixes, or 0 when only the stage before can tell; a Pipeline's
  /// first stage must fix it.
  static constexpr std::size_t natural_in_features =
      detail::natural_in_features_v<std::tuple_element_t<0, std::tuple<Layers...>>>;

  /// The first layer spec as written (unbound), such as the Embedding of a token model.
  using first_layer = std::tuple_element_t<0, std::tuple<Layers...>>;

  /// T that the stage's first layer fixes (an Embedding's), 0 if none.
  static constexpr std::size_t tokens_per_sample = detail::tokens_per_sample_v<first_layer>;

  /// The concrete chain (a gpipe::layer) when N features come in, in a model of T tokens per
  /// sample (0: rows are independent samples). S: the stage's index in its Pipeline, for errors;
  /// `detail::no_stage` outside one.
  template <std::size_t N, std::size_t T = 0, std::size_t S = detail::no_stage>
  using bound = detail::bind_chain_at_t<N, T, S, Layers...>;
};

namespace detail {
template <class Layer, class Indices>
struct repeat_stage;
template <class Layer, std::size_t... I>
struct repeat_stage<Layer, std::index_sequence<I...>> {
  template <std::size_t>
  using same = Layer;
  using type = Stage<same<I>...>;
};
}  // namespace detail

/// repeat_stage_t<Layer, N> = Stage<Layer, ..., Layer> (N times): deep uniform stages for tests,
/// benchmarks and models built from identical blocks.
template <layer_spec Layer, std::size_t N>
using repeat_stage_t = typename detail::repeat_stage<Layer, std::make_index_sequence<N>>::type;

namespace detail {
template <class T>
struct is_stage : std::false_type {};
template <class... Ls>
struct is_stage<Stage<Ls...>> : std::true_type {};
}  // namespace detail

/// `stage<S>`: S is a `gpipe::Stage<...>`.
template <class S>
concept stage = detail::is_stage<S>::value;

}  // namespace gpipe
