// Every schedule on the CUDA backend gives the GPipe schedule's loss and gradients
// (tests/cuda/test_schedules.cu), compiled by the host compiler and run on the emulated CUDA
// runtime of tests/support/cuda_emulation.hpp with two emulated GPUs.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_schedules.cu"
