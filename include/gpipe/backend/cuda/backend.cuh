#pragma once
// gpipe::cuda::Backend: K virtual devices on one or more NVIDIA GPUs, with the interface of
// gpipe::host::Backend. Each virtual device has a compute stream, a copy stream, a cuBLAS handle
// and counted (optionally capped) memory; several virtual devices may share one GPU, which is how
// a machine with one GPU runs a K-stage pipeline.
//
//   gpipe::cuda::Backend backend(4, {.device_capacity = 8ull << 30});  // 4 stages, GPUs d % count
//   backend.submit(d, {"forward", stage, mb}, [&](gpipe::cuda::KernelContext<float>& k) { ... });
//   backend.synchronize();   // waits for the GPUs; rethrows the first failure, naming where
//
// Issuing. A piece of work runs on the caller's thread, with its device's GPU current, and
// enqueues kernels on the device's compute stream without waiting for them. Work, event records
// and event waits of one device run in submission order. A wait for an event that no record has
// reached yet holds back its device's later items on the host (they run as soon as the record
// is issued), so that the CUDA event wait is enqueued after its record: the runtime submits each
// device's whole program in turn (device 0's ops, then device 1's, ...), and the items then run
// in an order that respects every event, as the host backend's threads would.
//
// Failure. The first piece of work that throws (or whose event bookkeeping fails) is kept, with
// describe(label, device), in a FailureLatch (backend/failure.hpp) as the host backend's; every
// later item is skipped until synchronize(), which rethrows it. Faults inside kernels surface when
// synchronize() waits for the streams.
//
// Not thread-safe: one thread at a time calls the backend (the Trainer's thread).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/backend.cuh is CUDA code: compile it with nvcc (see gpipe/cuda.cuh)"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/concepts.hpp"
#include "gpipe/backend/cuda/device.cuh"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/layers.cuh"
#include "gpipe/backend/cuda/memory.cuh"
#include "gpipe/backend/failure.hpp"
#include "gpipe/error.hpp"
#include "gpipe/transport/cuda.cuh"

#if GPIPE_CUDA_NCCL
#include <nccl.h>
#endif

namespace gpipe::cuda {

/// CUDA GPUs visible to this process; 0 when there are none or no usable driver.
inline int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

/// Construction options of a cuda::Backend, e.g. `{.device_capacity = 8ull << 30, .tf32 = true}`.
struct BackendOptions {
  /// Bytes per virtual device; 0 = no cap (the GPU's memory is the limit).
  std::size_t device_capacity = 0;
  /// gpus[d] = CUDA device ordinal of virtual device d. Empty: d % (number of GPUs), so that K
  /// virtual devices spread over the GPUs there are, and share GPU 0 on a one-GPU machine.
  std::vector<int> gpus = {};
  /// TF32 tensor-core math in the GEMMs (cuBLAS CUBLAS_TF32_TENSOR_OP_MATH): several times the
  /// FP32 GEMM rate on Ampere and Hopper, with products rounded to a 10-bit mantissa (relative
  /// error about 1e-3 instead of 1e-6). Off by default, so that results match the host backend.
  bool tf32 = false;
  /// Hand activations and gradients between virtual devices on different GPUs with NCCL
  /// (ncclSend/ncclRecv in a group, one communicator per GPU, ncclCommInitAll) instead of peer
  /// copies. Needs a build with NCCL (GPIPE_CUDA_NCCL=1, set by the CMake target gpipe::cuda when
  /// NCCL is found); transfers between virtual devices of one GPU stay device-to-device copies.
  bool nccl = false;
  /// The number that device 0 goes by in error messages (device d is first_device + d): a backend
  /// that runs one device of a larger pipeline (mpi::CudaBackend) names it as the pipeline does.
  std::size_t first_device = 0;
};

/// A marker in a virtual device's compute stream; copyable handle (all copies are the same
/// event). Record it on one device, wait for it on others.
class Event {
 public:
  Event() : state_(std::make_shared<State>()) {}

 private:
  friend class Backend;
  struct State {
    State() = default;
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      if (event != nullptr) (void)cudaEventDestroy(event);
    }
    cudaEvent_t event = nullptr;  ///< created on the GPU of its first record
    int gpu = -1;
    bool recorded = false;  ///< a record has been issued (waits may be enqueued)
  };
  std::shared_ptr<State> state_;
};

/// K virtual devices on one or more NVIDIA GPUs, a `gpipe::backend` (backend/concepts.hpp) with the
/// interface of `gpipe::host::Backend`. Each virtual device has a compute stream, a copy stream, a
/// cuBLAS handle and counted, optionally capped, memory; several may share one GPU, which is how a
/// one-GPU machine runs a K-stage pipeline.
///
///     gpipe::cuda::Backend backend(4, {.device_capacity = 8ull << 30});  // GPUs d % count
///     backend.submit(d, {"forward", stage, mb}, [&](cuda::KernelContext<float>& k) { ... });
///     backend.synchronize();  // waits for the GPUs; rethrows the first failure, naming where
///
/// Work runs on the caller's thread, with its device's GPU current, and only enqueues kernels.
/// Work, records and waits of one device run in submission order; a wait for an event no record
/// has reached yet holds its device's later items back on the host until the record is issued.
/// The first failure is kept and every later item skipped until synchronize() rethrows it; faults
/// inside kernels surface when synchronize() waits for the streams. The device arguments of every
/// member are 0..num_devices()-1; another throws `gpipe::Error`. memory_stats, reset_peak and
/// allocate come from detail::DeviceMemory (backend/memory.hpp). Not thread-safe: one thread at a
/// time calls the backend.
class Backend : public gpipe::detail::DeviceMemory<DeviceAllocator> {
 public:
  /// Construction options: capacity, GPU mapping, TF32, NCCL.
  using Options = BackendOptions;
  /// The kernel context each piece of work gets: its device's streams and cuBLAS handle.
  using Kernels = cuda::KernelContext<float>;
  /// Orders work across devices: recorded on one device's compute stream, waited for on another's.
  using Event = cuda::Event;
  /// Owning handle of `count` elements of `T` in one device's GPU memory, as allocate() returns it;
  /// it must not outlive the backend.
  template <class T>
  using Buffer = cuda::Buffer<T>;
  /// A piece of stream work: runs on the caller's thread and enqueues kernels through its Kernels.
  using Work = std::function<void(Kernels&)>;
  /// How the runtime hands activations between stages (see gpipe/transport/hand_over.hpp).
  using hand_over = gpipe::transport::CudaHandOver;

  /// The backend's name as the runtime tests it (the Trainer treats "host" specially).
  static constexpr std::string_view name = "cuda";

  /// `num_devices` virtual devices (1 to 1024), device d on GPU `options.gpus[d]` (default d % the
  /// number of GPUs); creates a memory pool per GPU, streams and a cuBLAS handle per device, and
  /// NCCL communicators when `options.nccl` spans several GPUs. Throws `gpipe::Error` when no GPU
  /// is usable, for a count or a mapping out of range, or for `nccl` in a build without NCCL.
  explicit Backend(std::size_t num_devices, Options options = {})
      : epoch_(Clock::now()), options_(std::move(options)) {
    gpipe::detail::require(num_devices > 0, "cuda::Backend needs at least one device");
    gpipe::detail::require(
        num_devices <= 1024,
        "cuda::Backend supports at most 1024 devices, got " + std::to_string(num_devices));
    int count = 0;
    const cudaError_t found = cudaGetDeviceCount(&count);
    if (found != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      throw Error(std::string("gpipe: cuda::Backend needs a CUDA GPU, but ") +
                  (found != cudaSuccess
                       ? std::string("cudaGetDeviceCount failed with ") + cudaGetErrorName(found) +
                             " (" + cudaGetErrorString(found) + ")"
                       : std::string("cudaGetDeviceCount found none")) +
                  "; without one, use gpipe::host::Backend");
    }
    std::vector<int> mapping = options_.gpus;
    if (mapping.empty()) {
      for (std::size_t d = 0; d < num_devices; ++d) mapping.push_back(static_cast<int>(d % count));
    }
    gpipe::detail::require(mapping.size() == num_devices,
                           "BackendOptions::gpus has " + std::to_string(mapping.size()) +
                               " entries, expected one per device (" + std::to_string(num_devices) +
                               ")");
    for (std::size_t d = 0; d < num_devices; ++d) {
      gpipe::detail::require(mapping[d] >= 0 && mapping[d] < count,
                             "BackendOptions::gpus[" + std::to_string(d) +
                                 "] = " + std::to_string(mapping[d]) +
                                 " is not a GPU; this machine has " + std::to_string(count) +
                                 " (ordinals 0.." + std::to_string(count - 1) + ")");
    }
#if !GPIPE_CUDA_NCCL
    gpipe::detail::require(
        !options_.nccl,
        "BackendOptions::nccl needs a build with NCCL (GPIPE_CUDA_NCCL=1), and this "
        "one has none");
#endif
    try {
      create(mapping);
    } catch (...) {
      destroy();
      throw;
    }
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  /// Drops work not yet issued, waits for the streams and releases every resource. Buffers must
  /// not outlive the backend.
  ~Backend() { destroy(); }

  /// K, the virtual devices given at construction.
  std::size_t num_devices() const { return devices_.size(); }
  /// The options as given at construction (an empty `gpus` stays empty: it means d % count).
  const Options& options() const { return options_; }
  /// The host time that traces and timings count microseconds from: the backend's construction.
  std::chrono::steady_clock::time_point epoch() const { return epoch_; }
  /// The CUDA device ordinal of a virtual device.
  int gpu(std::size_t device) const { return state(device).gpu->id; }

  /// Stream operations of a virtual device, in submission order (see the top of this file).
  void submit(std::size_t device, WorkLabel label, Work work) {
    enqueue(device, {Item::Kind::work, label, std::move(work), nullptr});
  }
  /// Enqueues on `device`'s compute stream the recording of `event`, after everything submitted to
  /// the device before it; a later record of the same event replaces the mark.
  void record(std::size_t device, const Event& event) {
    enqueue(
        device,
        {Item::Kind::record, {.what = "record event", .internal = true}, nullptr, event.state_});
  }
  /// Makes the work submitted to `device` after this wait for `event`'s record on the GPU. A wait
  /// whose record has not been issued yet holds the device's later items back on the host until it
  /// is; one that no record ever reaches makes synchronize() fail.
  void wait(std::size_t device, const Event& event) {
    enqueue(device,
            {Item::Kind::wait, {.what = "wait event", .internal = true}, nullptr, event.state_});
  }

  /// Tracing of every piece of work (not event records and waits): a pair of timing events around
  /// it on its compute stream.
  void set_tracing(bool on) { tracing_ = on; }
  /// What ran since the last call, all devices, ordered by start time; microseconds since the
  /// backend's epoch (as the host backend's). Waits for the work.
  std::vector<TraceEvent> take_trace() {
    resolve_timed();
    std::vector<TraceEvent> all = std::exchange(traces_, {});
    std::sort(all.begin(), all.end(),
              [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
    return all;
  }

  /// Compute time per device since the last call (see ComputeTiming): compute work (label.compute)
  /// is always timed by a pair of events on its stream. Waits for the work, then re-ties each
  /// GPU's clock to the backend's epoch, so that times keep microsecond precision however long
  /// the backend lives (the Trainer calls this around every step).
  std::vector<ComputeTiming> take_timing() {
    resolve_timed();
    std::vector<ComputeTiming> out = std::exchange(timing_, {});
    out.resize(devices_.size());
    timing_.resize(devices_.size());
    for (detail::GpuState& g : gpus_) anchor(g);
    return out;
  }

  /// Skips all work not yet issued and waits for the streams; the next synchronize() returns
  /// normally. For a caller that cannot finish issuing a step.
  void cancel() {
    failure_.fail(nullptr, {});
    pump();
    for (auto& q : queues_) q.clear();
    wait_for_streams();
    failure_.take();
  }

  /// Blocks until all submitted work has finished on the GPUs; then, if any of it failed, throws
  /// the first failure (OutOfMemory stays OutOfMemory) with where it happened in front of its
  /// message.
  void synchronize() {
    pump();
    for (std::size_t d = 0; d < queues_.size(); ++d) {
      if (queues_[d].empty()) continue;
      // Only waits for events that no record will reach are left: on the host this would hang.
      failure_.fail(std::make_exception_ptr(
                        Error("gpipe: it waits for an event that is never recorded; the device's "
                              "work after the wait was dropped")),
                    describe(queues_[d].front().label, options_.first_device + d));
      queues_[d].clear();
    }
    // A CUDA error of the streams is kept unless the work failed first.
    if (const std::string error = wait_for_streams(); !error.empty())
      failure_.fail(std::make_exception_ptr(Error(error)), "synchronize");
    failure_.take().rethrow();
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Item {
    enum class Kind : std::uint8_t { work, record, wait };
    Kind kind;
    WorkLabel label;
    Work work;
    std::shared_ptr<Event::State> event;
  };
  /// Work timed by a pair of events, for the trace, the compute timing or both.
  struct Timed {
    std::size_t device;
    WorkLabel label;
    cudaEvent_t start, end;
    bool traced, compute;
  };

  // Construction --------------------------------------------------------------------------------

  void create(const std::vector<int>& mapping) {
    // GPUs in order of first use; gpus_ never reallocates after this, DeviceState points into it.
    std::vector<int> ids;
    for (int g : mapping)
      if (std::find(ids.begin(), ids.end(), g) == ids.end()) ids.push_back(g);
    gpus_.resize(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      detail::GpuState& g = gpus_[i];
      g.id = ids[i];
      g.rank = static_cast<int>(i);
      detail::DeviceGuard guard(g.id);
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = g.id;
      GPIPE_CUDA_CHECK(cudaMemPoolCreate(&g.pool, &props));
      // Keep freed memory cached in the pool, however much (until the backend goes).
      std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
      GPIPE_CUDA_CHECK(cudaMemPoolSetAttribute(g.pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
      GPIPE_CUDA_CHECK(cudaEventCreate(&g.epoch));
    }
    // Pool memory is visible to other GPUs only where granted (cudaDeviceEnablePeerAccess does
    // not apply to pools): let every peer-capable GPU of the backend read and write it.
    for (detail::GpuState& owner : gpus_) {
      for (detail::GpuState& peer : gpus_) {
        if (peer.id == owner.id) continue;
        int can = 0;
        GPIPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, peer.id, owner.id));
        if (!can) continue;
        cudaMemAccessDesc access{};
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = peer.id;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        GPIPE_CUDA_CHECK(cudaMemPoolSetAccess(owner.pool, &access, 1));
      }
    }
    const bool multi_gpu = gpus_.size() > 1;
    const bool nccl = options_.nccl && multi_gpu;
#if GPIPE_CUDA_NCCL
    if (nccl) {
      std::vector<ncclComm_t> comms(gpus_.size());
      GPIPE_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(ids.size()), ids.data()));
      for (std::size_t i = 0; i < gpus_.size(); ++i) {
        gpus_[i].comm = comms[i];
        detail::DeviceGuard guard(gpus_[i].id);
        GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&gpus_[i].send, cudaStreamNonBlocking));
        GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&gpus_[i].send_done, cudaEventDisableTiming));
      }
    }
#endif
    for (std::size_t d = 0; d < mapping.size(); ++d) {
      auto state = std::make_unique<detail::DeviceState>();
      detail::DeviceState& s = *state;
      devices_.push_back(std::move(state));
      s.index = d;
      s.gpu = &gpus_[static_cast<std::size_t>(std::find(ids.begin(), ids.end(), mapping[d]) -
                                              ids.begin())];
      s.multi_gpu = multi_gpu;
      s.nccl = nccl;
      s.gpus = &gpus_;
      detail::DeviceGuard guard(s.gpu->id);
      GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
      GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.copy, cudaStreamNonBlocking));
      GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
      GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
      GPIPE_CUBLAS_CHECK(cublasCreate(&s.blas));
      GPIPE_CUBLAS_CHECK(cublasSetStream(s.blas, s.compute));
      GPIPE_CUBLAS_CHECK(cublasSetMathMode(
          s.blas, options_.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      order_.add_device(s.compute);
      add_device(d, s.gpu->id, s.gpu->pool, options_.device_capacity, order_,
                 options_.first_device + d);
      kernels_.push_back(Kernels(s));
    }
    queues_.resize(devices_.size());
    timing_.resize(devices_.size());
    for (detail::GpuState& g : gpus_) anchor(g);
  }

  /// Releases whatever create() made (also after a partial create()). Never throws.
  void destroy() noexcept {
    failure_.fail(nullptr, {});
    for (auto& q : queues_) q.clear();  // drops work not yet run, and the buffers it holds
    (void)wait_for_streams();
    for (const Timed& t : pending_) {
      (void)cudaEventDestroy(t.start);
      (void)cudaEventDestroy(t.end);
    }
    pending_.clear();
    int caller_gpu = 0;
    const bool restore = cudaGetDevice(&caller_gpu) == cudaSuccess;
    for (auto& state : devices_) {
      detail::DeviceState& s = *state;
      if (s.gpu != nullptr) (void)cudaSetDevice(s.gpu->id);  // cuBLAS wants its handle's device
      bool freed = false;
      for (float* block : {s.scratch, s.wide, s.cast})
        if (block != nullptr && cudaFreeAsync(block, s.compute) == cudaSuccess) freed = true;
      if (freed) (void)cudaStreamSynchronize(s.compute);
      s.staging.release_all();
      if (s.blas != nullptr) (void)cublasDestroy(s.blas);
      if (s.ready != nullptr) (void)cudaEventDestroy(s.ready);
      if (s.done != nullptr) (void)cudaEventDestroy(s.done);
      if (s.compute != nullptr) (void)cudaStreamDestroy(s.compute);
      if (s.copy != nullptr) (void)cudaStreamDestroy(s.copy);
    }
    kernels_.clear();
    devices_.clear();
    for (detail::GpuState& g : gpus_) {
#if GPIPE_CUDA_NCCL
      if (g.comm != nullptr) (void)ncclCommDestroy(static_cast<ncclComm_t>(g.comm));
#endif
      if (g.send_done != nullptr) (void)cudaEventDestroy(g.send_done);
      if (g.send != nullptr) (void)cudaStreamDestroy(g.send);
      for (cudaEvent_t e : g.timing) (void)cudaEventDestroy(e);
      if (g.epoch != nullptr) (void)cudaEventDestroy(g.epoch);
      // Allocations still outstanding keep the pool's memory until they are freed.
      if (g.pool != nullptr) (void)cudaMemPoolDestroy(g.pool);
    }
    gpus_.clear();
    if (restore) (void)cudaSetDevice(caller_gpu);
    (void)cudaGetLastError();
  }

  // Issuing -------------------------------------------------------------------------------------

  void enqueue(std::size_t device, Item item) {
    check_device(device);
    queues_[device].push_back(std::move(item));
    pump();
  }

  /// Runs every item that can run: each device's queue in order, up to a wait whose event has no
  /// record yet. After a failure, items are dropped instead. Work that submits more work from
  /// inside (re-entrant) only queues it; the outer loop runs it.
  void pump() {
    if (pumping_) return;
    pumping_ = true;
    int caller_gpu = 0;
    const bool restore = cudaGetDevice(&caller_gpu) == cudaSuccess;
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t d = 0; d < queues_.size(); ++d) {
        std::deque<Item>& q = queues_[d];
        while (!q.empty()) {
          const bool skip = failure_.failed();
          if (!skip && q.front().kind == Item::Kind::wait && !q.front().event->recorded) break;
          Item item = std::move(q.front());
          q.pop_front();
          if (!skip) run(d, item);
          progress = true;
        }
      }
    }
    if (restore) (void)cudaSetDevice(caller_gpu);
    pumping_ = false;
  }

  void run(std::size_t d, Item& item) {
    detail::DeviceState& s = *devices_[d];
    try {
      GPIPE_CUDA_CHECK(cudaSetDevice(s.gpu->id));
      switch (item.kind) {
        case Item::Kind::work:
          run_work(d, item);
          break;
        case Item::Kind::record: {
          Event::State& e = *item.event;
          if (e.event != nullptr && e.gpu != s.gpu->id) {
            GPIPE_CUDA_CHECK(cudaEventDestroy(e.event));
            e.event = nullptr;
          }
          if (e.event == nullptr) {
            GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming));
            e.gpu = s.gpu->id;
          }
          GPIPE_CUDA_CHECK(cudaEventRecord(e.event, s.compute));
          e.recorded = true;
          break;
        }
        case Item::Kind::wait:
          GPIPE_CUDA_CHECK(cudaStreamWaitEvent(s.compute, item.event->event, 0));
          break;
      }
    } catch (...) {
      failure_.fail(std::current_exception(), describe(item.label, options_.first_device + d));
    }
  }

  void run_work(std::size_t d, Item& item) {
    detail::DeviceState& s = *devices_[d];
    const bool traced = tracing_ && !item.label.internal;
    const bool timed = traced || item.label.compute;
    cudaEvent_t start = nullptr, end = nullptr;
    if (timed) {
      start = timing_event(*s.gpu);
      end = timing_event(*s.gpu);
      pending_.push_back({d, item.label, start, end, traced, item.label.compute});
      GPIPE_CUDA_CHECK(cudaEventRecord(start, s.compute));
    }
    // Allocations and frees inside the work are ordered on this device's compute stream.
    order_.set_current(d);
    try {
      item.work(kernels_[d]);
    } catch (...) {
      item.work = nullptr;
      order_.set_current(detail::StreamOrder::none);
      if (timed) (void)cudaEventRecord(end, s.compute);
      throw;
    }
    item.work = nullptr;  // buffers the work captured are freed in this stream's order too
    order_.set_current(detail::StreamOrder::none);
    if (timed) GPIPE_CUDA_CHECK(cudaEventRecord(end, s.compute));
  }

  /// Waits for every stream; returns the first CUDA error as a message ("" when none).
  std::string wait_for_streams() noexcept {
    std::string first;
    auto sync = [&first](cudaStream_t stream, std::size_t device) {
      if (stream == nullptr) return;
      const cudaError_t error = cudaStreamSynchronize(stream);
      if (error != cudaSuccess && first.empty())
        first = "device " + std::to_string(device) + ": CUDA error " + cudaGetErrorName(error) +
                " (" + cudaGetErrorString(error) + ") while waiting for its streams";
    };
    for (auto& s : devices_) {
      sync(s->compute, s->index);
      sync(s->copy, s->index);
    }
    for (detail::GpuState& g : gpus_) sync(g.send, 0);
    (void)cudaGetLastError();
    return first;
  }

  // Tracing -------------------------------------------------------------------------------------

  cudaEvent_t timing_event(detail::GpuState& g) {
    if (!g.timing.empty()) {
      cudaEvent_t e = g.timing.back();
      g.timing.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    GPIPE_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }

  /// Records g's epoch event once its streams are idle and notes the host time at which it
  /// completed: trace times on g are that plus the events' distance from it.
  void anchor(detail::GpuState& g) {
    detail::DeviceGuard guard(g.id);
    for (auto& s : devices_)
      if (s->gpu == &g) GPIPE_CUDA_CHECK(cudaStreamSynchronize(s->compute));
    for (auto& s : devices_) {
      if (s->gpu != &g) continue;
      GPIPE_CUDA_CHECK(cudaEventRecord(g.epoch, s->compute));
      GPIPE_CUDA_CHECK(cudaEventSynchronize(g.epoch));
      g.epoch_us = std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count();
      break;
    }
  }

  /// Turns the pending timing events into TraceEvents and ComputeTimings (waits for them).
  void resolve_timed() {
    timing_.resize(devices_.size());
    for (const Timed& t : pending_) {
      detail::GpuState& g = *devices_[t.device]->gpu;
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
      g.timing.push_back(t.start);
      g.timing.push_back(t.end);
    }
    pending_.clear();
    (void)cudaGetLastError();
  }

  // Helpers -------------------------------------------------------------------------------------

  const detail::DeviceState& state(std::size_t device) const {
    check_device(device);
    return *devices_[device];
  }

  Clock::time_point epoch_;
  Options options_;
  std::vector<detail::GpuState> gpus_;
  std::vector<std::unique_ptr<detail::DeviceState>> devices_;
  /// The allocators (the base) outlive it, but free nothing once destroy() has dropped the queued
  /// work; buffers must not outlive the backend.
  detail::StreamOrder order_;
  std::vector<Kernels> kernels_;
  std::vector<std::deque<Item>> queues_;
  gpipe::detail::FailureLatch failure_;
  bool pumping_ = false;
  bool tracing_ = false;
  std::vector<Timed> pending_;
  std::vector<TraceEvent> traces_;
  std::vector<ComputeTiming> timing_;
};

}  // namespace gpipe::cuda

static_assert(gpipe::backend<gpipe::cuda::Backend>);
