// gpipe::MixedBf16 on the CUDA backend (tests/cuda/test_mixed_precision.cu: conversions, the bf16
// GEMM, GPT steps against Fp32 and the host, remat, memory, inference, an MLP), compiled by the
// host compiler and run on the emulated CUDA runtime and cuBLAS (cublasGemmEx) of
// tests/support/cuda_emulation.hpp.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_mixed_precision.cu"
