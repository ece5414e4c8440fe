// Proves the installed package's gpipe::cuda is usable: <gpipe/cuda.cuh> compiles with nvcc in
// another project and links the CUDA runtime and cuBLAS (and NCCL where it was found). With a
// GPU, one step of a two-stage pipeline on two virtual devices must lower the loss; without one,
// the backend must refuse with a gpipe::Error that says so. Exits 0 on success.

#include <cstdio>
#include <exception>
#include <gpipe/cuda.cuh>
#include <string>

#include "train_step.hpp"

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
  check_one_step_lowers_the_loss(backend, "gpipe CUDA consumer");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
