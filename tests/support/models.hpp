#pragma once
// One sequence of layers, split into K = 1..4 stages: the models of the runtime tests. Splits
// start stages with sized, width-generic and composite layers, so every binding path is used.
//
//   0 Linear<6,16>  1 ReLU  2 Linear<16,16>  3 GELU  4 LayerNorm<16>
//   5 Residual<Linear<16,8>, GELU, Linear<8,16>>  6 Linear<16,5>

#include <cstdint>
#include <vector>

#include "gpipe/model.hpp"

namespace gpipe::test {

using L0 = Linear<6, 16>;
using L1 = ReLU;
using L2 = Linear<16, 16>;
using L3 = GELU;
using L4 = LayerNorm<16>;
using L5 = Residual<Linear<16, 8>, GELU, Linear<8, 16>>;
using L6 = Linear<16, 5>;

using Model1 = Pipeline<Stage<L0, L1, L2, L3, L4, L5, L6>>;
using Model2 = Pipeline<Stage<L0, L1, L2>, Stage<L3, L4, L5, L6>>;
using Model3 = Pipeline<Stage<L0, L1>, Stage<L2, L3, L4>, Stage<L5, L6>>;
using Model4 = Pipeline<Stage<L0>, Stage<L1, L2, L3>, Stage<L4, L5>, Stage<L6>>;

// Inputs with structure enough to exercise every layer: uniform in [-1, 1).
inline std::vector<float> random_inputs(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
  return x;
}

inline std::vector<std::int32_t> random_classes(std::size_t rows, std::size_t classes,
                                                std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> y(rows);
  for (auto& v : y) v = static_cast<std::int32_t>(rng.next_u64() % classes);
  return y;
}

}  // namespace gpipe::test
