#pragma once
// The CUDA backend's built-in layers' kernels (their LayerKernels specializations, in layers/),
// the one list of them: backend.cuh includes it, so that cuda::Backend runs every built-in layer.
// Needs nvcc.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers.cuh is CUDA code: compile it with nvcc"
#endif

#include "gpipe/backend/cuda/layers/activation.cuh"
#include "gpipe/backend/cuda/layers/attention.cuh"
#include "gpipe/backend/cuda/layers/embedding.cuh"
#include "gpipe/backend/cuda/layers/gelu_tanh.cuh"
#include "gpipe/backend/cuda/layers/llama.cuh"
