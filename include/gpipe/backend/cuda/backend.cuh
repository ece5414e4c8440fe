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
// is issued), so that the CUDA event wait is enqueued after its record: a CUDA stream that waits
// for an event not yet recorded does not wait at all. The runtime issues every device's ops in one
// issue order in which each recv comes after its send (issue_order, schedule/simulator.hpp), so
// its waits find their records issued; a caller that submits in another order still gets the
// items run in an order that respects every event, as the host backend's threads would
// (cuda/work_queue.cuh). The devices' CUDA resources are in cuda/device_set.cuh, the timing of
// their work in cuda/timing.cuh.
//
// Failure. The first piece of work that throws (or whose event bookkeeping fails) is kept, with
// describe(label, device), in a FailureLatch (backend/failure.hpp) as the host backend's; every
// later item is skipped until synchronize(), which rethrows it. Faults inside kernels surface when
// synchronize() waits for the streams.
//
// Deadline. Every wait for the GPUs (synchronize, take_trace, take_timing, cancel, a staging
// block, a graph's release, the destructor) polls through one helper (finished_in_time, and
// detail::poll_until under it) for at most BackendOptions::wait_timeout. Past it the backend
// gives up on the work still running, which a kernel's nature lets run on: synchronize(),
// take_trace() and take_timing() throw an Error that names the first unfinished op of each busy
// device (from the timing events around each op, cuda/timing.cuh), cancel() returns, and the
// destructor leaks what that work may use (without waiting again when the latest wait gave up
// on it). synchronize(deadline) and cancel(deadline) end their wait at a caller's deadline
// instead, for a caller that waited for the same work before (mpi::CudaBackend). The waits that
// remain unbounded are of work already finished (the timing events, once the streams are idle), and
// cudaFreeHost, which a real driver may make wait for the GPU's work: the backend frees its staging
// blocks only once its streams were idle in time, and leaks them otherwise; the pinned arrays that
// a Trainer owns (PinnedArray: CUDA Graphs' inputs and outputs, offload blocks) go with the Trainer
// (README, "Walk-through", the Errors paragraph).
//
// Not thread-safe: one thread at a time calls the backend (the Trainer's thread).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/backend.cuh is CUDA code: compile it with nvcc (see gpipe/cuda.cuh)"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/concepts.hpp"
#include "gpipe/backend/cuda/device.cuh"
#include "gpipe/backend/cuda/device_set.cuh"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/layers.cuh"
#include "gpipe/backend/cuda/memory.cuh"
#include "gpipe/backend/cuda/step_graph.cuh"
#include "gpipe/backend/cuda/timing.cuh"
#include "gpipe/backend/cuda/work_queue.cuh"
#include "gpipe/backend/failure.hpp"
#include "gpipe/error.hpp"
#include "gpipe/transport/cuda.cuh"

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
  /// Capture a training step's work into a CUDA graph and launch the graph for later steps of
  /// the same shape (README, "CUDA Graphs"): the host then issues one launch per step instead of
  /// every op's kernels. Not with `nccl` (its steps are issued op by op). false: every step is
  /// issued op by op.
  bool graphs = true;
  /// How long any wait for the GPUs lasts (synchronize, take_trace, take_timing, cancel, a wait
  /// for a pinned staging block; as host::BackendOptions::wait_timeout bounds a device's wait
  /// for another's): past it, the call fails with an Error naming each device whose work has not
  /// finished and the first op (stage, micro-batch) of it that has not, instead of hanging on a
  /// stuck kernel or a hand-over that never comes (cancel() returns instead). That work is not
  /// cancelled (a CUDA kernel cannot be): it runs on, before any work submitted later to its
  /// device. Longer than the longest step's GPU time; positive.
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(10)};
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

  /// The backend's name, "cuda", as the `gpipe::backend` concept requires one; nothing in the
  /// library branches on it.
  static constexpr std::string_view name = "cuda";

  /// `num_devices` virtual devices (1 to 1024), device d on GPU `options.gpus[d]` (default d % the
  /// number of GPUs); creates a memory pool per GPU, streams and a cuBLAS handle per device, and
  /// NCCL communicators when `options.nccl` spans several GPUs. Throws `gpipe::Error` when no GPU
  /// is usable, for a count or a mapping out of range, or for `nccl` in a build without NCCL.
  explicit Backend(std::size_t num_devices, Options options = {})
      : options_(std::move(options)), timer_(devices_, Clock::now()), queues_(num_devices) {
    gpipe::detail::require(options_.wait_timeout.count() > 0, [&] {
      return "cuda::Backend: wait_timeout must be positive, got " +
             std::to_string(options_.wait_timeout.count()) + " ms";
    });
    const std::vector<int> mapping = detail::gpu_mapping(num_devices, options_.gpus);
#if !GPIPE_CUDA_NCCL
    gpipe::detail::require(!options_.nccl,
                           "BackendOptions::nccl needs a build with NCCL (GPIPE_CUDA_NCCL=1), and "
                           "this one has none");
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
  /// not outlive the backend. Work that is still running after Options::wait_timeout (a kernel
  /// that never ends; at once, when the latest wait for the GPUs gave up on it already) is left
  /// running: the destructor then returns without releasing the CUDA
  /// resources (streams, memory pools, pinned staging), which that work may still use; they stay
  /// until the process ends, which is what such a process should do next.
  ~Backend() { destroy(); }

  /// K, the virtual devices given at construction.
  std::size_t num_devices() const { return devices_.size(); }
  /// The options as given at construction (an empty `gpus` stays empty: it means d % count).
  const Options& options() const { return options_; }
  /// The host time that traces and timings count microseconds from: the backend's construction.
  std::chrono::steady_clock::time_point epoch() const { return timer_.epoch(); }
  /// The CUDA device ordinal of a virtual device.
  int gpu(std::size_t device) const {
    check_device(device);
    return devices_[device].gpu->id;
  }

  /// Stream operations of a virtual device, in submission order (see the top of this file).
  void submit(std::size_t device, WorkLabel label, Work work) {
    enqueue(device, {Item::Kind::work, label, std::move(work), nullptr});
  }
  /// Work on `device`'s copy stream: it runs on the caller's thread in the device's submission
  /// order, and what it enqueues on `Kernels::copy_stream()` (copies between host and device
  /// memory) runs after everything submitted to the device before it and beside everything
  /// submitted after it, which does not wait for it; allocations and frees inside it are ordered
  /// on the copy stream. `done`, where given, is recorded on the copy stream after it, for wait().
  /// Traced (not compute time) like other work; `label.background` draws it beside the device's
  /// ops. Remat::offload's copies run so (cuda/offload.cuh).
  void submit_copy(std::size_t device, WorkLabel label, Work work, const Event* done = nullptr) {
    enqueue(device, {Item::Kind::copy_work, label, std::move(work),
                     done != nullptr ? done->state_ : nullptr});
  }
  /// Pinned host memory held for `device`'s activations (Remat::offload: cuda/offload.cuh), in
  /// bytes: now, and the most since the last reset_peak(); no capacity.
  MemoryStats host_memory_stats(std::size_t device) const {
    check_device(device);
    return allocator(device).host_stats();
  }
  /// Counts `bytes` more (negative: fewer) of pinned host memory as held for `device` in
  /// host_memory_stats: Remat::offload counts its blocks so (cuda/offload.cuh).
  void count_host_memory(std::size_t device, std::ptrdiff_t bytes) {
    check_device(device);
    if (bytes >= 0)
      allocator(device).reserve_host(static_cast<std::size_t>(bytes));
    else
      allocator(device).release_host(static_cast<std::size_t>(-bytes));
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
  /// is; one that no record ever reaches makes synchronize() fail. The awaited work's name (as
  /// host::Backend::wait takes it) is not used: synchronize() names the op that waits, once
  /// Options::wait_timeout has passed.
  void wait(std::size_t device, const Event& event, WorkLabel /*awaited*/ = {},
            std::size_t /*awaited_device*/ = 0) {
    enqueue(device,
            {Item::Kind::wait, {.what = "wait event", .internal = true}, nullptr, event.state_});
  }

  /// Tracing of every piece of work (not event records and waits): a pair of timing events around
  /// it on its compute stream.
  void set_tracing(bool on) { timer_.set_tracing(on); }
  /// Whether tracing is on (set_tracing).
  bool tracing() const { return timer_.tracing(); }
  /// What ran since the last call, all devices, ordered by start time; microseconds since the
  /// backend's epoch (as the host backend's). Waits for the work, at most Options::wait_timeout:
  /// past it, throws gpipe::Error naming each busy device's first unfinished op (as synchronize()),
  /// and the work's events stay for a later call, once it has finished.
  std::vector<TraceEvent> take_trace() {
    require_finished("take_trace");
    return timer_.take_trace();
  }
  /// Compute time per device since the last call (see ComputeTiming): compute work (label.compute)
  /// is always timed by a pair of events on its stream. Waits for the work, then re-ties each
  /// GPU's clock to the backend's epoch, so that times keep microsecond precision however long
  /// the backend lives (the Trainer calls this around every step). Waits at most
  /// Options::wait_timeout, as take_trace().
  std::vector<ComputeTiming> take_timing() {
    require_finished("take_timing");
    return timer_.take_timing();
  }

  /// Skips all work not yet issued and waits for the streams; the next synchronize() returns
  /// normally. For a caller that cannot finish issuing a step. Waits at most
  /// Options::wait_timeout: work still running then is left running, as synchronize() leaves it,
  /// and cancel() returns all the same (it does not throw: a caller cancels on its way out with
  /// another failure, which an Error of its own would hide); the next synchronize(), take_trace()
  /// or take_timing() waits for that work again, and fails naming it if it has not finished.
  void cancel() { cancel(Clock::now() + options_.wait_timeout); }
  /// As cancel(), its wait for the GPUs ending at `deadline` (see synchronize(deadline)).
  void cancel(std::chrono::steady_clock::time_point deadline) {
    if (capture_ != nullptr) {
      std::string ignored;
      (void)end_capture(ignored);
    }
    failure_.fail(nullptr, {});
    pump();
    queues_.clear();
    if (finished_in_time(deadline)) (void)devices_.wait_for_streams();
    failure_.take();
  }

  /// Whether steps may be captured into CUDA graphs: BackendOptions::graphs, without NCCL.
  bool graphs() const { return options_.graphs && !options_.nccl; }

  /// Graph launches since construction (launch()): how many steps were replayed.
  std::size_t graph_launches() const { return graph_launches_; }
  /// Why the latest capture gave no graph (end_capture's `why`); empty when it gave one, or
  /// before any capture.
  const std::string& graph_refusal() const { return graph_refusal_; }

  /// Starts capturing the work submitted from now on, on every virtual device, into a CUDA graph
  /// (cuda/step_graph.cuh): it is recorded, not run, until end_capture(). Meanwhile nothing may
  /// wait for the GPU (synchronize, take_trace, take_timing). Returns false, and captures nothing,
  /// while earlier work's failure waits for synchronize() (a capture would drop it). Needs graphs()
  /// and no capture under way (else gpipe::Error).
  bool begin_capture() {
    gpipe::detail::require(
        graphs() && capture_ == nullptr,
        "cuda::Backend::begin_capture: graphs are off, or a capture is under way");
    pump();
    if (failure_.failed()) return false;
    detail::DeviceGuard guard(devices_[0].gpu->id);
    make_capture_resources();
    capture_ = std::unique_ptr<StepGraph>(new StepGraph(*this, num_devices()));
    GPIPE_CUDA_CHECK(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeRelaxed));
    // every stream of every virtual device joins the capture
    GPIPE_CUDA_CHECK(cudaEventRecord(fork_, origin_));
    for (std::size_t d = 0; d < num_devices(); ++d) {
      GPIPE_CUDA_CHECK(cudaStreamWaitEvent(devices_[d].compute, fork_, 0));
      GPIPE_CUDA_CHECK(cudaStreamWaitEvent(devices_[d].copy, fork_, 0));
      devices_[d].capturing = true;
      allocator(d).set_log(&capture_->memory_[d]);
    }
    timer_.set_capture(&capture_->timed_);
    return true;
  }

  /// Ends the capture that begin_capture() started: the graph of the work submitted since, or
  /// null, with the reason in `why`, when that work could not be captured (a copy from host memory
  /// that is not pinned, scratch that had to grow, memory allocated and not freed within it, a CUDA
  /// call that capture does not allow) or failed. Then the work is dropped and its failure
  /// cleared: the caller issues it again, op by op, which fails in the same way where it failed.
  std::unique_ptr<StepGraph> end_capture(std::string& why) {
    pump();
    const bool held = !queues_.empty();
    detail::DeviceGuard guard(devices_[0].gpu->id);
    cudaError_t joined = cudaSuccess;
    for (std::size_t d = 0; d < num_devices(); ++d) {
      for (int i = 0; i < 2; ++i) {
        const cudaStream_t stream = i == 0 ? devices_[d].compute : devices_[d].copy;
        if (joined == cudaSuccess) joined = cudaEventRecord(joins_[2 * d + i], stream);
        if (joined == cudaSuccess) joined = cudaStreamWaitEvent(origin_, joins_[2 * d + i], 0);
      }
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(origin_, &graph);
    for (std::size_t d = 0; d < num_devices(); ++d) {
      devices_[d].capturing = false;
      allocator(d).set_log(nullptr);
    }
    timer_.set_capture(nullptr);
    std::unique_ptr<StepGraph> made = std::move(capture_);
    const gpipe::detail::FailureLatch::Failure failure = failure_.take();
    queues_.clear();
    (void)cudaGetLastError();
    why.clear();
    if (failure.error) {
      why = failure.where;
      try {
        std::rethrow_exception(failure.error);
      } catch (const std::exception& e) {
        why += std::string(why.empty() ? "" : ": ") + e.what();
      } catch (...) {
        why += " (an exception)";
      }
    } else if (held) {
      why = "work waits for an event that the step never records";
    } else if (joined != cudaSuccess || ended != cudaSuccess) {
      why = std::string("CUDA stream capture failed: ") +
            cudaGetErrorName(joined != cudaSuccess ? joined : ended);
    } else {
      for (std::size_t d = 0; d < num_devices() && why.empty(); ++d) {
        std::ptrdiff_t net = 0;
        for (const detail::MemoryChange& c : made->memory_[d]) net += c.bytes;
        if (net != 0)
          why = "device " + std::to_string(options_.first_device + d) + " keeps " +
                std::to_string(net) + " bytes allocated in the step after it";
      }
    }
    if (why.empty()) {
      const cudaError_t instantiated = cudaGraphInstantiate(&made->exec_, graph, 0);
      if (instantiated != cudaSuccess) {
        made->exec_ = nullptr;
        why = std::string("cudaGraphInstantiate failed: ") + cudaGetErrorName(instantiated);
      }
    }
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (!why.empty()) made.reset();
    graph_refusal_ = why;
    return made;
  }

  /// Runs `graph` once, after all work submitted before and before all work submitted after, and
  /// counts its allocations and frees in memory_stats as its capture did. Throws OutOfMemory (and
  /// launches nothing) when they no longer fit a device's capacity.
  void launch(StepGraph& graph) {
    pump();
    for (std::size_t d = 0; d < num_devices(); ++d) {
      try {
        allocator(d).count(graph.memory_[d]);
      } catch (...) {
        while (d-- > 0) allocator(d).uncount(graph.memory_[d]);
        throw;
      }
    }
    detail::DeviceGuard guard(devices_[0].gpu->id);
    for (std::size_t d = 0; d < num_devices(); ++d) {
      GPIPE_CUDA_CHECK(cudaEventRecord(joins_[2 * d], devices_[d].compute));
      GPIPE_CUDA_CHECK(cudaEventRecord(joins_[2 * d + 1], devices_[d].copy));
      GPIPE_CUDA_CHECK(cudaStreamWaitEvent(origin_, joins_[2 * d], 0));
      GPIPE_CUDA_CHECK(cudaStreamWaitEvent(origin_, joins_[2 * d + 1], 0));
    }
    timer_.launched(graph.timed_);
    GPIPE_CUDA_CHECK(cudaGraphLaunch(graph.exec_, origin_));
    ++graph_launches_;
    GPIPE_CUDA_CHECK(cudaEventRecord(fork_, origin_));
    for (std::size_t d = 0; d < num_devices(); ++d) {
      GPIPE_CUDA_CHECK(cudaStreamWaitEvent(devices_[d].compute, fork_, 0));
      GPIPE_CUDA_CHECK(cudaStreamWaitEvent(devices_[d].copy, fork_, 0));
    }
  }

  /// Blocks until all submitted work has finished on the GPUs; then, if any of it failed, throws
  /// the first failure (OutOfMemory stays OutOfMemory) with where it happened in front of its
  /// message. Work still running after Options::wait_timeout throws gpipe::Error naming each busy
  /// device and its first unfinished op (unless other work failed first: that failure is thrown).
  /// That work then runs on, and completes before later work on its device; a download into host
  /// memory that it still had to do is skipped (its destination may be gone), and until it has
  /// finished every later wait for it (take_trace, take_timing, synchronize) fails in the same
  /// way after Options::wait_timeout, and cancel() returns after it.
  void synchronize() { synchronize(Clock::now() + options_.wait_timeout); }
  /// As synchronize(), its wait for the GPUs ending at `deadline` instead: for a caller that has
  /// waited for the same work already, so that the two waits make one (mpi::CudaBackend waits
  /// for its streams and its peers together, then here at most a poll). The Error still names
  /// Options::wait_timeout, which the caller's wait and this one together last.
  void synchronize(std::chrono::steady_clock::time_point deadline) {
    pump();
    queues_.drop_held(failure_, options_.first_device);
    if (!finished_in_time(deadline)) {
      failure_.fail(std::make_exception_ptr(Error(unfinished_work())), "synchronize");
      failure_.take().rethrow();
    }
    // A CUDA error of the streams is kept unless the work failed first.
    if (const std::string error = devices_.wait_for_streams(); !error.empty())
      failure_.fail(std::make_exception_ptr(Error(error)), "synchronize");
    failure_.take().rethrow();
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Item = detail::WorkQueues::Item;
  friend class StepGraph;

  // The stream that captures and launches graphs, on device 0's GPU (current), and the events
  // that join every device's streams to it, each of its device's GPU; made at the first capture.
  void make_capture_resources() {
    if (origin_ != nullptr) return;
    GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&origin_, cudaStreamNonBlocking));
    GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    joins_.resize(2 * num_devices(), nullptr);
    for (std::size_t i = 0; i < joins_.size(); ++i) {
      // recorded on device i / 2's streams: an event of its GPU
      detail::DeviceGuard on(devices_[i / 2].gpu->id);
      GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming));
    }
  }

  // The one wait for the GPUs' work: polls every stream until all are idle, at most
  // Options::wait_timeout. Past it the backend gives up on the work still running (stuck_), which
  // runs on: the downloads into host memory issued so far skip their copy, since the caller, told
  // of an error, may free their destination. Whether the work finished in time.
  bool finished_in_time() { return finished_in_time(Clock::now() + options_.wait_timeout); }
  // As finished_in_time(), until `deadline`.
  bool finished_in_time(Clock::time_point deadline) {
    stuck_ = !devices_.idle_by(deadline);
    if (stuck_) {
      for (std::size_t d = 0; d < num_devices(); ++d) {
        detail::DeviceState& s = devices_[d];
        s.downloads_abandoned->store(true, std::memory_order_release);
        s.downloads_abandoned = std::make_shared<std::atomic<bool>>();
      }
    }
    return !stuck_;
  }
  // finished_in_time(), or throws the Error that names the unfinished work, `caller` in front.
  void require_finished(const char* caller) {
    if (!finished_in_time())
      gpipe::detail::rethrow_from(std::make_exception_ptr(Error(unfinished_work())), caller);
  }

  // What a wait for the GPUs says of work that has not finished in time: each busy device and the
  // first op of it that has not finished.
  std::string unfinished_work() const {
    std::string out = "the GPUs have not finished their work within " +
                      std::to_string(options_.wait_timeout.count()) +
                      " ms (cuda::BackendOptions::wait_timeout):";
    const char* separator = " ";
    for (std::size_t d = 0; d < num_devices(); ++d) {
      if (devices_.device_idle(d)) continue;
      const std::size_t named = options_.first_device + d;
      bool started = false;
      const detail::WorkTimer::Timed* t = timer_.first_unfinished(d, started);
      out += separator;
      separator = "; ";
      if (t == nullptr) {
        out += "device " + std::to_string(named) + " is in work after its last timed op";
      } else if (started) {
        out += describe(t->label, named) + " has started and not finished";
      } else {
        out += describe(t->label, named) + " has not started (its device waits before it)";
      }
    }
    return out +
           ". Is a kernel stuck, or a device waiting for a hand-over that never comes? That "
           "work is not cancelled: it runs on, before later work on its device";
  }

  // A StepGraph goes: once its launches are done, its graph and events. Never throws.
  void release(StepGraph& graph) noexcept {
    // Waits for the graph's launches, at most Options::wait_timeout, and not at all once a wait
    // gave up on the work (stuck_): CUDA frees an executable graph and events still in use once
    // the work that uses them ends.
    if (origin_ != nullptr)
      (void)detail::poll_until(Clock::now() + (stuck_ ? Clock::duration{} : options_.wait_timeout),
                               [this] { return cudaStreamQuery(origin_) != cudaErrorNotReady; });
    timer_.forget(graph.timed_);
    if (graph.exec_ != nullptr) (void)cudaGraphExecDestroy(graph.exec_);
    graph.exec_ = nullptr;
    (void)cudaGetLastError();
  }

  /// The devices' resources, then what the backend keeps per device over them: its allocator
  /// (ordered on the stream that order_ names), its kernel context; then the clocks of the GPUs.
  void create(const std::vector<int>& mapping) {
    devices_.create(mapping, options_.tf32, options_.nccl, options_.wait_timeout);
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      detail::DeviceState& s = devices_[d];
      order_.add_device(s.compute);
      add_device(d, s.gpu->id, s.gpu->pool, options_.device_capacity, order_,
                 options_.first_device + d);
      kernels_.push_back(Kernels(s));
    }
    timer_.anchor_all();
  }

  /// Releases whatever create() made (also after a partial create()). Never throws.
  void destroy() noexcept {
    if (capture_ != nullptr) {
      std::string ignored;
      try {
        (void)end_capture(ignored);
      } catch (...) {
      }
    }
    failure_.fail(nullptr, {});
    queues_.clear();  // drops work not yet run, and the buffers it holds
    // a wait that gave up on work still running is not made again: one poll
    if (!finished_in_time(stuck_ ? Clock::now() : Clock::now() + options_.wait_timeout)) {
      // Work that never finished may still use all of it: let it go without freeing it.
      timer_.release();
      kernels_.clear();
      devices_.abandon();
      return;
    }
    (void)devices_.wait_for_streams();  // idle: these waits and the ones below return at once
    if (origin_ != nullptr) {
      (void)cudaStreamSynchronize(origin_);  // every device's streams waited for its last launch
      for (cudaEvent_t e : joins_)
        if (e != nullptr) (void)cudaEventDestroy(e);
      if (fork_ != nullptr) (void)cudaEventDestroy(fork_);
      (void)cudaStreamDestroy(origin_);
      origin_ = nullptr;
    }
    timer_.release();
    kernels_.clear();
    devices_.release();
  }

  void enqueue(std::size_t device, Item item) {
    check_device(device);
    queues_.push(device, std::move(item));
    pump();
  }

  /// Runs every item that can run (WorkQueues::pump), then makes the caller's GPU current again.
  void pump() {
    int caller_gpu = 0;
    const bool restore = cudaGetDevice(&caller_gpu) == cudaSuccess;
    queues_.pump(failure_, [this](std::size_t d, Item& item) { run(d, item); });
    if (restore) (void)cudaSetDevice(caller_gpu);
  }

  /// Issues one item on device d with its GPU current; a failure trips the latch.
  void run(std::size_t d, Item& item) {
    detail::DeviceState& s = devices_[d];
    try {
      GPIPE_CUDA_CHECK(cudaSetDevice(s.gpu->id));
      switch (item.kind) {
        case Item::Kind::work:
          run_work(d, item);
          break;
        case Item::Kind::record:
          item.event->record(s.gpu->id, s.compute);
          break;
        case Item::Kind::wait:
          GPIPE_CUDA_CHECK(cudaStreamWaitEvent(s.compute, item.event->event, 0));
          break;
        case Item::Kind::copy_work:
          run_copy_work(d, item);
          break;
      }
    } catch (...) {
      failure_.fail(std::current_exception(), describe(item.label, options_.first_device + d));
    }
  }

  void run_work(std::size_t d, Item& item) {
    const cudaEvent_t end = timer_.start(d, item.label);  // null: not timed
    // Allocations and frees inside the work are ordered on this device's compute stream.
    order_.set_current(d);
    try {
      item.work(kernels_[d]);
    } catch (...) {
      item.work = nullptr;
      order_.set_current(detail::StreamOrder::none);
      if (end != nullptr) timer_.stop(d, end);
      throw;
    }
    item.work = nullptr;  // buffers the work captured are freed in this stream's order too
    order_.set_current(detail::StreamOrder::none);
    if (end != nullptr) timer_.stop(d, end);
  }

  // Copy-stream work (submit_copy): the copy stream first waits for the compute stream, then the
  // work runs with allocations and frees ordered on the copy stream; then its event's record.
  void run_copy_work(std::size_t d, Item& item) {
    detail::DeviceState& s = devices_[d];
    GPIPE_CUDA_CHECK(cudaEventRecord(s.ready, s.compute));
    GPIPE_CUDA_CHECK(cudaStreamWaitEvent(s.copy, s.ready, 0));
    const cudaEvent_t end = timer_.start(d, item.label, s.copy);
    order_.set_current(d);
    order_.set_stream(s.copy);
    const auto restore = [&] {
      item.work = nullptr;  // buffers the work captured are freed in the copy stream's order
      order_.set_stream(nullptr);
      order_.set_current(detail::StreamOrder::none);
      if (end != nullptr) timer_.stop(d, end, s.copy);
    };
    try {
      item.work(kernels_[d]);
    } catch (...) {
      restore();
      throw;
    }
    restore();
    if (item.event != nullptr) item.event->record(s.gpu->id, s.copy);
  }

  Options options_;
  detail::DeviceSet devices_;
  /// The allocators (the base) outlive it, but free nothing once destroy() has dropped the queued
  /// work; buffers must not outlive the backend.
  detail::StreamOrder order_;
  std::vector<Kernels> kernels_;
  detail::WorkTimer timer_;
  detail::WorkQueues queues_;
  gpipe::detail::FailureLatch failure_;
  cudaStream_t origin_ = nullptr;       // captures and launches graphs
  cudaEvent_t fork_ = nullptr;          // origin -> every device's streams
  std::vector<cudaEvent_t> joins_;      // device d's compute (2d) and copy (2d + 1) -> origin
  std::unique_ptr<StepGraph> capture_;  // the graph being captured
  std::size_t graph_launches_ = 0;
  std::string graph_refusal_;
  bool stuck_ = false;  // the latest synchronize() gave up on work still running
};

inline StepGraph::~StepGraph() { backend_->release(*this); }

}  // namespace gpipe::cuda

static_assert(gpipe::backend<gpipe::cuda::Backend>);

// The executor's seams for CUDA Graphs and activation offload, specialized for this backend.
#include "gpipe/backend/cuda/offload.cuh"
#include "gpipe/backend/cuda/step_graphs.cuh"
