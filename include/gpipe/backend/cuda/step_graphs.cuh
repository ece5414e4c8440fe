#pragma once
// StepGraphs for cuda::Backend (the seam: runtime/step_graphs.hpp): a step whose key equals the
// previous step's is captured into a CUDA graph (the first of them is issued op by op, so that
// kernel scratch, cuBLAS workspaces and algorithm choices are settled before the capture), and
// every later step with that key launches the graph. A step with another key is issued op by op
// and drops the graph. The step's host arrays live in pinned memory at fixed addresses, which the
// graph's copies read and write at each launch.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/step_graphs.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "gpipe/backend/cuda/backend.cuh"
#include "gpipe/backend/cuda/step_graph.cuh"
#include "gpipe/runtime/step_graphs.hpp"

namespace gpipe::detail {

template <>
class StepGraphs<cuda::Backend> {
 public:
  explicit StepGraphs(cuda::Backend& backend) : backend_(backend) {}

  template <class T>
  std::span<const T> input(HostArray which, std::span<const T> given) {
    if (!backend_.graphs()) return given;
    const std::span<T> kept = output<T>(which, given.size());
    if (!given.empty()) std::memcpy(kept.data(), given.data(), given.size_bytes());
    return kept;
  }
  template <class T>
  std::span<T> output(HostArray which, std::size_t n) {
    cuda::PinnedArray<std::byte>& a = arrays_[static_cast<std::size_t>(which)];
    if (a.reserve(n * sizeof(T))) forget();  // a graph copies from or to the old address
    return {reinterpret_cast<T*>(a.span().data()), n};
  }

  StepMode next(StepKey key) {
    if (!backend_.graphs()) return StepMode::eager;
    key.push_back(backend_.tracing() ? 1 : 0);  // a traced step records more events
    if (graph_ != nullptr && key == key_) return StepMode::replay;
    graph_.reset();
    if (key == key_ && !refused_) return StepMode::capture;
    key_ = key;
    refused_ = false;
    return StepMode::eager;
  }
  bool begin_capture() { return backend_.begin_capture(); }
  // The graph of the step issued since begin_capture(), or false (and the step is to be issued
  // again, op by op): then the key is not captured again until it changes.
  bool end_capture(std::string& why) {
    graph_ = backend_.end_capture(why);
    refused_ = graph_ == nullptr;
    return graph_ != nullptr;
  }
  void launch() { backend_.launch(*graph_); }
  // After a failed step, or when the graph reads or writes an array that moved: the next step
  // is issued op by op, and its key captured on the step after it.
  void forget() {
    graph_.reset();
    key_.clear();
    refused_ = false;
  }

 private:
  cuda::Backend& backend_;
  cuda::PinnedArray<std::byte> arrays_[static_cast<std::size_t>(HostArray::count)];
  StepKey key_;                             // the latest step's
  bool refused_ = false;                    // key_'s capture failed
  std::unique_ptr<cuda::StepGraph> graph_;  // key_'s
};

}  // namespace gpipe::detail
