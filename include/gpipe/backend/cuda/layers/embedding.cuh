#pragma once
// Embedding on the CUDA backend. Forward: one thread per output element. W: one thread per
// column c, which walks the rows in order and adds dy(r, c) into dwte(id_r, c) and
// dwpe(r % T, c): no atomics, so the sums are the same, in the same order, every run (and the
// host reference's order, gpipe/backend/host/layers/embedding.hpp).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/embedding.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/model/embedding.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe::cuda {

namespace detail {
// A row's token id: held as a float with a whole value, or (bf16 activations) in the 16 bits.
__device__ __forceinline__ std::size_t token_id(float id) {
  return static_cast<std::size_t>(lrintf(id));
}
__device__ __forceinline__ std::size_t token_id(bf16 id) { return id.bits; }
}  // namespace detail

/// y(rows, width) = wte(id_r, :) + wpe(r % tokens, :), summed in float and stored as T; ids are
/// floats holding whole numbers, or for bf16 activations the 16 bits of each bf16
template <class T>
__global__ void embedding_forward_kernel(std::size_t rows, std::size_t tokens, std::size_t width,
                                         const T* ids, const float* wte, const float* wpe, T* y) {
  for (std::size_t i = detail::global_thread(); i < rows * width; i += detail::grid_threads()) {
    const std::size_t r = i / width, c = i % width;
    const std::size_t id = detail::token_id(ids[r]);
    y[i] = detail::narrow<T>(wte[id * width + c] + wpe[(r % tokens) * width + c]);
  }
}

/// dwte(id_r, c) += dy(r, c), dwpe(r % tokens, c) += dy(r, c) in float: thread c, rows in order
template <class T>
__global__ void embedding_backward_weight_kernel(std::size_t rows, std::size_t tokens,
                                                 std::size_t width, const T* ids, const T* dy,
                                                 float* dwte, float* dwpe) {
  for (std::size_t c = detail::global_thread(); c < width; c += detail::grid_threads()) {
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t id = detail::token_id(ids[r]);
      const float g = detail::widen(dy[r * width + c]);
      dwte[id * width + c] += g;
      dwpe[(r % tokens) * width + c] += g;
    }
  }
}

}  // namespace gpipe::cuda

namespace gpipe {

/// Embedding's kernels on the CUDA backend: a gather for forward, and for the weight gradient one
/// thread per column that adds the rows in order, deterministic and in the host's order. There is
/// no input gradient: the ids are constant. On bf16 activations (gpipe::MixedBf16) the ids are in
/// the 16 bits of each bf16 (the executor stores them so), wte + wpe is summed in float and
/// rounded once, and dy is widened to float.
template <class T>
struct LayerKernels<EmbeddingOp, cuda::KernelContext<T>> {
  /// y(rows, width) = wte(id_r, :) + wpe(r % tokens, :), overwritten; ids (rows) are token ids,
  /// which the Trainer has checked against the vocabulary (not checked again here).
  static void forward(cuda::KernelContext<T>& k, std::size_t rows, std::size_t tokens,
                      std::size_t width, const T* ids, const float* wte, const float* wpe, T* y) {
    if (rows == 0) return;
    GPIPE_CUDA_LAUNCH(cuda::embedding_forward_kernel<T>, cuda::detail::grid_for(rows * width),
                      cuda::detail::block_size, k.stream())
    (rows, tokens, width, ids, wte, wpe, y);
    GPIPE_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
  }
  /// dwte(V, width) += dy(r, :) at row id_r and dwpe(tokens, width) += dy(r, :) at row r % tokens,
  /// for every row r of dy(rows, width), in order of r.
  static void backward_weight(cuda::KernelContext<T>& k, std::size_t rows, std::size_t tokens,
                              std::size_t width, const T* ids, const T* dy, float* dwte,
                              float* dwpe) {
    if (rows == 0) return;
    GPIPE_CUDA_LAUNCH(cuda::embedding_backward_weight_kernel<T>, cuda::detail::grid_for(width, 128),
                      128, k.stream())
    (rows, tokens, width, ids, dy, dwte, dwpe);
    GPIPE_CUDA_CHECK_LAUNCH("embedding_backward_weight_kernel");
  }
};

}  // namespace gpipe
