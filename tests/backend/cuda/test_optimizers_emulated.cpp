// Optimizer steps on the CUDA backend (tests/cuda/test_optimizers.cu) equal PyTorch's rules on
// the unpipelined model's gradients, compiled by the host compiler and run on the emulated CUDA
// runtime of tests/support/cuda_emulation.hpp.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_optimizers.cu"
