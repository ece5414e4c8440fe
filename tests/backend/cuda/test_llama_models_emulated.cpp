// A Llama on the CUDA backend (tests/cuda/test_llama_models.cu: against the double reference, in
// MixedBf16 against Fp32, predict against the host), compiled by the host compiler and run on the
// emulated CUDA runtime and cuBLAS of tests/support/cuda_emulation.hpp.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_llama_models.cu"
