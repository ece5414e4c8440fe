// Proves the installed package's gpipe::cuda is usable: <gpipe/cuda.cuh> compiles with nvcc in
// another project and links the CUDA runtime and cuBLAS (and NCCL where it was found). With a
// GPU, one step of a two-stage pipeline on two virtual devices must lower the loss; without one,
// the backend must refuse with a gpipe::Error that says so. Exits 0 on success.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <gpipe/cuda.cuh>
#include <string>
#include <vector>

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 16>, gpipe::ReLU>,
                              gpipe::Stage<gpipe::Linear<16, 2>>>;

int main() try {
  if (gpipe::cuda::device_count() == 0) {
    try {
      gpipe::cuda::Backend backend(1);
    } catch (const gpipe::Error& e) {
      if (std::string(e.what()).find("needs a CUDA GPU") == std::string::npos) throw;
      std::printf("gpipe CUDA consumer: ok, no GPU (%s)\n", e.what());
      return 0;
    }
    throw gpipe::Error("gpipe CUDA consumer: a backend without a GPU did not refuse");
  }
  gpipe::cuda::Backend backend(2);
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::cuda::Backend> trainer(
      backend, {.micro_batches = 2});
  const std::vector<float> x = {1, 0, 0, 0, -1, 0, 0, 0, 2, 1, 0, 0, -2, 1, 0, 0};
  const std::vector<std::int32_t> y = {1, 0, 1, 0};
  const float before = trainer.forward_backward(x, y);
  trainer.step(gpipe::optim::SGD({.lr = 0.5}));
  trainer.zero_grad();
  const float after = trainer.forward_backward(x, y);
  if (!(after < before)) throw gpipe::Error("gpipe CUDA consumer: a step did not lower the loss");
  std::printf("gpipe CUDA consumer: ok (loss %.4f -> %.4f)\n", before, after);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
