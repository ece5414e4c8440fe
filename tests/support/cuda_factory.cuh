#pragma once
// Backend factories for the conformance suites (tests/support/conformance_*.hpp) on the CUDA
// backend, and the GPU count that multi-GPU tests skip on.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "tests/support/cuda_factory.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>
#include <vector>

#include "gpipe/cuda.cuh"

namespace gpipe::test {

// Tolerances of the CUDA backend against the double-precision reference, relative to the
// largest reference entry of each tensor. Both backends compute in float; on the GPU the sums
// run in other orders (cuBLAS's blocking, tree reductions in LayerNorm, bias and loss kernels),
// LayerNorm and the losses keep float statistics where the host keeps double, and expf, erff
// and logf differ from glibc's by up to 2 ulp: five times the host's bounds (twice for the
// accumulation check, where cuBLAS rounds alpha AB and beta C apart).
struct CudaTolerances {
  static constexpr double gradient_tolerance = 1e-5;
  static constexpr double loss_tolerance = 5e-6;
  static constexpr double accumulate_tolerance = 2e-6;
  static constexpr double parameter_tolerance = 1e-5;
  static constexpr bool report_errors = true;
};

// Virtual device d on GPU d % (number of GPUs): all on GPU 0 on a one-GPU machine, spread (peer
// copies between stages) on several.
struct CudaFactory : CudaTolerances {
  using backend_type = cuda::Backend;
  static cuda::Backend make(std::size_t devices) { return cuda::Backend(devices); }
  // Each virtual device capped at `capacity` bytes.
  static cuda::Backend make_capped(std::size_t devices, std::size_t capacity) {
    return cuda::Backend(devices, {.device_capacity = capacity});
  }
};

// Every virtual device on GPU 0, whatever the machine has.
struct CudaOneGpuFactory : CudaTolerances {
  using backend_type = cuda::Backend;
  static cuda::Backend make(std::size_t devices) {
    return cuda::Backend(devices, {.gpus = std::vector<int>(devices, 0)});
  }
};

// Spread over the GPUs, stages handing over through NCCL (needs >= 2 GPUs and a NCCL build).
struct CudaNcclFactory : CudaTolerances {
  using backend_type = cuda::Backend;
  static cuda::Backend make(std::size_t devices) { return cuda::Backend(devices, {.nccl = true}); }
};

inline bool fewer_than_two_gpus() { return cuda::device_count() < 2; }

// Elements for a test that moves a lot of data to show stream order: n on a GPU, where a missing
// dependency shows only if the work takes long; n / 256 on the CPU emulator
// (tests/support/cuda_emulation.hpp), whose streams are threads, so that it shows at any
// size, and which runs every CUDA thread of a kernel one after another.
#if defined(GPIPE_CUDA_EMULATION)
inline constexpr bool emulated = true;
#else
inline constexpr bool emulated = false;
#endif
constexpr std::size_t ordering_size(std::size_t n) { return emulated ? n / 256 : n; }

}  // namespace gpipe::test
