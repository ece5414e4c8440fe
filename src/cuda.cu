// The CUDA backend's runtime instantiations for cuda::Backend (backend/cuda/compiled.cuh),
// compiled once here instead of in every translation unit of a program. The project's .cu
// programs link it compiled by nvcc (gpipe_cuda_compiled, CMakeLists.txt), its emulated programs
// compiled by the host compiler on the CUDA emulator (gpipe_cuda_compiled_emulation,
// cmake/gpipeCompileOptions.cmake), each built with the same definitions as its users
// (GPIPE_COMPILED_CUDA).

#define GPIPE_COMPILED_CUDA_SOURCE
#include <gpipe/cuda.cuh>
