#pragma once
// Offload for mpi::CudaBackend (the seam: runtime/offload.hpp): the pinned blocks and copies of
// cuda::Backend's (cuda/offload.cuh) on this rank's device, through the rank's copy stream.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/mpi/offload.cuh is CUDA code: compile it with nvcc"
#endif

#include "gpipe/backend/cuda/offload.cuh"
#include "gpipe/backend/mpi/cuda_backend.cuh"
#include "gpipe/runtime/offload.hpp"

namespace gpipe::detail {

template <>
class Offload<mpi::CudaBackend> : public cuda::detail::OffloadBlocks<mpi::CudaBackend> {
 public:
  static constexpr bool supported = true;
  using OffloadBlocks::OffloadBlocks;
};

}  // namespace gpipe::detail
