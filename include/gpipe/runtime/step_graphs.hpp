#pragma once
// The seam through which a backend replays a training step's work instead of issuing it op by op
// (CUDA Graphs: backend/cuda/step_graphs.cuh specializes StepGraphs for cuda::Backend). The
// executor describes each step by a StepKey (everything that decides what the step issues: the
// schedule, the split, the remat policy, which inputs there are, the scalars its kernels take, the
// arrays it reads and writes) and asks next() how to run it; this primary template, every backend
// without graphs, issues every step.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gpipe::detail {

// What decides a step's work, as the executor lists it: two steps with equal keys issue the same
// work on the same memory, so that a graph of one replays the other.
using StepKey = std::vector<std::uint64_t>;

// How a step runs: issued op by op (eager), issued into a graph that is then launched (capture),
// or a launch of the graph of an earlier step with the same key (replay).
enum class StepMode { eager, capture, replay };

// The host arrays a step copies from or to the devices. A backend that captures steps keeps them
// at fixed addresses that its graphs read and write; here they are plain host memory.
enum class HostArray : std::size_t { x, y, document, token_bits, losses, out, count };

template <class Backend>
class StepGraphs {
 public:
  explicit StepGraphs(Backend&) {}

  // The step's input `given` where the step reads it: here, where it is.
  template <class T>
  std::span<const T> input(HostArray, std::span<const T> given) {
    return given;
  }
  // n elements of host memory for what the step writes (or a derived input), valid until the
  // next call for `which`.
  template <class T>
  std::span<T> output(HostArray which, std::size_t n) {
    std::vector<std::byte>& a = arrays_[static_cast<std::size_t>(which)];
    a.resize(n * sizeof(T));
    return {reinterpret_cast<T*>(a.data()), n};
  }
  // How to run the step described by `key`: always issued.
  StepMode next(const StepKey&) { return StepMode::eager; }
  // Never called here (next() never answers capture or replay). A backend's begin_capture() may
  // decline (false): the step is then issued op by op.
  bool begin_capture() { return false; }
  bool end_capture(std::string&) { return false; }
  void launch() {}
  // After a step that failed: the next step is issued op by op, whatever its key.
  void forget() {}

 private:
  std::vector<std::byte> arrays_[static_cast<std::size_t>(HostArray::count)];
};

}  // namespace gpipe::detail
