// doctest's runner for the CUDA tests (tests/cuda/, *.cu). Without a usable GPU it runs only the
// test suite "without a GPU" (what must hold on such a machine, e.g. a clear error), then prints
// why the rest cannot run and exits 77, which CTest reports as skipped (SKIP_RETURN_CODE), never
// as passed. With a GPU it runs everything else.

#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  doctest::Context context(argc, argv);
  if (error != cudaSuccess || count == 0) {
    context.setOption("test-suite", "without a GPU");
    const int result = context.run();
    if (result != 0 || context.shouldExit()) return result;
    std::printf("SKIPPED: no CUDA GPU (%s); the CUDA tests need one\n",
                error != cudaSuccess ? cudaGetErrorString(error) : "cudaGetDeviceCount found none");
    return 77;
  }
  context.setOption("test-suite-exclude", "without a GPU");
  return context.run();
}
