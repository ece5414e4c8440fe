#pragma once
// The CUDA backend's runtime and kernel instantiations that a compiled library holds once
// (src/cuda.cu; the project's programs link it as gpipe_cuda_compiled, compiled by nvcc, or on
// the emulator as gpipe_cuda_compiled_emulation): in a program compiled
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

// The kernels' launchers (backend/cuda/kernels/) for float and bf16 activations: each launcher
// with every variant of its kernels (vector widths, row layouts, head sizes), which a program
// that runs a model would otherwise compile for the device again. Templates not named here (a
// user's own Math, the embedding's sort) are compiled where they are used, as always.
#define GPIPE_CUDA_LAUNCHERS(T)                                                                    \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::activation_forward<gpipe::cuda::ReluMath, T>(         \
      std::size_t, const T*, T*, cudaStream_t));                                                   \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::activation_forward<gpipe::cuda::GeluMath, T>(         \
      std::size_t, const T*, T*, cudaStream_t));                                                   \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::activation_forward<gpipe::cuda::GeluTanhMath, T>(     \
      std::size_t, const T*, T*, cudaStream_t));                                                   \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::activation_backward<gpipe::cuda::ReluMath, T>(        \
      std::size_t, const T*, const T*, T*, cudaStream_t));                                         \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::activation_backward<gpipe::cuda::GeluMath, T>(        \
      std::size_t, const T*, const T*, T*, cudaStream_t));                                         \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::activation_backward<gpipe::cuda::GeluTanhMath, T>(    \
      std::size_t, const T*, const T*, T*, cudaStream_t));                                         \
  GPIPE_CUDA_INSTANTIATION(                                                                        \
      void gpipe::cuda::add<T>(std::size_t, const T*, const T*, T*, cudaStream_t));                \
  GPIPE_CUDA_INSTANTIATION(                                                                        \
      void gpipe::cuda::accumulate<T>(std::size_t, const T*, T*, cudaStream_t));                   \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::fill<T>(std::size_t, float, T*, cudaStream_t));       \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::scale<T>(std::size_t, float, T*, cudaStream_t));      \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::bias_add_forward<T>(std::size_t, std::size_t,         \
                                                                 const float*, T*, cudaStream_t)); \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::bias_grad_backward<T>(                                \
      std::size_t, std::size_t, const T*, float*, float*, cudaStream_t));                          \
  GPIPE_CUDA_INSTANTIATION(                                                                        \
      void gpipe::cuda::layer_norm_forward<T>(std::size_t, std::size_t, double, const T*,          \
                                              const float*, const float*, T*, T*, cudaStream_t));  \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::layer_norm_backward_input<T>(                         \
      std::size_t, std::size_t, const T*, const T*, const float*, const T*, T*, cudaStream_t));    \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::residual_layer_norm_forward<T>(                       \
      std::size_t, std::size_t, double, T*, const T*, const float*, const float*, T*, T*,          \
      cudaStream_t));                                                                              \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::residual_layer_norm_backward_input<T>(                \
      std::size_t, std::size_t, const T*, const T*, const float*, const T*, const T*, T*,          \
      cudaStream_t));                                                                              \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::layer_norm_backward_weight<T>(                        \
      std::size_t, std::size_t, const T*, const T*, const T*, float*, float*, float*,              \
      cudaStream_t));                                                                              \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::rms_norm_forward<T>(                                  \
      std::size_t, std::size_t, double, const T*, const float*, T*, T*, cudaStream_t));            \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::rms_norm_backward_input<T>(                           \
      std::size_t, std::size_t, const T*, const T*, const float*, const T*, T*, cudaStream_t));    \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::residual_rms_norm_forward<T>(                         \
      std::size_t, std::size_t, double, T*, const T*, const float*, T*, T*, cudaStream_t));        \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::residual_rms_norm_backward_input<T>(                  \
      std::size_t, std::size_t, const T*, const T*, const float*, const T*, const T*, T*,          \
      cudaStream_t));                                                                              \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::rms_norm_backward_weight<T>(                          \
      std::size_t, std::size_t, const T*, const T*, const T*, float*, float*, cudaStream_t));      \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::flash_attention_forward<T>(                           \
      const gpipe::AttentionGeometry&, const T*, T*, float*, const std::int32_t*, cudaStream_t));  \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::flash_attention_backward<T>(                          \
      const gpipe::AttentionGeometry&, const T*, const T*, const float*, const T*, T*, float*,     \
      const std::int32_t*, cudaStream_t));                                                         \
  GPIPE_CUDA_INSTANTIATION(                                                                        \
      void gpipe::cuda::rope<T>(std::size_t, std::size_t, std::size_t, std::size_t, std::size_t,   \
                                double, const std::int32_t*, T*, bool, float*, cudaStream_t));     \
  GPIPE_CUDA_INSTANTIATION(                                                                        \
      void gpipe::cuda::swiglu_forward<T>(std::size_t, std::size_t, const T*, T*, cudaStream_t));  \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::swiglu_backward<T>(                                   \
      std::size_t, std::size_t, const T*, const T*, T*, cudaStream_t));                            \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::softmax_cross_entropy_forward<T>(                     \
      std::size_t, std::size_t, const T*, const std::int32_t*, float, T*, float*, float*,          \
      cudaStream_t));                                                                              \
  GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::mse_forward<T>(                                       \
      std::size_t, const T*, const float*, float, T*, float*, float*, cudaStream_t))
GPIPE_CUDA_LAUNCHERS(float);
GPIPE_CUDA_LAUNCHERS(gpipe::bf16);
#undef GPIPE_CUDA_LAUNCHERS
GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::convert<float, gpipe::bf16>(std::size_t, const float*,
                                                                       gpipe::bf16*, cudaStream_t));
GPIPE_CUDA_INSTANTIATION(void gpipe::cuda::convert<gpipe::bf16, float>(std::size_t,
                                                                       const gpipe::bf16*, float*,
                                                                       cudaStream_t));
