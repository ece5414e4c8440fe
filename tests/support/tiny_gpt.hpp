#pragma once
// A GPT small enough for the CUDA emulator, in two and in four stages, and random token ids for
// it: what the emulated step tests (CUDA Graphs, activation offload) train.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/model.hpp"

namespace gpipe::test::tiny_gpt {

inline constexpr std::size_t V = 7, T = 4, D = 8, H = 2;
using Emb = Embedding<V, T, D>;
using Block = TransformerBlock<D, H>;
using Gpt2 = Pipeline<Stage<Emb, Block>, Stage<Block, LayerNorm<D>, Linear<D, V>>>;
using Gpt4 = Pipeline<Stage<Emb>, Stage<Block>, Stage<Block>, Stage<LayerNorm<D>, Linear<D, V>>>;

// n token ids below V, from `seed`.
inline std::vector<std::int32_t> random_ids(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> out(n);
  for (std::int32_t& t : out) t = static_cast<std::int32_t>(rng.next_u64() % V);
  return out;
}

}  // namespace gpipe::test::tiny_gpt
