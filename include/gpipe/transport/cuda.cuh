#pragma once
// CUDA transport: hands a stage's output (or input gradient) to the neighbouring stage's virtual
// device of a gpipe::cuda::Backend. The receiving device's work enqueues the hand-over after its
// wait for the sender's event, into memory it allocated itself (so the bytes are counted where
// they live); the executor frees the sender's buffer right after, in the receiver's stream order.
//   same GPU:       a device-to-device copy on the receiver's compute stream
//   different GPUs: a peer copy on the receiver's copy stream, or an NCCL send/recv pair when
//                   the backend was built with a NCCL communicator (BackendOptions::nccl); the
//                   compute stream waits for it by an event
// See gpipe::cuda::Kernels::receive.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/transport/cuda.cuh is CUDA code: compile it with nvcc (see gpipe/cuda.cuh)"
#endif

#include <cstddef>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/schedule/op.hpp"

namespace gpipe::transport {

/// The transport of `gpipe::cuda::Backend`: the receiving virtual device copies the sender's
/// buffer into memory it allocated, after its wait for the sender's event. On one GPU a
/// device-to-device copy on the receiver's compute stream; across GPUs a peer copy on its copy
/// stream, or an NCCL send/recv pair when the backend has a NCCL communicator.
struct CudaHandOver {
  /// One process issues both halves of every hand-over (peer copy, or an NCCL send/recv pair in
  /// one group), so no send waits for a recv still to be issued.
  static constexpr Sends sends = Sends::buffered;

  /// dst (n) on the receiver's device <- src (n) on the sender's device
  template <class T>
  static void receive(cuda::Kernels& receiver, const T* src, T* dst, std::size_t n) {
    receiver.receive(n, src, dst);
  }
};

}  // namespace gpipe::transport
