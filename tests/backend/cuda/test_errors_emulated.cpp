// The error conformance suite on the CUDA backend (tests/cuda/test_errors.cu), compiled by the
// host compiler and run on the emulated CUDA runtime, cuBLAS and NCCL of
// tests/support/cuda_emulation.hpp with two emulated GPUs.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_errors.cu"
