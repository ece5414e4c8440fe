// Proves an installed gpipe is usable: its headers are found through gpipe::gpipe, they compile
// as C++20 in another project, and the host backend with its BLAS and threads links and trains:
// one step of a two-stage pipeline must lower the loss. Exits 0 on success.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <gpipe/gpipe.hpp>
#include <vector>

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 16>, gpipe::ReLU>,
                              gpipe::Stage<gpipe::Linear<16, 2>>>;

int main() try {
  gpipe::host::Backend backend(2);
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend> trainer(
      backend, {.micro_batches = 2});
  // Class 1 when the first feature is positive.
  const std::vector<float> x = {1, 0, 0, 0, -1, 0, 0, 0, 2, 1, 0, 0, -2, 1, 0, 0};
  const std::vector<std::int32_t> y = {1, 0, 1, 0};
  const float before = trainer.forward_backward(x, y);
  trainer.step(gpipe::optim::SGD({.lr = 0.5}));
  trainer.zero_grad();
  const float after = trainer.forward_backward(x, y);
  if (!(after < before)) throw gpipe::Error("gpipe consumer: a step did not lower the loss");
  std::printf("gpipe consumer: ok (loss %.4f -> %.4f)\n", before, after);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
