// Cutting GPT-2's shapes (4 blocks) into K stages: the static cut (gpipe::balanced_pipeline_t,
// from FLOPs) beside the measured one (each layer timed on this machine's host backend), each
// printed as the Pipeline type to paste, with the largest stage's share of the whole.
//
//   build/release/examples/example_balance_gpt [K] [samples]     (defaults: 4, 2)

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <gpipe/gpipe.hpp>
#include <gpipe/runtime/measure_costs.hpp>
#include <string>

namespace {

constexpr std::size_t V = 50304, T = 256, D = 768, H = 12;
using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Norm = gpipe::LayerNorm<D>;
using Head = gpipe::Linear<D, V, false>;
constexpr std::size_t N = 7;

template <class Costs>
void report(const char* what, const Costs& totals, const std::array<std::size_t, N + 1>& cut,
            std::size_t k) {
  double all = 0, worst = 0;
  for (double c : totals) all += c;
  for (std::size_t s = 0; s < k; ++s) {
    double stage = 0;
    for (std::size_t l = cut[s]; l < cut[s + 1]; ++l) stage += totals[l];
    worst = std::max(worst, stage);
  }
  std::printf(
      "%s cut: largest stage %.1f %% of the model (ideal %.1f %%)\n  %s\n", what, 100 * worst / all,
      100.0 / static_cast<double>(k),
      gpipe::pipeline_type_name<Emb, Block, Block, Block, Block, Norm, Head>(cut, k).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t k = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 4;
  const std::size_t samples = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 2;
  if (k == 0 || k > N || samples == 0) {
    std::fprintf(stderr, "usage: %s [K in 1..%zu] [samples > 0]\n", argv[0], N);
    return 2;
  }
  std::array<double, N> flops{};
  const auto each = std::array<gpipe::LayerCost, N>{
      gpipe::layer_cost<Emb>(),
      gpipe::layer_cost<gpipe::detail::bound_layer_t<Block, D, T>>(),
      gpipe::layer_cost<gpipe::detail::bound_layer_t<Block, D, T>>(),
      gpipe::layer_cost<gpipe::detail::bound_layer_t<Block, D, T>>(),
      gpipe::layer_cost<gpipe::detail::bound_layer_t<Block, D, T>>(),
      gpipe::layer_cost<gpipe::detail::bound_layer_t<Norm, D, T>>(),
      gpipe::layer_cost<Head>()};
  flops = gpipe::totals(each);
  report("static (FLOPs)", flops, gpipe::balanced_cut(flops, k), k);

  gpipe::host::Backend backend(1);
  const auto measured =
      gpipe::measure_layer_costs<Emb, Block, Block, Block, Block, Norm, Head>(backend, samples);
  const char* names[N] = {"embedding", "block", "block", "block", "block", "layer norm", "head"};
  for (std::size_t i = 0; i < N; ++i)
    std::printf("  %-10s forward %8.2f ms  backward %8.2f ms  (%.3g GFLOP per row)\n", names[i],
                1e3 * measured[i].forward, 1e3 * measured[i].backward, flops[i] * 1e-9);
  const auto totals = gpipe::totals(measured);
  report("measured", totals, gpipe::balanced_cut(totals, k), k);
}
