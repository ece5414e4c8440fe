#pragma once
// Pipeline<Stages...>: the model, K = sizeof...(Stages) stages, one per device.
//
//   Pipeline<Stage<A, B>, Stage<C>>::stage_t<1>      = the bound chain of stage 1 (a gpipe::layer)
//   Pipeline<...>::layer_offset[s]                   = global index of stage s's first layer
//   Pipeline<...>::tokens_per_sample                 = rows per sample: T of a token model
//                                                      (one starting with Embedding<V, T, D>), else
//                                                      1
// Parameters are named as in a PyTorch nn.Sequential over all layers of all stages in order:
// "i.weight", "i.bias", and "i.j.weight" for a child j of a composite layer i.

#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/stage.hpp"

namespace gpipe {
namespace detail {

// Stage I onwards, N features coming into stage I.
template <std::size_t N, std::size_t T, std::size_t I, class... Stages>
struct bind_stages;
template <std::size_t N, std::size_t T, std::size_t I>
struct bind_stages<N, T, I> {
  using type = std::tuple<>;
};
template <std::size_t N, std::size_t T, std::size_t I, class S, class... Rest>
struct bind_stages<N, T, I, S, Rest...> {
  using head = typename S::template bound<N, T, I>;
  using type = decltype(std::tuple_cat(
      std::declval<std::tuple<head>>(),
      std::declval<typename bind_stages<head::out_features, T, I + 1, Rest...>::type>()));
};

}  // namespace detail

/// One parameter tensor of a model: its PyTorch name, shape, stage and offset in the stage's
/// flat parameter array.
struct ParameterInfo {
  /// nn.Sequential name over the whole model: "i.weight", "i.j.bias", "i.attn.c_attn.weight".
  std::string name;
  /// Row-major extents, 1 or 2 of them.
  std::vector<std::size_t> shape;
  /// Index of the stage (and so the device) that holds the tensor.
  std::size_t stage = 0;
  /// Offset in floats of the first element in that stage's flat parameter array.
  std::size_t offset = 0;
  /// Number of elements, the product of `shape`.
  std::size_t size = 0;
};

/// The model: K = sizeof...(Stages) stages, one per device, each bound to the width the one before
/// gives. Parameters are named as in a PyTorch nn.Sequential over all layers of all stages.
template <stage... Stages>
struct Pipeline {
  static_assert(sizeof...(Stages) > 0, "gpipe: a Pipeline needs at least one stage");

  /// The first Stage spec; its first layer must fix the input width.
  using first_stage = std::tuple_element_t<0, std::tuple<Stages...>>;
  static_assert(first_stage::natural_in_features > 0,
                "gpipe: the first layer of a Pipeline must fix its input width (e.g. Linear<In, "
                "Out> or LayerNorm<N>), since no layer comes before it");

  /// A token model starts with a layer that fixes T tokens per sample (Embedding<V, T, D>): its
  /// rows are tokens, T consecutive rows make a sample, and micro-batches split between samples.
  static constexpr bool is_token_model = first_stage::tokens_per_sample > 0;
  /// Rows per sample: T of a token model, else 1.
  static constexpr std::size_t tokens_per_sample =
      is_token_model ? first_stage::tokens_per_sample : 1;

  /// Token ids a token model takes: [0, vocab_size), its Embedding's V.
  static constexpr std::size_t vocab_size = [] {
    if constexpr (requires { first_stage::first_layer::vocab_size; })
      return std::size_t{first_stage::first_layer::vocab_size};
    else
      return std::size_t{0};
  }();

  /// `std::tuple` of the bound stages, each a gpipe::layer; `stage_t<S>` picks one.
  using stages = typename detail::bind_stages<first_stage::natural_in_features,
                                              first_stage::tokens_per_sample, 0, Stages...>::type;
  /// The bound chain of stage S, a gpipe::layer whose input is stage S - 1's output.
  template <std::size_t S>
  using stage_t = std::tuple_element_t<S, stages>;

  static constexpr std::size_t num_stages = sizeof...(Stages);  ///< K, one device each.
  /// Width of the model's input rows (1, the token id, for a token model).
  static constexpr std::size_t in_features = stage_t<0>::in_features;
  /// Width of the last stage's output, which the loss takes (classes for SoftmaxCrossEntropy).
  static constexpr std::size_t out_features = stage_t<num_stages - 1>::out_features;
  /// Entries of nn.Sequential over all stages (a Checkpoint counts the layers it wraps).
  static constexpr std::size_t num_layers = (std::size_t{0} + ... + Stages::num_layers);

 private:
  template <std::size_t... S>
  static constexpr std::array<std::size_t, num_stages> stage_param_counts(
      std::index_sequence<S...>) {
    return {stage_t<S>::num_params...};
  }

 public:
  /// Parameters (floats) of each stage.
  static constexpr std::array<std::size_t, num_stages> stage_num_params =
      stage_param_counts(std::make_index_sequence<num_stages>{});
  /// Parameters (floats) of the whole model.
  static constexpr std::size_t num_params = [] {
    std::size_t n = 0;
    for (std::size_t p : stage_num_params) n += p;
    return n;
  }();
  /// Global nn.Sequential index of each stage's first layer (0 for stage 0).
  static constexpr std::array<std::size_t, num_stages> layer_offset = [] {
    std::array<std::size_t, num_stages> out{};
    const std::array<std::size_t, num_stages> counts{Stages::num_layers...};
    for (std::size_t s = 1; s < num_stages; ++s) out[s] = out[s - 1] + counts[s - 1];
    return out;
  }();

  /// Every parameter tensor in nn.Sequential order.
  static std::vector<ParameterInfo> parameters() {
    std::vector<ParameterInfo> out;
    [&]<std::size_t... S>(std::index_sequence<S...>) { (append_stage<S>(out), ...); }
    (std::make_index_sequence<num_stages>{});
    return out;
  }

 private:
  template <std::size_t S>
  static void append_stage(std::vector<ParameterInfo>& out) {
    for (const ParamSpec& spec : stage_t<S>::param_specs()) {
      ParameterInfo info;
      info.name = std::to_string(layer_offset[S] + spec.path[0]);
      for (std::size_t d = 1; d < spec.depth; ++d) {
        info.name += '.';  // not "." + to_string(...): GCC 12 -O3 warns falsely (-Wrestrict)
        info.name += std::to_string(spec.path[d]);
      }
      info.name += ".";
      info.name += spec.name;
      info.shape.assign(spec.shape.begin(), spec.shape.begin() + spec.rank);
      info.stage = S;
      info.offset = spec.offset;
      info.size = spec.size();
      out.push_back(std::move(info));
    }
  }
};

}  // namespace gpipe
