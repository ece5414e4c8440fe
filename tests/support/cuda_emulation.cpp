// The CUDA emulator's definitions of the CUDA runtime, cuBLAS and NCCL functions and of its
// context switch, compiled once into the static library gpipe_cuda_emulation
// (gpipe_use_cuda_emulation in cmake/gpipeCompileOptions.cmake) that every emulated program links.
// The programs include support/cuda_emulation.hpp with GPIPE_CUDA_EMULATION_LINKED defined, so
// that they see declarations only; the emulator's state lives in inline functions, one per
// program.
#include "support/cuda_emulation.hpp"
