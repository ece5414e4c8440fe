// doctest's runner for the CUDA tests (tests/cuda/, *.cu): without a usable GPU it prints why and
// exits 77, which CTest reports as skipped (SKIP_RETURN_CODE), never as passed.

#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA GPU (%s); the CUDA tests need one\n",
                error != cudaSuccess ? cudaGetErrorString(error) : "cudaGetDeviceCount found none");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
