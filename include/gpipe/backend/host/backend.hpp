#pragma once
// gpipe::host::Backend: K devices on the CPU. Each device is a worker thread running an in-order
// stream, with its own counted (and optionally capped) memory. GEMMs go through oneDNN on the
// worker's own thread alone, so K workers use K cores and do not oversubscribe them.
//
//   gpipe::host::Backend backend(4, {.device_capacity = 256 << 20});
//   backend.submit(d, {"forward", stage, mb}, [&](gpipe::host::Kernels<float>& k) { ... });
//   backend.synchronize();   // rethrows the first failure, naming where it happened

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/concepts.hpp"
#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/layers/activation.hpp"
#include "gpipe/backend/host/layers/attention.hpp"
#include "gpipe/backend/host/layers/embedding.hpp"
#include "gpipe/backend/host/layers/gelu_tanh.hpp"
#include "gpipe/backend/host/layers/layer_norm.hpp"
#include "gpipe/backend/host/memory.hpp"
#include "gpipe/backend/host/stream.hpp"
#include "gpipe/error.hpp"

namespace gpipe::host {

struct BackendOptions {
  std::size_t device_capacity = 0;  ///< bytes per device; 0 = no cap
  /// The number the first device goes by in errors, traces and out-of-memory messages (the
  /// devices are still addressed 0..K-1): an mpi::Backend's one device is its pipeline index.
  std::size_t first_device = 0;
};

class Backend {
 public:
  using Options = BackendOptions;

  using Kernels = host::Kernels<float>;
  using Event = host::Event;
  template <class T>
  using Buffer = host::Buffer<T>;

  static constexpr std::string_view name = "host";

  explicit Backend(std::size_t num_devices, Options options = {}) {
    detail::require(num_devices > 0, "host::Backend needs at least one device");
    detail::require(num_devices <= 1024, "host::Backend supports at most 1024 devices, got " +
                                             std::to_string(num_devices));
    allocators_.reserve(num_devices);
    streams_.reserve(num_devices);
    for (std::size_t d = 0; d < num_devices; ++d) {
      const std::size_t named = options.first_device + d;
      allocators_.push_back(std::make_unique<DeviceAllocator>(named, options.device_capacity));
      streams_.push_back(std::make_unique<Stream>(named, group_, epoch_));
    }
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  /// Joins every worker; work not yet started is dropped.
  ~Backend() { streams_.clear(); }

  std::size_t num_devices() const { return streams_.size(); }
  /// What the microseconds of traces and timings count from: the backend's construction.
  Stream::Clock::time_point epoch() const { return epoch_; }

  MemoryStats memory_stats(std::size_t device) const { return allocator(device).stats(); }
  void reset_peak() {
    for (auto& a : allocators_) a->reset_peak();
  }

  /// Uninitialized memory on `device`; throws OutOfMemory past the device's capacity.
  template <class T>
  Buffer<T> allocate(std::size_t device, std::size_t count, MemoryKind kind = MemoryKind::other) {
    return Buffer<T>(allocator(device), count, kind);
  }

  /// Stream operations: each runs on the device's worker, in submission order.
  void submit(std::size_t device, WorkLabel label, Stream::Work work) {
    stream(device).submit(label, std::move(work));
  }
  void record(std::size_t device, const Event& event) { stream(device).record(event); }
  void wait(std::size_t device, const Event& event) { stream(device).wait(event); }

  /// Tracing of every piece of stream work (see Stream::set_tracing); take_trace() returns what
  /// ran since the last call, all devices, ordered by start time.
  void set_tracing(bool on) {
    for (auto& s : streams_) s->set_tracing(on);
  }
  std::vector<TraceEvent> take_trace() {
    std::vector<TraceEvent> all;
    for (auto& s : streams_) {
      s->synchronize();
      for (TraceEvent& e : s->take_trace()) all.push_back(e);
    }
    std::sort(all.begin(), all.end(),
              [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
    return all;
  }

  /// Compute time per device since the last call (see ComputeTiming).
  std::vector<ComputeTiming> take_timing() {
    std::vector<ComputeTiming> out;
    for (auto& s : streams_) {
      s->synchronize();
      out.push_back(s->take_timing());
    }
    return out;
  }

  /// Skips all work not yet run and releases every event wait; the next synchronize() returns
  /// normally once the streams are idle. For a caller that cannot finish issuing a step.
  void cancel() {
    group_.fail(nullptr, {});
    for (auto& s : streams_) s->synchronize();
    group_.take_error();
  }

  /// Blocks until all submitted work has finished; then, if any of it failed, throws the first
  /// failure (OutOfMemory stays OutOfMemory) with where it happened in front of its message.
  void synchronize() {
    for (auto& s : streams_) s->synchronize();
    StreamGroup::Failure failure = group_.take_error();
    if (!failure.error) return;
    gpipe::detail::rethrow_from(failure.error, failure.where);
  }

 private:
  DeviceAllocator& allocator(std::size_t device) const {
    check_device(device);
    return *allocators_[device];
  }
  Stream& stream(std::size_t device) {
    check_device(device);
    return *streams_[device];
  }
  void check_device(std::size_t device) const {
    detail::require(device < streams_.size(), "device " + std::to_string(device) +
                                                  " does not exist; the backend has " +
                                                  std::to_string(streams_.size()) + " devices");
  }

  /// Declaration order matters: streams (which may free buffers as they drop work) are destroyed
  /// before the allocators and the group they use.
  Stream::Clock::time_point epoch_ = Stream::Clock::now();
  std::vector<std::unique_ptr<DeviceAllocator>> allocators_;
  StreamGroup group_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

}  // namespace gpipe::host

static_assert(gpipe::backend<gpipe::host::Backend>);
