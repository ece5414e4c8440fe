#pragma once
// CUDA Graphs for the CUDA backend: a training step's work on every virtual device (on one GPU or
// several: peer copies between them are part of the graph), captured once
// (cuda::Backend::begin_capture .. end_capture) and launched again for each later step of the same
// shape (cuda::Backend::launch), so that the host issues one graph instead of every kernel of every
// op. What a launch repeats besides the kernels: the memory_stats counts of the step's allocations
// and frees (each device's MemoryChanges, in capture order), and the timing events of its work
// (recorded by the graph itself, so traces and compute timings still show every op). Copies between
// host and device in a captured step use pinned memory whose addresses the graph keeps
// (PinnedArray): the step's inputs are written there before each launch, its outputs read from
// there after.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/step_graph.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/memory.cuh"
#include "gpipe/backend/cuda/timing.cuh"

namespace gpipe::cuda {

/// `size()` elements of T in pinned host memory (cudaHostAlloc), uninitialized; grows, never
/// shrinks. What a captured step copies from and to the device lives in such arrays, at addresses
/// the graph keeps.
template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
  }

  /// Room for n elements at the same address as before when that had room; returns whether the
  /// address changed (a graph that copies from or to the old one must be captured again).
  bool reserve(std::size_t n) {
    size_ = n;
    if (n <= capacity_) return false;
    if (data_ != nullptr) GPIPE_CUDA_CHECK(cudaFreeHost(data_));
    data_ = nullptr;
    capacity_ = 0;
    void* p = nullptr;
    GPIPE_CUDA_CHECK(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocPortable));
    data_ = static_cast<T*>(p);
    capacity_ = n;
    return true;
  }
  /// The elements (n of the last reserve).
  std::span<T> span() const { return {data_, size_}; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
};

class Backend;

/// One captured step, instantiated: what cuda::Backend::launch repeats. Made by
/// cuda::Backend::end_capture; destroying it waits for the backend's streams and frees the graph
/// and its events. It must not outlive the backend.
class StepGraph {
 public:
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph();

 private:
  friend class Backend;
  explicit StepGraph(Backend& backend, std::size_t devices)
      : backend_(&backend), memory_(devices) {}

  Backend* backend_;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<std::vector<detail::MemoryChange>> memory_;  // per virtual device, capture order
  std::vector<detail::WorkTimer::Timed> timed_;            // its timed work, the graph's events
};

}  // namespace gpipe::cuda
