// The static cost model (gpipe/model/cost.hpp) and the balanced cut: layer costs by hand for
// Linear, Embedding, the attention core, a Transformer block and a Checkpoint; balanced_cut
// against brute force over every cut of random costs; balanced_pipeline_t's stages for an MLP
// and for a GPT whose head outweighs its blocks; the balanced GPT trains as the hand-cut one.

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "gpipe/gpipe.hpp"

namespace {

using namespace gpipe;

// Every cut of n layers into k non-empty stages in lexicographic order; the first whose largest
// stage is least, and among those whose sum of squared stage costs (summed from the last stage
// to the first, as balanced_cut does) is least.
template <std::size_t N>
std::vector<std::size_t> brute_force_cut(const std::array<double, N>& costs, std::size_t k) {
  std::vector<std::size_t> cut(k + 1), best;
  double best_max = std::numeric_limits<double>::infinity(), best_squares = best_max;
  auto visit = [&](auto& self, std::size_t s) -> void {
    if (s == k) {
      double worst = 0, squares = 0;
      for (std::size_t i = k; i-- > 0;) {
        double sum = 0;
        for (std::size_t l = cut[i]; l < cut[i + 1]; ++l) sum += costs[l];
        worst = std::max(worst, sum);
        squares = sum * sum + squares;
      }
      if (worst < best_max || (worst == best_max && squares < best_squares))
        best_max = worst, best_squares = squares, best = cut;
      return;
    }
    // stage s starts at cut[s]; choose its end, leaving a layer for each later stage
    for (std::size_t e = cut[s] + 1; e + (k - s - 1) <= N; ++e) {
      cut[s + 1] = e;
      if (s + 1 == k && e != N) continue;
      self(self, s + 1);
    }
  };
  cut[0] = 0;
  visit(visit, 0);
  return best;
}

}  // namespace

TEST_CASE("layer_cost: GEMMs at 2 and 4 FLOPs per weight, attention 4 and 8 T D per row") {
  static_assert(layer_cost<Linear<3, 5>>().forward == 2 * 15 + 8);
  static_assert(layer_cost<Linear<3, 5>>().backward == 4 * 15 + 16);
  static_assert(layer_cost<Embedding<100, 8, 16>>().total() == 3 * 16);
  static_assert(layer_cost<detail::CausalAttentionCore<16, 2, 8>>().forward == 4 * 8 * 16);
  // a block: 12 D^2 weights, the core, and the cheap rest (LayerNorms, GELU, biases, sums)
  constexpr std::size_t D = 16, T = 8;
  using Block = detail::bound_layer_t<TransformerBlock<D, 2>, D, T>;
  constexpr LayerCost block = layer_cost<Block>();
  constexpr double gemm = 6.0 * 12 * D * D, attention = 12.0 * T * D;
  static_assert(block.total() > gemm + attention);
  static_assert(block.total() < gemm + attention + 3 * 40.0 * D);  // under 40 FLOPs per element
  // a Checkpoint recomputes its body's forward in backward
  using Ck = detail::bound_layer_t<Checkpoint<Linear<4, 4>, ReLU>, 4, 0>;
  constexpr LayerCost body = layer_cost<Linear<4, 4>>() + layer_cost<ReLU::with_features<4>>();
  static_assert(layer_cost<Ck>().forward == body.forward);
  static_assert(layer_cost<Ck>().backward == body.backward + body.forward);
}

TEST_CASE("layer_cost of the Llama layers: the block's GEMMs, its grouped core, the cheap rest") {
  static_assert(layer_cost<TokenEmbedding<100, 8, 16>>().total() == 2 * 16);
  static_assert(layer_cost<RMSNorm<16>>().total() == 3 * 32);
  static_assert(layer_cost<detail::GroupedAttentionCore<4, 2, 4, 8>>().forward == 4 * 8 * 16);
  static_assert(layer_cost<detail::GroupedAttentionCore<4, 1, 4, 8>>().backward == 8 * 8 * 16);
  // a block: q, o (D^2 each), k, v (KVH hd D each), gate, up, down (F D each), the core, and the
  // cheap rest (RMSNorms, RoPE, SwiGLU, sums)
  constexpr std::size_t D = 16, H = 4, KVH = 2, F = 24, T = 8;
  using Block = detail::bound_layer_t<LlamaBlock<D, H, KVH, F>, D, T>;
  constexpr LayerCost block = layer_cost<Block>();
  constexpr double weights = 2.0 * D * D + 2.0 * KVH * (D / H) * D + 3.0 * F * D;
  constexpr double gemm = 6 * weights, attention = 12.0 * T * D;
  static_assert(block.total() > gemm + attention);
  static_assert(block.total() < gemm + attention + 3 * 40.0 * D);  // under 40 FLOPs per element
  // a Llama's head (512 x 32000: about five blocks' worth of GEMM) takes a stage with the final
  // norm, the six blocks the other
  constexpr std::size_t V = 32000, Tl = 256, Dl = 512;
  using B = LlamaBlock<Dl, 8, 2, 1408>;
  using Llama2 = balanced_pipeline_t<2, TokenEmbedding<V, Tl, Dl>, B, B, B, B, B, B, RMSNorm<Dl>,
                                     Linear<Dl, V, false>>;
  static_assert(std::is_same_v<Llama2, Pipeline<Stage<TokenEmbedding<V, Tl, Dl>, B, B, B, B, B, B>,
                                                Stage<RMSNorm<Dl>, Linear<Dl, V, false>>>>);
}

TEST_CASE("balanced_cut equals brute force over every cut: least largest stage, then squares") {
  Rng rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::array<double, 9> costs{};
    // small integers: many ties, so the tie rule is exercised
    for (double& c : costs) c = static_cast<double>(rng.next_u64() % 6);
    for (std::size_t k = 1; k <= costs.size(); ++k) {
      CAPTURE(trial);
      CAPTURE(k);
      const auto cut = balanced_cut(costs, k);
      const std::vector<std::size_t> got(cut.begin(), cut.begin() + static_cast<long>(k) + 1);
      CHECK(got == brute_force_cut(costs, k));
    }
  }
  CHECK_THROWS_AS(balanced_cut(std::array<double, 3>{1, 2, 3}, 4), Error);
  CHECK_THROWS_AS(balanced_cut(std::array<double, 3>{1, 2, 3}, 0), Error);
}

TEST_CASE("balanced_pipeline_t: stages of an MLP and of a GPT whose head outweighs its blocks") {
  // an MLP: the wide layer alone, the three narrow ones together
  using Mlp = balanced_pipeline_t<2, Linear<8, 64>, ReLU, Linear<64, 8>, ReLU, Linear<8, 8>>;
  static_assert(
      std::is_same_v<
          Mlp, Pipeline<Stage<Linear<8, 64>, ReLU>, Stage<Linear<64, 8>, ReLU, Linear<8, 8>>>>);
  // GPT-2's head (768 x 50304: 5 blocks' worth of GEMM) gets a stage of its own
  constexpr std::size_t V = 50304, T = 256, D = 768, H = 12;
  using B = TransformerBlock<D, H>;
  using Gpt2 =
      balanced_pipeline_t<2, Embedding<V, T, D>, B, B, B, B, LayerNorm<D>, Linear<D, V, false>>;
  static_assert(std::is_same_v<Gpt2, Pipeline<Stage<Embedding<V, T, D>, B, B, B, B, LayerNorm<D>>,
                                              Stage<Linear<D, V, false>>>>);
  static_assert(
      balanced_cut_v<4, Embedding<V, T, D>, B, B, B, B, LayerNorm<D>, Linear<D, V, false>> ==
      std::array<std::size_t, 5>{0, 2, 4, 6, 7});
}

TEST_CASE("a balanced pipeline trains as the hand-cut one: same names, same loss and gradients") {
  constexpr std::size_t V = 23, T = 4, D = 8, H = 2;
  using B = TransformerBlock<D, H>;
  using Balanced = balanced_pipeline_t<2, Embedding<V, T, D>, B, B, LayerNorm<D>, Linear<D, V>>;
  static_assert(
      std::is_same_v<Balanced,
                     Pipeline<Stage<Embedding<V, T, D>, B>, Stage<B, LayerNorm<D>, Linear<D, V>>>>);
  using Hand = Pipeline<Stage<Embedding<V, T, D>>, Stage<B, B, LayerNorm<D>, Linear<D, V>>>;
  std::vector<std::int32_t> tokens, targets;
  Rng rng(3);
  for (std::size_t i = 0; i < 4 * T; ++i) {
    tokens.push_back(static_cast<std::int32_t>(rng.next_u64() % V));
    targets.push_back(static_cast<std::int32_t>(rng.next_u64() % V));
  }
  host::Backend backend(2);
  Trainer<Balanced, SoftmaxCrossEntropy, host::Backend, OneFOneB> balanced(
      backend, {.micro_batches = 2, .seed = 4});
  Trainer<Hand, SoftmaxCrossEntropy, host::Backend, OneFOneB> hand(backend,
                                                                   {.micro_batches = 2, .seed = 4});
  const float a = balanced.forward_backward(tokens, targets);
  const float b = hand.forward_backward(tokens, targets);
  CHECK(a == doctest::Approx(b).epsilon(1e-6));
  REQUIRE(balanced.parameter_info().size() == hand.parameter_info().size());
  for (const ParameterInfo& info : hand.parameter_info()) {
    CAPTURE(info.name);
    CHECK(balanced.parameter(info.name) == hand.parameter(info.name));
    const std::vector<float> ga = balanced.gradient(info.name), gb = hand.gradient(info.name);
    for (std::size_t i = 0; i < gb.size(); ++i)
      CHECK(ga[i] == doctest::Approx(gb[i]).epsilon(1e-5).scale(1e-6));
  }
}
