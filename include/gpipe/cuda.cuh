#pragma once
// gpipe with the CUDA backend: the core library (<gpipe/core.hpp>) and gpipe::cuda::Backend.
// Compile with nvcc (a .cu file) and link the CMake target gpipe::cuda (CUDA runtime, cuBLAS, and
// NCCL where it was found). The host backend is not part of it (nor its GEMM libraries' headers):
// a CUDA program that also runs gpipe::host::Backend includes <gpipe/gpipe.hpp> too.
//
//   gpipe::cuda::Backend backend(4);   // 4 virtual devices, spread over the GPUs there are
//   gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::cuda::Backend> trainer(
//       backend, {.micro_batches = 8});

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error \
    "gpipe/cuda.cuh is CUDA code: compile it with nvcc (a .cu file); <gpipe/gpipe.hpp> is the host-only library"
#endif

#include "gpipe/backend/cuda.cuh"
#include "gpipe/backend/cuda/compiled.cuh"
#include "gpipe/core.hpp"
