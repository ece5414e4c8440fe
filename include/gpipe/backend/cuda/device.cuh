#pragma once
// What the CUDA backend keeps per physical GPU and per virtual device. A virtual device is what
// the runtime calls a device: its own compute stream, copy stream, cuBLAS and cuBLASLt handles,
// counted memory and staging buffers, on one physical GPU that other virtual devices may share.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/device.cuh is CUDA code: compile it with nvcc"
#endif

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/error.hpp"

namespace gpipe::cuda::detail {

// Makes `gpu` current for the scope and restores the caller's device after, so that the backend
// does not change the current device of the caller's thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int gpu) {
    GPIPE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (gpu != previous_) GPIPE_CUDA_CHECK(cudaSetDevice(gpu));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// Every wait of the CUDA backend for the GPU polls through this, so that none outlasts its
// deadline (BackendOptions::wait_timeout). Polls `done()` until it holds, or until `deadline`:
// whether it held. Yields the core between polls (as cudaStreamSynchronize spins by default) and,
// once it has waited over poll_spin, sleeps between them for 1 % of the time waited so far, at
// most 1 ms: a long wait costs about no CPU, and the polls' lateness is at most 1 % of the wait.
// `done` is polled at least once, also past the deadline.
inline constexpr std::chrono::milliseconds poll_spin{10};
template <class Done>
bool poll_until(std::chrono::steady_clock::time_point deadline, Done done) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (;;) {
    if (done()) return true;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    if (now - start < poll_spin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::min<Clock::duration>(
          {(now - start) / 100, std::chrono::milliseconds(1), deadline - now}));
    }
  }
}

// One physical GPU of the backend.
struct GpuState {
  int id = 0;                       // CUDA device ordinal
  cudaMemPool_t pool = nullptr;     // every virtual device on this GPU allocates from it
  cudaEvent_t epoch = nullptr;      // timing events count from it (WorkTimer::anchor_all)
  double epoch_us = 0;              // host time of `epoch`, microseconds since the backend's epoch
  std::vector<cudaEvent_t> timing;  // idle timing events for traces
  cudaStream_t send = nullptr;      // NCCL sends from this GPU
  cudaEvent_t send_done = nullptr;  // recorded on `send` after each send
  int rank = -1;                    // NCCL rank (index among the backend's GPUs)
  void* comm = nullptr;             // ncclComm_t when the backend uses NCCL
};

// Pinned host memory through which upload and download pass, so that a copy from pageable
// memory never blocks the caller until the stream drains: the caller copies into a pinned block,
// the stream copies the block to the device. Blocks are reused once their last copy finished (an
// event per block), at most max_blocks per virtual device; with all of them in flight the caller
// waits for the oldest, at most `wait_timeout`.
class HostStaging {
 public:
  static constexpr std::size_t block_bytes = std::size_t{4} << 20;
  static constexpr std::size_t max_blocks = 8;

  // How long acquire() waits for a block (BackendOptions::wait_timeout).
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(10)};

  struct Block {
    void* data = nullptr;
    cudaEvent_t done = nullptr;  // recorded after the block's last copy
    std::uint64_t last_use = 0;
  };

  HostStaging() = default;
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  ~HostStaging() { release_all(); }

  // A block free for the next chunk; the caller's current device is the stream's.
  Block& acquire() {
    Block* oldest = nullptr;
    for (Block& b : blocks_) {
      const cudaError_t state = cudaEventQuery(b.done);
      if (state == cudaSuccess) return b;
      if (state != cudaErrorNotReady) GPIPE_CUDA_CHECK(state);
      if (oldest == nullptr || b.last_use < oldest->last_use) oldest = &b;
    }
    if (blocks_.size() < max_blocks) {
      Block b;
      GPIPE_CUDA_CHECK(cudaHostAlloc(&b.data, block_bytes, cudaHostAllocPortable));
      const cudaError_t made = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
      if (made != cudaSuccess) {
        (void)cudaFreeHost(b.data);
        GPIPE_CUDA_CHECK(made);
      }
      blocks_.push_back(b);
      return blocks_.back();
    }
    // the oldest block's copy waits behind the stream's earlier work, which may never end
    cudaError_t state = cudaSuccess;
    const bool done = poll_until(std::chrono::steady_clock::now() + wait_timeout, [&] {
      state = cudaEventQuery(oldest->done);
      return state != cudaErrorNotReady;
    });
    if (!done)
      throw Error("gpipe: every pinned staging block of the device is still in use after " +
                  std::to_string(wait_timeout.count()) +
                  " ms (cuda::BackendOptions::wait_timeout): the copies through them wait behind "
                  "the stream's earlier work, which has not finished (is a kernel stuck?)");
    GPIPE_CUDA_CHECK(state);
    return *oldest;
  }
  // The block is in use until everything enqueued on `stream` so far has run.
  void release(Block& b, cudaStream_t stream) {
    b.last_use = ++clock_;
    GPIPE_CUDA_CHECK(cudaEventRecord(b.done, stream));
  }

  // Frees every block; the streams that used them must be idle.
  void release_all() noexcept {
    for (Block& b : blocks_) {
      (void)cudaEventDestroy(b.done);
      (void)cudaFreeHost(b.data);
    }
    blocks_.clear();
  }

 private:
  std::vector<Block> blocks_;
  std::uint64_t clock_ = 0;
};

// The cuBLASLt algorithm that kernels/linear.cuh chose for one problem (`key`: shape, types,
// transposes, epilogue, operand alignments), so that the heuristic runs once per problem; `found`
// is false where it had none.
struct LtAlgoChoice {
  std::array<std::uint64_t, 6> key{};
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;  // bytes the algorithm needs
};

// One virtual device.
struct DeviceState {
  std::size_t index = 0;  // virtual device number
  GpuState* gpu = nullptr;
  bool multi_gpu = false;  // the backend spans several GPUs: copies check where pointers live
  bool nccl = false;       // cross-GPU receives go through NCCL
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t blas_lt = nullptr;  // cuBLASLt: Linear's GEMMs with their bias epilogues
  bool tf32 = false;                   // BackendOptions::tf32: float GEMMs may round to TF32
  cudaEvent_t ready = nullptr;         // transfer bookkeeping: compute -> copy stream
  cudaEvent_t done = nullptr;          // copy stream -> compute
  float* scratch = nullptr;  // kernel scratch (column-sum partials, per-row losses), uncounted
  std::size_t scratch_floats = 0;
  float* wide = nullptr;  // the bf16 context's floats to and from the host, uncounted
  std::size_t wide_floats = 0;
  float* cast = nullptr;  // the bf16 context's GEMM operands rounded to bf16, uncounted
  std::size_t cast_floats = 0;
  float* lt_workspace = nullptr;  // cuBLASLt's workspace, as its algorithms ask, uncounted
  std::size_t lt_workspace_floats = 0;
  std::vector<LtAlgoChoice> lt_algos;  // cuBLASLt's algorithms chosen so far
  HostStaging staging;
  std::vector<GpuState>* gpus = nullptr;  // all of the backend's GPUs (for cross-GPU receives)
  // The device's streams are being captured into a CUDA graph (cuda/step_graph.cuh): copies
  // between host and device go straight to and from pinned memory, and scratch may not grow.
  bool capturing = false;
  // Set for the downloads issued so far when a synchronize() gave up on work still running
  // (BackendOptions::wait_timeout): they then skip their copy into the caller's memory, which
  // may be gone by the time the stream gets there. Each download holds the flag of its time.
  std::shared_ptr<std::atomic<bool>> downloads_abandoned = std::make_shared<std::atomic<bool>>();
};

// `block` (of `have` floats, in device `s`'s pool) grown to at least `floats`, in stream order:
// the old block is freed on the compute stream, so work already enqueued still reads it. The
// contents are not kept. Null for 0 floats.
inline float* grow_scratch(DeviceState& s, float*& block, std::size_t& have, std::size_t floats) {
  if (floats == 0) return nullptr;
  if (floats > have) {
    // A graph would own the new block, which outlives the graph: the step runs eagerly instead.
    if (s.capturing)
      throw Error("gpipe: a CUDA graph cannot capture this step: device " +
                  std::to_string(s.index) + "'s scratch must grow to " + std::to_string(floats) +
                  " floats");
    const std::size_t grown = std::max(floats, have + have / 2);
    if (block != nullptr) GPIPE_CUDA_CHECK(cudaFreeAsync(block, s.compute));
    block = nullptr;
    have = 0;
    void* p = nullptr;
    GPIPE_CUDA_CHECK(cudaMallocFromPoolAsync(&p, grown * sizeof(float), s.gpu->pool, s.compute));
    block = static_cast<float*>(p);
    have = grown;
  }
  return block;
}

// The physical GPU that holds device memory `p`.
inline int gpu_of(const void* p) {
  cudaPointerAttributes attributes{};
  GPIPE_CUDA_CHECK(cudaPointerGetAttributes(&attributes, p));
  return attributes.device;
}

}  // namespace gpipe::cuda::detail
