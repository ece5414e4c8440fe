// Re-materialization and memory, measured against GPipe's claims (issue: remat and memory).
//
// BM_PeakActivations/policy:P/M:m   peak activation bytes of device 0 (stage 0) of a 4-stage
//   pipeline of deep uniform stages, next to the memory model's prediction and GPipe's formula
//   O(N + L/K N/M) written out for this stage: L blocks of width d keep, per row, the stage
//   input and 2L - 1 tensors of width d (each block's hidden activation and output, except the
//   last output, which leaves the stage), so with N rows in M micro-batches
//     never  = N (1 + 2L - 1) d        always = N d + (N / M)(2L - 1) d.
// BM_LargestModel/config:C   the deepest model of identical blocks that trains (forward,
//   backward and an AdamW step) under a fixed per-device capacity: K = 1, K = 4 without remat,
//   K = 4 with remat always. Our small-scale analogue of GPipe's Table 1.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <gpipe/gpipe.hpp>
#include <gpipe/runtime/memory_model.hpp>
#include <string>
#include <vector>

#include "support/uniform.hpp"

namespace {

using gpipe::Remat;

constexpr std::size_t width = 128;
// y = x + relu(x W^T + b): keeps its body's input-to-ReLU activation and the ReLU output.
using Block = gpipe::Residual<gpipe::Linear<width, width>, gpipe::ReLU>;

template <std::size_t K, std::size_t BlocksPerStage>
using uniform_t = gpipe::bench::uniform_pipeline_t<K, BlocksPerStage, Block>;

std::vector<float> inputs(std::size_t rows) {
  gpipe::Rng rng(1);
  std::vector<float> x(rows * width);
  for (float& v : x) v = rng.uniform(-1, 1);
  return x;
}

// ---------------------------------------------------------------------------------------------

constexpr std::size_t peak_rows = 256;
constexpr std::size_t peak_blocks = 8;
using PeakModel = uniform_t<4, peak_blocks>;

void BM_PeakActivations(benchmark::State& state) {
  const auto remat = static_cast<Remat>(state.range(0));
  const auto m = static_cast<std::size_t>(state.range(1));
  const std::vector<float> x = inputs(peak_rows), y = inputs(peak_rows);
  gpipe::host::Backend backend(4);
  gpipe::Trainer<PeakModel, gpipe::MSELoss, gpipe::host::Backend> trainer(
      backend, {.micro_batches = m, .remat = remat});
  const auto predicted = gpipe::predict_memory<PeakModel>(trainer.schedule(), peak_rows, remat, 0,
                                                          width * sizeof(float));
  for (auto _ : state) {
    backend.reset_peak();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    trainer.zero_grad();
  }
  const std::size_t measured = backend.memory_stats(0).peak_of(gpipe::MemoryKind::activations);
  const std::size_t expected = predicted[0].activations_peak;
  const double n = peak_rows, d = width * sizeof(float), L = peak_blocks;
  const double never = n * 2 * L * d;
  const double formula =
      remat == Remat::never ? never : n * d + (n / static_cast<double>(m)) * (2 * L - 1) * d;
  state.counters["activations_measured_MiB"] = static_cast<double>(measured) / (1 << 20);
  state.counters["activations_predicted_MiB"] = static_cast<double>(expected) / (1 << 20);
  state.counters["gpipe_formula_MiB"] = formula / (1 << 20);
  state.counters["fraction_of_never"] = static_cast<double>(measured) / never;
  state.SetLabel(std::string(gpipe::to_string(remat)));
}
BENCHMARK(BM_PeakActivations)
    ->ArgNames({"policy", "M"})
    ->ArgsProduct({{static_cast<int>(Remat::never), static_cast<int>(Remat::always),
                    static_cast<int>(Remat::except_last)},
                   {1, 2, 4, 8, 16, 32}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------

constexpr std::size_t capacity_rows = 512;
constexpr std::size_t capacity_micro_batches = 8;
constexpr std::size_t capacity_bytes = 8u << 20;  // per device

// Whether a model of K stages of B blocks trains one step under the capacity.
template <std::size_t K, std::size_t B>
bool fits(Remat remat) {
  using Model = uniform_t<K, B>;
  try {
    gpipe::host::Backend backend(K, {.device_capacity = capacity_bytes});
    gpipe::Trainer<Model, gpipe::MSELoss, gpipe::host::Backend> trainer(
        backend, {.micro_batches = capacity_micro_batches, .remat = remat});
    const std::vector<float> x = inputs(capacity_rows), y = inputs(capacity_rows);
    trainer.forward_backward(x, y);
    trainer.step(gpipe::optim::AdamW());
    return true;
  } catch (const gpipe::OutOfMemory&) {
    return false;
  }
}

// The largest total number of blocks among the candidates (blocks per stage) that fits.
template <std::size_t K, std::size_t... B>
std::size_t largest(Remat remat) {
  std::size_t best = 0;
  ((fits<K, B>(remat) ? (best = K * B) : 0), ...);
  return best;
}

void BM_LargestModel(benchmark::State& state) {
  const int config = static_cast<int>(state.range(0));
  std::size_t blocks = 0;
  for (auto _ : state) {
    switch (config) {
      case 0:
        blocks = largest<1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32>(Remat::never);
        break;
      case 1:
        blocks = largest<4, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32>(Remat::never);
        break;
      default:
        blocks = largest<4, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48>(Remat::always);
        break;
    }
  }
  const double params = static_cast<double>(blocks * Block::with_features<width>::num_params);
  state.counters["largest_blocks"] = static_cast<double>(blocks);
  state.counters["parameters_M"] = params / 1e6;
  state.counters["capacity_MiB_per_device"] = static_cast<double>(capacity_bytes) / (1 << 20);
  state.SetLabel(config == 0   ? "K=1 (no pipeline)"
                 : config == 1 ? "K=4, remat never"
                               : "K=4, remat always");
}
BENCHMARK(BM_LargestModel)
    ->ArgName("config")
    ->DenseRange(0, 2)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
