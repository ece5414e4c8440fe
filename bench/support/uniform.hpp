#pragma once
// Models of identical blocks for the benchmarks: uniform_pipeline_t<K, B, Block> is a Pipeline of
// K stages of B Blocks each.

#include <cstddef>
#include <gpipe/model.hpp>
#include <utility>

namespace gpipe::bench {

template <std::size_t K, std::size_t B, class Block, class Seq = std::make_index_sequence<K>>
struct UniformPipeline;
template <std::size_t K, std::size_t B, class Block, std::size_t... S>
struct UniformPipeline<K, B, Block, std::index_sequence<S...>> {
  template <std::size_t>
  using stage = repeat_stage_t<Block, B>;
  using type = Pipeline<stage<S>...>;
};

template <std::size_t K, std::size_t B, class Block>
using uniform_pipeline_t = typename UniformPipeline<K, B, Block>::type;

}  // namespace gpipe::bench
