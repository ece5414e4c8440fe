// Your own layer (examples/own_layer/scale.hpp) on the CUDA backend, with the CUDA kernels of
// own_layer/scale_cuda.cuh: one step's loss and gradients against the host backend's (whose
// kernels, own_layer/scale_host.hpp, are checked against finite differences by
// example_own_layer), then trained in a 2-stage pipeline.
// Usage: example_own_layer_cuda [steps]; exit status 0 when the step matches and the held-out
// accuracy exceeds 90%, and 0 with a message on a machine without a GPU.

#include <cstdio>
#include <cstdlib>
#include <gpipe/cuda.cuh>

#include "own_layer/scale.hpp"
#include "own_layer/scale_cuda.cuh"
#include "own_layer/scale_host.hpp"
#include "own_layer/train.hpp"

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  if (steps <= 0) {
    std::fprintf(stderr, "usage: %s [steps > 0]\n", argv[0]);
    return 2;
  }
  if (gpipe::cuda::device_count() == 0) {
    std::printf("%s: no CUDA GPU; nothing to run on\n", argv[0]);
    return 0;
  }
  try {
    gpipe::cuda::Backend backend(own_layer::Model::num_stages);
    // Float on both sides, summed in different orders: the library's own CUDA and host layers
    // stay within 1e-5 and 2e-6 of a double reference (tests/support/*_factory), so within
    // 1.2e-5 of each other.
    constexpr double tolerance = 1.2e-5;
    const double error = own_layer::compare_with_host(backend, spiral::make_spiral(40, 3));
    std::printf("one step against the host backend: largest relative error %.1e (bound %.1e)\n",
                error, tolerance);
    if (!(error <= tolerance)) return 1;
    return own_layer::train_and_report(backend, "2 virtual devices of the GPU(s)", steps);
  } catch (const gpipe::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
