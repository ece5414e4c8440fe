#pragma once
// NCCL between ranks: the hand-over policy of gpipe::mpi::CudaBackend. Each rank holds one device,
// so its transport (transport/mpi.hpp) hands activations and gradients over with the backend's send
// and receive (ncclSend/ncclRecv); what this policy tells the Trainer is how those behave: a
// send completes only together with its receive (Sends::rendezvous), so the schedule is ordered
// for that (order_for_rendezvous) and each pair's messages must be posted in one order on both
// sides (messages_in_order), as NCCL matches them by order.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/transport/nccl_hand_over.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe::transport {

/// The hand-over policy of `gpipe::mpi::CudaBackend`: NCCL between ranks, whose sends complete only
/// with their receives. Its transport (transport/mpi.hpp) hands data over with the backend's
/// send and receive; `receive` here is never called (a rank has one device).
struct NcclHandOver {
  /// NCCL point-to-point: a send completes only together with its receive.
  static constexpr Sends sends = Sends::rendezvous;

  /// Not used across processes: throws `gpipe::Error`.
  template <class T>
  static void receive(cuda::Kernels&, const T*, T*, std::size_t) {
    throw Error(
        "gpipe: transport::NcclHandOver hands data over with mpi::CudaBackend's send and "
        "receive, not between devices of one process");
  }
};

}  // namespace gpipe::transport
