#pragma once
// A CUDA machine emulated on the CPU, so that the whole CUDA backend (gpipe/backend/cuda/, compiled
// by the host compiler under GPIPE_CUDA_EMULATION) runs its tests where there is no GPU:
//   cuda_emulation/device.hpp   kernels: every CUDA thread a coroutine, barriers, warp shuffles
//   cuda_emulation/runtime.hpp  the CUDA runtime: GPUs, streams, events, memory, copies
//   cuda_emulation/graphs.hpp   CUDA Graphs: stream capture, instantiation, launch
//   cuda_emulation/cublas.hpp   cuBLAS: cublasSgemm
//   cuda_emulation/cublas_lt.hpp cuBLASLt: cublasLtMatmul with the bias epilogues
//   cuda_emulation/nccl.hpp     NCCL: communicators, grouped send/receive
//   cuda_emulation/nccl_net.hpp NCCL between processes (ncclCommInitRank): ranks over sockets
//
// The model, and what it checks:
//   - Two GPUs by default (machine().gpus, set before the first call), each with
//     machine().gpu_memory bytes; cudaSetDevice/cudaGetDevice per host thread.
//   - A stream is a worker thread that runs its operations in order (kernels, copies, memsets,
//     host functions, event records and waits, stream-ordered frees, cuBLAS GEMMs, NCCL halves),
//     concurrently with the host and with other streams, so a missing event dependency shows up
//     as a wrong result or a race rather than being hidden by a serial order.
//   - Events: a record completes when its stream reaches it (at once on an idle stream);
//     cudaStreamWaitEvent and cudaEventSynchronize wait for the most recent record issued before
//     the call (CUDA's rule).
//   - Device memory from pools: allocated when cudaMallocFromPoolAsync is called, freed when its
//     stream reaches cudaFreeAsync; new memory is filled with 0xff bytes (NaN as float), so a
//     kernel that reads what nobody wrote spoils its result, and one that writes past the end
//     of an allocation fails its stream when the allocation is freed. Copies check that their
//     pointers are device or host memory as their kind says; cudaPointerGetAttributes knows which
//     GPU holds a pointer.
//   - A kernel launch (and a GEMM) on a stream of another GPU than the current one fails, as on
//     a GPU; so does one whose pointer arguments are not device memory when it runs (host memory,
//     or memory whose stream-ordered free came first) or another GPU's memory without access
//     granted by cudaMemPoolSetAccess, which would fault on a GPU. A kernel that
//     breaks the kernel emulator's rules (device.hpp) makes its stream fail with
//     cudaErrorLaunchFailure (the message goes to stderr), reported by the next synchronization;
//     later work on that stream is skipped, its event records still complete.
//   - cublasSgemm: column-major FP32 reference (TF32 mode rounds the operands to 10-bit
//     mantissas first); C is not read when beta is 0.
//   - cublasLtMatmul: the same reference with the epilogues BIAS and BGRADB, in stream
//     order; descriptors, layouts, preferences and the heuristic are modelled for what the
//     backend sets, and anything else is rejected with an error status (cublas_lt.hpp).
//   - NCCL: ncclCommInitAll over the emulated GPUs; ncclSend/ncclRecv pairs of one group meet on
//     their streams (the send's stream waits until the receive has copied). The streams must be
//     on the communicators' GPUs. Between processes (each its own emulated machine, as MPI ranks
//     are): ncclGetUniqueId + ncclCommInitRank, ncclSend/ncclRecv (a send completes with its
//     receive), ncclAllReduce (float sum), ncclCommAbort and ncclCommGetAsyncError
//     (ncclRemoteError once a peer is lost); see nccl_net.hpp.
// Not modelled: timing, the pools' block reuse, peer access beyond pool grants (they count per GPU
// pair, not per pool; cudaDeviceEnablePeerAccess does not exist here), the null stream's implicit
// synchronization (it runs work at once on the calling thread), the GPU's math library rounding.
//
// Include this first, in one translation unit per test program that links none of cudart,
// cuBLAS, cuBLASLt and NCCL: it defines their functions that the backend calls, or, with
// GPIPE_CUDA_EMULATION_LINKED defined, leaves them to the library gpipe_cuda_emulation
// (cuda_emulation.cpp, which gpipe_use_cuda_emulation links).

#include "support/cuda_emulation/device.hpp"
// device.hpp first: it sets GPIPE_CUDA_EMULATION and the device vocabulary.
#include "support/cuda_emulation/cublas.hpp"
#include "support/cuda_emulation/cublas_lt.hpp"
#include "support/cuda_emulation/graphs.hpp"
#include "support/cuda_emulation/nccl.hpp"
#include "support/cuda_emulation/runtime.hpp"
