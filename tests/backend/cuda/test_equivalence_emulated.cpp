// A pipelined step equals the unpipelined model on the CUDA backend (tests/cuda/
// test_equivalence.cu: the backend-conformance suite, virtual devices spread over GPUs and
// sharing one, NCCL hand-overs), compiled by the host compiler and run on the emulated CUDA
// runtime, cuBLAS and NCCL of tests/support/cuda_emulation.hpp with two emulated GPUs.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include "cuda/test_equivalence.cu"
