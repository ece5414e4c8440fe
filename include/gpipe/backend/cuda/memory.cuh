#pragma once
// Device memory of the CUDA backend: a stream-ordered caching allocator per virtual device with
// the host backend's byte accounting (current, peak and capacity, per MemoryKind), and
// Buffer<T>, an owning handle to one allocation.
//
// Allocations come from a cudaMemPool per physical GPU whose release threshold is unlimited, so
// freed blocks stay cached in the pool and are handed out again without cudaMalloc's device-wide
// synchronization. Allocation and free are stream-ordered: both are enqueued on the compute
// stream of the work that is running when they are called (StreamOrder), and outside any work
// on the compute stream of the allocation's own virtual device. That is what the runtime needs:
// a receiving stage allocates its copy of an activation and frees the sender's buffer from work
// on its own stream, and the pool reuses the freed block for later work on any stream only once
// the free has been reached (cudaMemPoolReuse* defaults: by event dependencies, or when the free
// has already completed).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/memory.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/memory.hpp"
#include "gpipe/error.hpp"

namespace gpipe::cuda {

namespace detail {

// The stream on which an allocation or free is ordered: the compute stream of the work running
// now (set by the backend around each piece of work), else the virtual device's own.
class StreamOrder {
 public:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  cudaStream_t stream_for(std::size_t device) const {
    if (stream_ != nullptr) return stream_;
    return current_ != none ? compute_[current_] : compute_[device];
  }
  void set_current(std::size_t device) { current_ = device; }
  // While not null, every allocation and free is ordered on `stream` instead: the copy stream of
  // work that runs there (cuda::Backend::submit_copy).
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  std::size_t current() const { return current_; }
  void add_device(cudaStream_t compute) { compute_.push_back(compute); }

 private:
  std::vector<cudaStream_t> compute_;
  std::size_t current_ = none;
  cudaStream_t stream_ = nullptr;
};

// One change of a device's counted bytes: an allocation (bytes > 0) or a free, of a kind. A CUDA
// graph keeps those of the step it captured and makes them again at each launch
// (cuda/step_graph.cuh), so that memory_stats counts a replayed step as an eager one.
struct MemoryChange {
  std::ptrdiff_t bytes;
  MemoryKind kind;
};

}  // namespace detail

/// One virtual device's counted memory. Allocation and free are called on the caller's thread
/// (the CUDA backend runs every piece of work there); the mutex guards the statistics against
/// readers on other threads.
class DeviceAllocator {
 public:
  /// Counts virtual device `device`'s memory against `capacity` bytes (0 = no cap); allocates from
  /// `pool`, GPU `gpu`'s, on the stream that `order` names; messages call the device `named`
  /// (BackendOptions::first_device + device). The backend makes one per device.
  DeviceAllocator(std::size_t device, int gpu, cudaMemPool_t pool, std::size_t capacity,
                  const detail::StreamOrder& order, std::size_t named)
      : counter_(device, capacity, named), named_(named), gpu_(gpu), pool_(pool), order_(order) {}
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  /// Throws OutOfMemory when the allocation would take the device past its capacity, or when the
  /// GPU has no memory left.
  void* allocate(std::size_t bytes, MemoryKind kind = MemoryKind::other) {
    if (bytes == 0) return nullptr;
    counter_.reserve(bytes, kind);
    if (log_ != nullptr) log_->push_back({static_cast<std::ptrdiff_t>(bytes), kind});
    void* p = nullptr;
    const cudaError_t error =
        cudaMallocFromPoolAsync(&p, bytes, pool_, order_.stream_for(device()));
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      counter_.release(bytes, kind);
      const std::string what =
          std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
      if (error == cudaErrorMemoryAllocation)
        throw OutOfMemory("gpipe: out of memory on device " + std::to_string(named_) + " (GPU " +
                          std::to_string(gpu_) + "): allocating " + std::to_string(bytes) +
                          " bytes failed (" + what + ")");
      throw Error("gpipe: allocating " + std::to_string(bytes) + " bytes on device " +
                  std::to_string(named_) + " (GPU " + std::to_string(gpu_) + ") failed: " + what);
    }
    return p;
  }

  /// Stream-ordered: the memory stays valid for work already enqueued on the free's stream.
  void deallocate(void* p, std::size_t bytes, MemoryKind kind = MemoryKind::other) noexcept {
    if (p == nullptr) return;
    // A failure here can only come from a broken context, which the next synchronize reports.
    if (cudaFreeAsync(p, order_.stream_for(device())) != cudaSuccess) (void)cudaGetLastError();
    counter_.release(bytes, kind);
    if (log_ != nullptr) log_->push_back({-static_cast<std::ptrdiff_t>(bytes), kind});
  }

  /// While `log` is not null, every allocation and free is also appended to it (a CUDA graph's
  /// capture, cuda/step_graph.cuh).
  void set_log(std::vector<detail::MemoryChange>* log) { log_ = log; }
  /// Counts `changes` as if their allocations and frees were made now, in order (a CUDA graph's
  /// launch); throws OutOfMemory, with none of them counted, where one would pass the capacity.
  void count(const std::vector<detail::MemoryChange>& changes) {
    std::size_t done = 0;
    try {
      for (; done < changes.size(); ++done) apply(changes[done]);
    } catch (...) {
      while (done-- > 0) apply({-changes[done].bytes, changes[done].kind});
      throw;
    }
  }
  /// Takes back a count(changes) that succeeded.
  void uncount(const std::vector<detail::MemoryChange>& changes) {
    for (std::size_t i = changes.size(); i-- > 0;) apply({-changes[i].bytes, changes[i].kind});
  }

  /// Bytes allocated now and at most since the last reset_peak(), in all and per MemoryKind, and
  /// the capacity; sizes as requested, the pool's cached blocks not counted.
  MemoryStats stats() const { return counter_.stats(); }
  /// Sets the peaks (in all and per kind) to the current bytes, of the device and of the pinned
  /// host memory held for it.
  void reset_peak() {
    counter_.reset_peak();
    host_.reset_peak();
  }

  /// Counts `bytes` of pinned host memory as held for this device's activations (Remat::offload's
  /// blocks, cuda/offload.cuh); no cap.
  void reserve_host(std::size_t bytes) { host_.reserve(bytes, MemoryKind::activations); }
  /// Takes back a reserve_host(bytes).
  void release_host(std::size_t bytes) noexcept { host_.release(bytes, MemoryKind::activations); }
  /// The pinned host memory held for this device (reserve_host), as MemoryStats (no capacity).
  MemoryStats host_stats() const { return host_.stats(); }
  /// The virtual device whose memory this counts (named in out-of-memory messages).
  std::size_t device() const { return counter_.device(); }
  /// CUDA device ordinal of the GPU the memory is on.
  int gpu() const { return gpu_; }

 private:
  // Undoing a release re-reserves bytes counted before it, so only a forward change can throw.
  void apply(const detail::MemoryChange& c) {
    if (c.bytes > 0)
      counter_.reserve(static_cast<std::size_t>(c.bytes), c.kind);
    else
      counter_.release(static_cast<std::size_t>(-c.bytes), c.kind);
  }

  gpipe::detail::MemoryCounter counter_;
  gpipe::detail::MemoryCounter host_{device(), 0};  // pinned host memory held for the device
  std::vector<detail::MemoryChange>* log_ = nullptr;
  std::size_t named_;
  int gpu_;
  cudaMemPool_t pool_;
  const detail::StreamOrder& order_;
};

/// Owns `size` elements of T in one virtual device's memory (uninitialized). Move-only; empty when
/// size is 0. Freeing is stream-ordered (see the top of this file).
template <class T>
using Buffer = gpipe::detail::Buffer<T, DeviceAllocator>;

}  // namespace gpipe::cuda
