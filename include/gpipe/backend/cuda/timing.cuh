#pragma once
// Tracing and compute timing of the CUDA backend's work: a pair of CUDA events around each timed
// piece of work on its compute stream, turned into TraceEvents and ComputeTimings when taken,
// with each GPU's event clock tied to the backend's host epoch. Its waits for events and streams
// (take_trace, take_timing, anchor_all) have no deadline of their own: cuda::Backend calls them
// once its streams are idle (its bounded wait, BackendOptions::wait_timeout, came first), so that
// they find their work done; the epoch's record on an idle stream is all they wait for.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/timing.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/cuda/device.cuh"
#include "gpipe/backend/cuda/device_set.cuh"
#include "gpipe/backend/cuda/error.cuh"

namespace gpipe::cuda::detail {

// Times the work of a DeviceSet's virtual devices: traced work (while tracing is on, not
// internal) and compute work (label.compute, always). Times are microseconds since `epoch`, as
// the host backend's.
class WorkTimer {
 public:
  using Clock = std::chrono::steady_clock;

  WorkTimer(DeviceSet& devices, Clock::time_point epoch) : devices_(devices), epoch_(epoch) {}
  WorkTimer(const WorkTimer&) = delete;
  WorkTimer& operator=(const WorkTimer&) = delete;
  ~WorkTimer() { release(); }

  // The events around one timed piece of work.
  struct Timed {
    std::size_t device;
    WorkLabel label;
    cudaEvent_t start, end;
    bool traced, compute;
    bool graph = false;  // a CUDA graph's: recorded by each launch, destroyed with the graph
  };

  Clock::time_point epoch() const { return epoch_; }
  void set_tracing(bool on) { tracing_ = on; }
  bool tracing() const { return tracing_; }

  // While `captured` is not null, work is being captured into a CUDA graph: its events are new,
  // recorded as the graph's own nodes (cudaEventRecordExternal) and kept in `captured` instead of
  // pending, for launched() to time each launch.
  void set_capture(std::vector<Timed>* captured) { captured_ = captured; }

  // Records the start of work `label` on device d's compute stream, or on `stream` (one of the
  // device's streams; its GPU current), when the work is timed; returns the event to record at
  // its end, or null when it is not timed.
  cudaEvent_t start(std::size_t d, const WorkLabel& label, cudaStream_t stream = nullptr) {
    const bool traced = tracing_ && !label.internal;
    if (!traced && !label.compute) return nullptr;
    DeviceState& s = devices_[d];
    if (stream == nullptr) stream = s.compute;
    if (captured_ != nullptr) {
      cudaEvent_t start = nullptr, end = nullptr;
      GPIPE_CUDA_CHECK(cudaEventCreate(&start));
      if (const cudaError_t made = cudaEventCreate(&end); made != cudaSuccess) {
        (void)cudaEventDestroy(start);
        GPIPE_CUDA_CHECK(made);
      }
      captured_->push_back({d, label, start, end, traced, label.compute, true});
      GPIPE_CUDA_CHECK(cudaEventRecordWithFlags(start, stream, cudaEventRecordExternal));
      return end;
    }
    const cudaEvent_t start = timing_event(*s.gpu), end = timing_event(*s.gpu);
    pending_.push_back({d, label, start, end, traced, label.compute});
    GPIPE_CUDA_CHECK(cudaEventRecord(start, stream));
    return end;
  }
  // Records `end`, as start() returned it, after the work on device d's compute stream, or on
  // `stream` (start's).
  void stop(std::size_t d, cudaEvent_t end, cudaStream_t stream = nullptr) {
    GPIPE_CUDA_CHECK(cudaEventRecordWithFlags(end, stream != nullptr ? stream : devices_[d].compute,
                                              captured_ != nullptr ? cudaEventRecordExternal : 0));
  }

  // A launch of a graph whose captured work is `timed`: its events are pending until taken. The
  // events of an earlier launch are resolved first (each launch records the same events).
  void launched(const std::vector<Timed>& timed) {
    if (std::any_of(pending_.begin(), pending_.end(), [](const Timed& t) { return t.graph; }))
      resolve();
    pending_.insert(pending_.end(), timed.begin(), timed.end());
  }
  // A graph's events, when the graph goes (its launches finished, or a wait gave up on one still
  // running): those of its latest launch not taken yet stay pending as plain work's (their times
  // are still to be taken, and first_unfinished names the op of a launch still running; CUDA
  // events outlive the graph that records them), and the others are destroyed. Never throws.
  void forget(const std::vector<Timed>& timed) noexcept {
    for (const Timed& t : timed) {
      const auto kept = std::find_if(pending_.begin(), pending_.end(),
                                     [&](const Timed& p) { return p.graph && p.start == t.start; });
      if (kept != pending_.end()) {
        kept->graph = false;
        continue;
      }
      (void)cudaEventDestroy(t.start);
      (void)cudaEventDestroy(t.end);
    }
  }

  // What was traced since the last call, ordered by start time. Waits for the work.
  std::vector<TraceEvent> take_trace() {
    resolve();
    std::vector<TraceEvent> all = std::exchange(traces_, {});
    std::sort(all.begin(), all.end(),
              [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
    return all;
  }

  // Compute time per device since the last call. Waits for the work, then re-ties each GPU's
  // clock to the epoch (anchor_all), so that times keep microsecond precision however long the
  // backend lives.
  std::vector<ComputeTiming> take_timing() {
    resolve();
    std::vector<ComputeTiming> out = std::exchange(timing_, {});
    out.resize(devices_.size());
    anchor_all();
    return out;
  }

  // Ties every GPU's event clock to the epoch: records its epoch event once its streams are
  // idle and notes the host time at which it completed; times on the GPU are that plus the
  // events' distance from it.
  void anchor_all() {
    for (GpuState& g : devices_.gpus()) anchor(g);
  }

  // The first timed work of device d, in submission order, that has not finished on the GPU
  // (its end event not reached), with whether it has started; nullptr when all has finished.
  const Timed* first_unfinished(std::size_t d, bool& started) const noexcept {
    for (const Timed& t : pending_) {
      if (t.device != d || cudaEventQuery(t.end) != cudaErrorNotReady) continue;
      started = cudaEventQuery(t.start) != cudaErrorNotReady;
      (void)cudaGetLastError();
      return &t;
    }
    (void)cudaGetLastError();
    return nullptr;
  }

  // Destroys the events of work not taken yet. Never throws.
  void release() noexcept {
    for (const Timed& t : pending_) {
      if (t.graph) continue;  // the graph's owner destroys them
      (void)cudaEventDestroy(t.start);
      (void)cudaEventDestroy(t.end);
    }
    pending_.clear();
  }

 private:
  // An idle timing event of `g` (GpuState::timing), else a new one.
  static cudaEvent_t timing_event(GpuState& g) {
    if (!g.timing.empty()) {
      cudaEvent_t e = g.timing.back();
      g.timing.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    GPIPE_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }

  void anchor(GpuState& g) {
    DeviceGuard guard(g.id);
    cudaStream_t on_g = nullptr;
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d].gpu != &g) continue;
      GPIPE_CUDA_CHECK(cudaStreamSynchronize(devices_[d].compute));
      if (on_g == nullptr) on_g = devices_[d].compute;
    }
    if (on_g == nullptr) return;
    GPIPE_CUDA_CHECK(cudaEventRecord(g.epoch, on_g));
    GPIPE_CUDA_CHECK(cudaEventSynchronize(g.epoch));
    g.epoch_us = std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count();
  }

  // Turns the pending events into TraceEvents and ComputeTimings (waits for them), and gives the
  // events back to their GPU.
  void resolve() {
    timing_.resize(devices_.size());
    for (const Timed& t : pending_) {
      GpuState& g = *devices_[t.device].gpu;
      float start_ms = 0, end_ms = 0;
      const bool ok = cudaEventSynchronize(t.end) == cudaSuccess &&
                      cudaEventElapsedTime(&start_ms, g.epoch, t.start) == cudaSuccess &&
                      cudaEventElapsedTime(&end_ms, g.epoch, t.end) == cudaSuccess;
      const double start_us = g.epoch_us + 1e3 * start_ms, end_us = g.epoch_us + 1e3 * end_ms;
      if (ok && t.traced) traces_.push_back({t.device, t.label, start_us, end_us});
      if (ok && t.compute) {
        ComputeTiming& c = timing_[t.device];
        if (c.ops++ == 0) c.first_start_us = start_us;
        c.busy_us += end_us - start_us;
        c.last_end_us = end_us;
      }
      if (t.graph) continue;
      g.timing.push_back(t.start);
      g.timing.push_back(t.end);
    }
    pending_.clear();
    (void)cudaGetLastError();
  }

  DeviceSet& devices_;
  Clock::time_point epoch_;
  bool tracing_ = false;
  std::vector<Timed> pending_;
  std::vector<Timed>* captured_ = nullptr;
  std::vector<TraceEvent> traces_;
  std::vector<ComputeTiming> timing_;
};

}  // namespace gpipe::cuda::detail
