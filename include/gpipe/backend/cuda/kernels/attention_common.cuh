#pragma once
// What the flash attention kernels share, SIMT (attention.cuh) and tensor-core
// (attention_mma.cuh): the block size, document runs, the grid over (sample, tile) and heads.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/attention_common.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpipe/error.hpp"
#include "gpipe/model/attention.hpp"

namespace gpipe::cuda {

/// Threads per block of the flash attention kernels.
inline constexpr int flash_attention_threads = 128;

namespace detail {

// The first token of t's run of equal ids in `doc` (one sample's ids); 0 without documents.
__device__ __forceinline__ std::size_t run_start(const std::int32_t* doc, std::size_t t) {
  if (doc == nullptr) return 0;
  const std::int32_t id = doc[t];
  while (t > 0 && doc[t - 1] == id) --t;
  return t;
}

// Tiles of `tokens` rows: the blocks along a grid's x per sample.
__host__ __device__ __forceinline__ std::size_t flash_tiles(std::size_t tokens, int rows) {
  return (tokens + static_cast<std::size_t>(rows) - 1) / static_cast<std::size_t>(rows);
}

// The grid of a kernel over (sample, tile) along x and `heads` along y, checked against CUDA's
// limits.
inline dim3 flash_grid(const AttentionGeometry& g, int rows, std::size_t heads) {
  const std::size_t x = g.samples * flash_tiles(g.tokens, rows);
  if (x > 0x7fffffffu || heads > 65535)
    throw Error("gpipe: CUDA flash attention's grid of " + std::to_string(x) + " x " +
                std::to_string(heads) + " blocks exceeds CUDA's limits");
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(heads));
}

}  // namespace detail
}  // namespace gpipe::cuda
