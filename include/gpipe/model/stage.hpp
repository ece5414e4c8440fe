#pragma once
// Stage<Layers...>: the layers one device runs, in order. A Stage is a specification: its width
// comes from its first layer, or from the stage before it when the first layer is width-generic;
// Stage::bound<N> is the concrete chain (a gpipe::layer) when N features come in.

#include <cstddef>
#include <tuple>
#include <type_traits>

#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {

template <layer_spec... Layers>
struct Stage {
  static_assert(sizeof...(Layers) > 0, "gpipe: a Stage needs at least one layer");

  static constexpr std::size_t num_layers = sizeof...(Layers);
  static constexpr std::size_t natural_in_features =
      detail::natural_in_features_v<std::tuple_element_t<0, std::tuple<Layers...>>>;

  template <std::size_t N>
  using bound = detail::bind_chain_t<N, Layers...>;
};

namespace detail {
template <class T>
struct is_stage : std::false_type {};
template <class... Ls>
struct is_stage<Stage<Ls...>> : std::true_type {};
}  // namespace detail

// stage<S>: S is a gpipe::Stage<...>.
template <class S>
concept stage = detail::is_stage<S>::value;

}  // namespace gpipe
