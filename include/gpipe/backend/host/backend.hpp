#pragma once
// gpipe::host::Backend: K devices on the CPU. Each device is a worker thread running an in-order
// stream, with its own counted (and optionally capped) memory. Kernels run on the worker's own
// thread alone, so K workers use K cores and do not oversubscribe them, unless
// Options::threads_per_device gives each device a team of threads to split its kernels over.
//
//   gpipe::host::Backend backend(4, {.device_capacity = 256 << 20});
//   backend.submit(d, {"forward", stage, mb}, [&](gpipe::host::KernelContext<float>& k) { ... });
//   backend.synchronize();   // rethrows the first failure, naming where it happened

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/concepts.hpp"
#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/layers.hpp"
#include "gpipe/backend/host/linkage.hpp"
#include "gpipe/backend/host/memory.hpp"
#include "gpipe/backend/host/stream.hpp"
#include "gpipe/error.hpp"

namespace gpipe::host {

/// The cores this process may compute on: the CPUs of the calling thread's affinity mask where
/// the OS keeps one (Linux; `mpirun` binds each rank to one core unless told otherwise, and
/// `taskset` or a container's cpuset narrow it too), else std::thread::hardware_concurrency(); 0
/// when unknown.
inline unsigned usable_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return static_cast<unsigned>(CPU_COUNT(&set));
#endif
  return std::thread::hardware_concurrency();
}

/// How a device waits for another device's event (a hand-over between stages): the host's
/// counterpart of CUDA's cudaDeviceScheduleSpin and cudaDeviceScheduleBlockingSync, and of
/// cudaDeviceScheduleAuto, which spins only while the host has a core per context.
enum class WaitPolicy {
  /// `spin` where every device has cores of its own (num_devices * threads_per_device at most
  /// usable_cores(), and that known), else `block`.
  automatic,
  /// Polls, yielding the core to any other runnable thread, until the event: the shortest
  /// hand-over, at the cost of a core kept busy while the device waits.
  spin,
  /// Polls for a short while (StreamGroup::spin_time), then sleeps until the event's record
  /// wakes it: the core is free for devices or processes that share it, and each wake-up costs
  /// the hand-over a few microseconds more.
  block,
};

/// Construction options of a host::Backend.
struct BackendOptions {
  /// Bytes each device may hold in buffers, past which allocate() throws OutOfMemory; 0 = no cap.
  std::size_t device_capacity = 0;
  /// The number the first device goes by in errors, traces and out-of-memory messages (the
  /// devices are still addressed 0..K-1): an mpi::Backend's one device is its pipeline index.
  std::size_t first_device = 0;
  /// The threads each device computes on (1 to Team::max_threads): its worker and
  /// `threads_per_device - 1` helpers (kernels/team.hpp), over which its large kernels split
  /// (GEMMs by blocks of C, the others by rows or elements). 1 keeps a device on one core; more
  /// uses cores that K devices would leave idle (K * threads_per_device up to the core count),
  /// the way PyTorch splits each kernel over its intra-op threads.
  std::size_t threads_per_device = 1;
  /// How long a device waits for another device's event (a hand-over) before the step fails
  /// with an Error that names what it waited for: a device stuck in its work ends the step
  /// instead of hanging it (once that work returns; work that never returns cannot be
  /// interrupted). Positive.
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(10)};
  /// How a device waits for another device's event: see WaitPolicy; Backend::spins() says what
  /// `automatic` chose.
  WaitPolicy wait = WaitPolicy::automatic;
};

/// K devices on the CPU, a `gpipe::backend` (backend/concepts.hpp): each device is a worker
/// thread running an in-order Stream, with its own counted and optionally capped memory. A device
/// computes on one core (its GEMMs run on the worker's thread alone), so K devices want K cores,
/// unless Options::threads_per_device gives each device's kernels more threads.
///
///     gpipe::host::Backend backend(4, {.device_capacity = 256 << 20});
///     backend.submit(d, {"forward", stage, mb}, [&](host::KernelContext<float>& k) { ... });
///     backend.synchronize();  // rethrows the first failure, naming where it happened
///
/// memory_stats, reset_peak and allocate come from detail::DeviceMemory (backend/memory.hpp). The
/// device arguments of every member are 0..num_devices()-1; another throws `gpipe::Error`.
class Backend : public gpipe::detail::DeviceMemory<DeviceAllocator> {
 public:
  /// Construction options: capacity per device and the number the first device goes by.
  using Options = BackendOptions;

  /// The kernel context every piece of submitted work gets: float, on the work's device.
  using Kernels = host::KernelContext<float>;
  /// Orders work across devices: recorded on one device's stream, waited for on another's.
  using Event = host::Event;
  /// Owning handle of `count` elements of `T` on one device, as allocate() returns it.
  template <class T>
  using Buffer = host::Buffer<T>;

  /// The backend's name, "host", as the `gpipe::backend` concept requires one; nothing in the
  /// library branches on it.
  static constexpr std::string_view name = "host";

  /// Starts `num_devices` workers (1 to 1024; otherwise throws `gpipe::Error`), each device with
  /// its own allocator capped at `options.device_capacity` bytes.
  explicit Backend(std::size_t num_devices, Options options = {});
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  /// Joins every worker; work not yet started is dropped.
  ~Backend();

  /// K, the devices given at construction.
  std::size_t num_devices() const { return streams_.size(); }
  /// Whether a device waiting for another's event polls until it (WaitPolicy::spin, or what
  /// WaitPolicy::automatic chose) rather than sleeping after a short poll.
  bool spins() const { return group_.spin(); }
  /// The threads each device computes on (Options::threads_per_device).
  std::size_t threads_per_device() const { return threads_per_device_; }
  /// Whether `busy` devices computing at once, each on threads_per_device() threads, want more
  /// cores than this process may use (usable_cores(): its affinity mask; false when unknown).
  bool devices_share_cores(std::size_t busy) const {
    const unsigned cores = usable_cores();
    return cores != 0 && busy * threads_per_device_ > cores;
  }
  /// What the microseconds of traces and timings count from: the backend's construction.
  Stream::Clock::time_point epoch() const { return epoch_; }

  /// Enqueues `work` on `device`'s worker, to run after everything submitted there before;
  /// `label` names it in traces and in failure messages. If it throws, the work after it on every
  /// device is skipped and synchronize() rethrows the exception. Returns at once.
  void submit(std::size_t device, WorkLabel label, Stream::Work work) {
    stream(device).submit(label, std::move(work));
  }
  /// Enqueues on `device`'s stream the recording of `event`: it is recorded once the work
  /// submitted there before it has run.
  void record(std::size_t device, const Event& event) { stream(device).record(event); }
  /// Enqueues on `device`'s stream a wait for `event`: the work submitted there after it starts
  /// once `event` has been recorded (or once some work has failed, so nothing hangs). After
  /// Options::wait_timeout without a record the step fails with an Error naming the work that
  /// should have recorded it: `awaited` on device `awaited_device`, when given.
  void wait(std::size_t device, const Event& event, WorkLabel awaited = {},
            std::size_t awaited_device = 0) {
    stream(device).wait(event, awaited, awaited_device);
  }

  /// Turns the tracing of every device's work on or off (see Stream::set_tracing); off at
  /// construction.
  void set_tracing(bool on) {
    for (auto& s : streams_) s->set_tracing(on);
  }
  /// Waits for every device's work, then returns what was traced since the last call, all
  /// devices, ordered by start time (microseconds since epoch()).
  std::vector<TraceEvent> take_trace();

  /// Waits for every device's work, then returns its compute time since the last call, one
  /// ComputeTiming per device, in device order (measured whether or not tracing is on).
  std::vector<ComputeTiming> take_timing();

  /// Skips all work not yet run and releases every event wait; the next synchronize() returns
  /// normally once the streams are idle. For a caller that cannot finish issuing a step.
  void cancel();

  /// Blocks until all submitted work has finished; then, if any of it failed, throws the first
  /// failure (OutOfMemory stays OutOfMemory) with where it happened in front of its message.
  void synchronize();

 private:
  Stream& stream(std::size_t device) {
    check_device(device);
    return *streams_[device];
  }

  /// Declaration order matters: streams (which may free buffers as they drop work) are destroyed
  /// before the group they use, and before the allocators (the base).
  Stream::Clock::time_point epoch_ = Stream::Clock::now();
  std::size_t threads_per_device_ = 1;
  StreamGroup group_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

// The members above that start threads, wait for them or sort their traces: compiled in the
// library where the program uses it (backend/host/linkage.hpp).
#if GPIPE_HOST_DEFINITIONS
GPIPE_HOST_INLINE Backend::Backend(std::size_t num_devices, Options options) {
  detail::require(num_devices > 0, "host::Backend needs at least one device");
  detail::require(num_devices <= 1024, "host::Backend supports at most 1024 devices, got " +
                                           std::to_string(num_devices));
  detail::require(options.wait_timeout.count() > 0,
                  "host::Backend: wait_timeout must be positive, got " +
                      std::to_string(options.wait_timeout.count()) + " ms");
  group_.set_wait_timeout(options.wait_timeout);
  detail::require(
      options.threads_per_device >= 1 && options.threads_per_device <= Team::max_threads,
      "host::Backend: threads_per_device must be 1 to " + std::to_string(Team::max_threads) +
          ", got " + std::to_string(options.threads_per_device));
  detail::require(options.wait == WaitPolicy::automatic || options.wait == WaitPolicy::spin ||
                      options.wait == WaitPolicy::block,
                  [&] {
                    return "host::Backend: wait must be a WaitPolicy (automatic, spin or block), "
                           "got " +
                           std::to_string(static_cast<int>(options.wait));
                  });
  const unsigned cores = usable_cores();
  group_.set_spin(options.wait == WaitPolicy::spin ||
                  (options.wait == WaitPolicy::automatic && cores != 0 &&
                   num_devices * options.threads_per_device <= cores));
#ifndef GPIPE_HOST_GEMM_REFERENCE
  gemm_library();  // a bad GPIPE_HOST_GEMM throws here rather than in a device's first GEMM
#endif
  streams_.reserve(num_devices);
  for (std::size_t d = 0; d < num_devices; ++d) {
    const std::size_t named = options.first_device + d;
    add_device(named, options.device_capacity);
    streams_.push_back(std::make_unique<Stream>(named, group_, epoch_, options.threads_per_device));
  }
  threads_per_device_ = options.threads_per_device;
}

GPIPE_HOST_INLINE Backend::~Backend() { streams_.clear(); }

GPIPE_HOST_INLINE std::vector<TraceEvent> Backend::take_trace() {
  std::vector<TraceEvent> all;
  for (auto& s : streams_) {
    s->synchronize();
    for (TraceEvent& e : s->take_trace()) all.push_back(e);
  }
  std::sort(all.begin(), all.end(),
            [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
  return all;
}

GPIPE_HOST_INLINE std::vector<ComputeTiming> Backend::take_timing() {
  std::vector<ComputeTiming> out;
  for (auto& s : streams_) {
    s->synchronize();
    out.push_back(s->take_timing());
  }
  return out;
}

GPIPE_HOST_INLINE void Backend::cancel() {
  group_.fail(nullptr, {});
  for (auto& s : streams_) s->synchronize();
  group_.take_error();
}

GPIPE_HOST_INLINE void Backend::synchronize() {
  for (auto& s : streams_) s->synchronize();
  group_.take_error().rethrow();
}
#endif  // GPIPE_HOST_DEFINITIONS

}  // namespace gpipe::host

static_assert(gpipe::backend<gpipe::host::Backend>);
