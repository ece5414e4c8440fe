#pragma once
// Where the CUDA backend's non-template launchers are compiled: in every program (header-only,
// the default) or once, in the library that links the project's own CUDA programs
// (backend/cuda/compiled.cuh, src/cuda.cu). A launcher that is not a template instantiates its
// kernels wherever its definition is seen, so a program that never calls it would still compile
// them for the device (the tensor-core attention backward, the optimizers' updates); a program
// compiled with GPIPE_COMPILED_CUDA sees only its declaration and links the library's.
//
// GPIPE_CUDA_INLINE marks such a function: `inline` in header-only programs, nothing in the
// library (one strong definition there). GPIPE_CUDA_DEFINITIONS is 1 where their definitions are
// compiled: header-only programs and the library's own source (GPIPE_COMPILED_CUDA_SOURCE).

#if defined(GPIPE_COMPILED_CUDA) && !defined(GPIPE_COMPILED_CUDA_SOURCE)
#define GPIPE_CUDA_DEFINITIONS 0
#else
#define GPIPE_CUDA_DEFINITIONS 1
#endif

#if defined(GPIPE_COMPILED_CUDA)
#define GPIPE_CUDA_INLINE
#else
#define GPIPE_CUDA_INLINE inline
#endif
