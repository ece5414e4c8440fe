// The spiral example (examples/spiral.hpp) on the CUDA backend: the 4 stages on 4 virtual
// devices, spread round robin over the machine's GPUs (on one GPU, 4 streams of it), then one
// traced step drawn into spiral_cuda_timeline.svg.
// Usage: example_spiral_cuda [steps] [micro_batches]; exit status 0 when the test accuracy
// exceeds 90%, and 0 with a message on a machine without a GPU.

#include <cstdio>
#include <gpipe/cuda.cuh>
#include <string>

#include "spiral.hpp"

int main(int argc, char** argv) {
  spiral::Options options;
  if (!spiral::parse(argc, argv, options)) return 2;
  if (gpipe::cuda::device_count() == 0) {
    std::printf("%s: no CUDA GPU; nothing to train on\n", argv[0]);
    return 0;
  }
  try {
    gpipe::cuda::Backend backend(spiral::Model::num_stages);
    const std::string gpus = std::to_string(gpipe::cuda::device_count());
    return spiral::train(backend, "virtual devices of " + gpus + " GPU(s)", options,
                         "spiral_cuda_timeline.svg");
  } catch (const gpipe::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
