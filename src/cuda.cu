// The CUDA backend's runtime instantiations for cuda::Backend (backend/cuda/compiled.cuh),
// compiled once here instead of in every translation unit of a program. The project's emulated
// programs link it compiled by the host compiler on the CUDA emulator
// (gpipe_cuda_compiled_emulation, cmake/gpipeCompileOptions.cmake), built with the same
// definitions as its users (GPIPE_COMPILED_CUDA).

#define GPIPE_COMPILED_CUDA_SOURCE
#include <gpipe/cuda.cuh>
