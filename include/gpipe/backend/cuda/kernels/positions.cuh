#pragma once
// Token positions of packed documents on the device: each token's place in its run of equal
// document ids within its sample (README, "packed documents"), for every layer whose positions
// restart where a document starts (Embedding's learned positions; rotary ones likewise). Host
// reference: gpipe/backend/host/kernels/positions.hpp.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/positions.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

namespace detail {
// Threads of document_positions_kernel's block: each walks a contiguous segment of its sample.
inline constexpr unsigned position_threads = 256;
}  // namespace detail

/// position(samples tokens) = each row's distance from the first row of its run of equal ids in
/// document within its sample of `tokens` rows: a block per sample, each thread a contiguous
/// segment of it, the run in effect at a segment's start being the last run start of the
/// segments before it (a max-scan over the segments; run starts increase along the sample).
template <class Id>
__global__ void __launch_bounds__(detail::position_threads)
    document_positions_kernel(std::size_t tokens, const Id* document, std::uint32_t* position) {
  __shared__ std::size_t last_start[detail::position_threads];
  const Id* doc = document + blockIdx.x * tokens;
  std::uint32_t* out = position + blockIdx.x * tokens;
  const std::size_t per = (tokens + blockDim.x - 1) / blockDim.x;
  const std::size_t begin = threadIdx.x * per < tokens ? threadIdx.x * per : tokens;
  const std::size_t end = begin + per < tokens ? begin + per : tokens;
  auto starts_run = [doc](std::size_t t) { return t == 0 || doc[t] != doc[t - 1]; };
  std::size_t start = 0;  // the segment's last run start (token 0 starts one: 0 is neutral)
  for (std::size_t t = begin; t < end; ++t)
    if (starts_run(t)) start = t;
  last_start[threadIdx.x] = start;
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive max-scan: the start in effect before each segment
    std::size_t run = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) {
      const std::size_t own = last_start[i];
      last_start[i] = run;
      run = own > run ? own : run;
    }
  }
  __syncthreads();
  std::size_t current = last_start[threadIdx.x];
  for (std::size_t t = begin; t < end; ++t) {
    if (starts_run(t)) current = t;
    out[t] = static_cast<std::uint32_t>(t - current);
  }
}

/// position (rows) <- each row's place in its run of equal ids in document (rows) within its
/// sample of `tokens` rows, rows a whole number of samples, on `stream` (host reference:
/// host::document_positions, there as std::size_t).
GPIPE_CUDA_INLINE void document_positions(std::size_t rows, std::size_t tokens,
                                          const std::int32_t* document, std::uint32_t* position,
                                          cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void document_positions(std::size_t rows, std::size_t tokens,
                                          const std::int32_t* document, std::uint32_t* position,
                                          cudaStream_t stream) {
  if (rows == 0) return;
  detail::record_kernel("document_positions_kernel", {rows, tokens, 0}, 0,
                        detail::bytes_of<std::int32_t>(rows), detail::bytes_of<std::uint32_t>(rows),
                        stream);
  GPIPE_CUDA_LAUNCH(document_positions_kernel<std::int32_t>, static_cast<unsigned>(rows / tokens),
                    detail::position_threads, stream)
  (tokens, document, position);
  GPIPE_CUDA_CHECK_LAUNCH("document_positions_kernel");
}
#endif

}  // namespace gpipe::cuda
