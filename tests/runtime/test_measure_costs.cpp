// The measured variant of the balanced cut (gpipe/runtime/measure_costs.hpp): every layer of an
// MLP and of a small GPT timed on the host backend (positive, finite: times are never compared,
// machines are noisy), the cut of the measured totals, and the Pipeline type printed for a cut.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <string>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/measure_costs.hpp"

using namespace gpipe;

TEST_CASE("measure_layer_costs times every layer; the cut of the totals is a cut") {
  host::Backend backend(1);
  const auto mlp = measure_layer_costs<Linear<8, 64>, ReLU, Linear<64, 8>>(backend, 16, 2);
  for (const LayerCost& c : mlp) {
    CHECK(c.forward > 0);
    CHECK(c.backward > 0);
    CHECK(std::isfinite(c.total()));
  }
  constexpr std::size_t V = 23, T = 4, D = 8;
  using B = TransformerBlock<D, 2>;
  const auto gpt =
      measure_layer_costs<Embedding<V, T, D>, B, LayerNorm<D>, Linear<D, V>>(backend, 3);
  for (const LayerCost& c : gpt) CHECK(c.total() > 0);
  const auto cut = balanced_cut(totals(gpt), 2);
  CHECK(cut[0] == 0);
  CHECK(cut[1] > 0);
  CHECK(cut[1] < 4);
  CHECK(cut[2] == 4);
  CHECK_THROWS_AS((measure_layer_costs<Linear<2, 2>>(backend, 0)), Error);
  // the backend is left as it was: nothing allocated stays counted
  CHECK(backend.memory_stats(0).current == 0);
}

TEST_CASE("pipeline_type_name spells the cut as C++") {
  const std::string name = pipeline_type_name<Linear<8, 64>, ReLU, Linear<64, 8>>({0, 2, 3, 3}, 2);
  CHECK(name.starts_with("gpipe::Pipeline<gpipe::Stage<gpipe::Linear<8, 64"));
  CHECK(name.find(">, gpipe::ReLU>, gpipe::Stage<gpipe::Linear<64, 8") != std::string::npos);
  CHECK(name.ends_with(">>>"));
  CHECK_THROWS_AS((pipeline_type_name<Linear<8, 64>, ReLU>({0, 1, 1}, 2)), Error);
}
