// A user's program with a deep pipeline, for scripts/compile-time: 16 stages on 16 host devices,
// one 1F1B training step with AdamW. What it measures is how long the compiler takes over the
// library's templates (each stage's layers are their own types), not how fast it runs.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <gpipe/gpipe.hpp>
#include <vector>

namespace {

constexpr std::size_t D = 64;
using Block = gpipe::Stage<gpipe::Linear<D, D>, gpipe::GELU, gpipe::LayerNorm<D>>;
using Model =
    gpipe::Pipeline<gpipe::Stage<gpipe::Linear<16, D>, gpipe::ReLU>, Block, Block, Block, Block,
                    Block, Block, Block, Block, Block, Block, Block, Block, Block, Block,
                    gpipe::Stage<gpipe::Linear<D, D>, gpipe::ReLU, gpipe::Linear<D, 4>>>;
static_assert(Model::num_stages == 16);

}  // namespace

int main() {
  constexpr std::size_t rows = 64;
  std::vector<float> x(rows * Model::in_features);
  std::vector<std::int32_t> y(rows);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) / 7.0f;
  for (std::size_t i = 0; i < rows; ++i) y[i] = static_cast<std::int32_t>(i % 4);
  gpipe::host::Backend backend(Model::num_stages);
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, gpipe::OneFOneB> trainer(
      backend, {.micro_batches = 16});
  gpipe::optim::AdamW adamw({.lr = 1e-3});
  const float loss = trainer.forward_backward(x, y);
  trainer.step(adamw);
  std::printf("16 stages, one 1F1B step: loss %.4f, bubble %.2f\n", loss,
              trainer.last_step().bubble_fraction);
  return 0;
}
