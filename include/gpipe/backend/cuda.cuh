#pragma once
// The CUDA backend: virtual devices on NVIDIA GPUs, cuBLAS GEMMs, custom kernels, and the kernels
// of the layers that bring their own (LayerKernels specializations, layers.cuh). Needs nvcc.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda.cuh is CUDA code: compile it with nvcc (a .cu file)"
#endif

#include "gpipe/backend/cuda/backend.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/layers.cuh"
#include "gpipe/backend/cuda/memory.cuh"
#include "gpipe/transport/cuda.cuh"
