#pragma once
// The CUDA backend's runtime instantiations that a compiled library holds once (src/cuda.cu; the
// project's emulated programs link it as gpipe_cuda_compiled_emulation): in a program compiled
// with GPIPE_COMPILED_CUDA they are explicit instantiation declarations (extern template), so
// that the program compiles only what depends on its model's types; in the library's source
// (GPIPE_COMPILED_CUDA_SOURCE), the definitions. Without GPIPE_COMPILED_CUDA this header declares
// nothing, and <gpipe/cuda.cuh> stays header-only.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/compiled.cuh is CUDA code: compile it with nvcc (a .cu file)"
#endif

#include <cstdint>

#include "gpipe/backend/cuda.cuh"
#include "gpipe/core.hpp"

// GPIPE_CUDA_INSTANTIATION(declaration): `extern template` in a program on the library,
// `template` in the library's source, nothing in a header-only program.
#if !defined(GPIPE_COMPILED_CUDA)
#define GPIPE_CUDA_INSTANTIATION(...) static_assert(true)
#elif defined(GPIPE_COMPILED_CUDA_SOURCE)
#define GPIPE_CUDA_INSTANTIATION(...) template __VA_ARGS__
#else
#define GPIPE_CUDA_INSTANTIATION(...) extern template __VA_ARGS__
#endif

// The Trainer's parts for cuda::Backend (runtime/trainer.hpp): step runners for both target types
// (class ids, floats) in both precisions, the parameter store and the optimizer state's update
// for both optimizers.
GPIPE_CUDA_INSTANTIATION(class gpipe::detail::StepRunner<gpipe::cuda::Backend, std::int32_t>);
GPIPE_CUDA_INSTANTIATION(class gpipe::detail::StepRunner<gpipe::cuda::Backend, float>);
GPIPE_CUDA_INSTANTIATION(
    class gpipe::detail::StepRunner<gpipe::cuda::Backend, std::int32_t, gpipe::MixedBf16>);
GPIPE_CUDA_INSTANTIATION(
    class gpipe::detail::StepRunner<gpipe::cuda::Backend, float, gpipe::MixedBf16>);
GPIPE_CUDA_INSTANTIATION(class gpipe::detail::ParameterStore<gpipe::cuda::Backend>);
GPIPE_CUDA_INSTANTIATION(void gpipe::detail::OptimizerState<gpipe::cuda::Backend>::step(
    const gpipe::optim::SGD&, gpipe::detail::ParameterStore<gpipe::cuda::Backend>&,
    gpipe::cuda::Backend&));
GPIPE_CUDA_INSTANTIATION(void gpipe::detail::OptimizerState<gpipe::cuda::Backend>::step(
    const gpipe::optim::AdamW&, gpipe::detail::ParameterStore<gpipe::cuda::Backend>&,
    gpipe::cuda::Backend&));
