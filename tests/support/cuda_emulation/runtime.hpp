#pragma once
// The emulated CUDA runtime: GPUs and their properties, streams (worker threads), events,
// stream-ordered pool memory (and cudaMalloc/cudaFree), copies, host functions. See
// support/cuda_emulation.hpp for the model and what it checks.

#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/cuda_emulation/device.hpp"

namespace gpipe::test::cuda_emulation {

using Clock = std::chrono::steady_clock;

// The emulated machine: its GPUs and every live allocation of device and pinned host memory.
struct Machine {
  int gpus = 2;
  // Which machine this is: the GPUs' UUIDs hold it. Each process is a machine of its own (ranks
  // under mpirun too); a test that wants two processes on one machine gives both the same id.
  std::uint64_t id = static_cast<std::uint64_t>(::getpid());
  // bytes per GPU (a dry run's: an H200's 141 GB)
  std::size_t gpu_memory = dry_run() ? std::size_t{143771} << 20 : std::size_t{8} << 30;

  // Each allocation is followed by a red zone; both hold 0xff bytes until written, and what
  // lies past the requested bytes must still hold them when the allocation is freed.
  static constexpr std::size_t redzone = 256;
  struct Allocation {
    std::size_t bytes;    // requested
    std::size_t rounded;  // counted against the GPU: bytes rounded up to 256
    int gpu;
  };
  std::mutex mutex;
  std::map<std::uintptr_t, Allocation> device;   // start address -> allocation
  std::map<std::uintptr_t, std::size_t> pinned;  // start address -> bytes
  std::set<std::pair<int, int>> peer_access;     // (owner, accessor): pool access granted
  std::vector<std::size_t> used = std::vector<std::size_t>(64, 0);  // bytes per GPU

  // The GPU whose memory holds p, or -1.
  int gpu_of(const void* p) {
    std::lock_guard lock(mutex);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = device.upper_bound(a);
    if (it == device.begin()) return -1;
    --it;
    return a < it->first + it->second.bytes ? it->second.gpu : -1;
  }
  // p lies in pinned host memory (cudaHostAlloc).
  bool is_pinned(const void* p) {
    std::lock_guard lock(mutex);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = pinned.upper_bound(a);
    if (it == pinned.begin()) return false;
    --it;
    return a < it->first + it->second;
  }
};
inline Machine& machine() {
  static Machine m;
  return m;
}

inline int& current_gpu() {
  static thread_local int gpu = 0;
  return gpu;
}

// A stream capture (cudaStreamBeginCapture), then the graph it made: the operations that the
// capturing streams were given, in the order the host issued them, which respects every
// dependency among them (an operation can only depend on one issued before it), so a launch runs
// them one after another on the launching stream. Waits and records inside the capture are
// dependencies only; a record with cudaEventRecordExternal is a node of its own. Memory allocated
// from a capturing stream belongs to the graph (CUDA's allocation nodes): it lives until the graph
// and its instances are gone, is filled with 0xff bytes again before each launch, and must be freed
// inside the graph by the time the graph is launched a second time.
struct Capture {
  struct Node {
    std::function<void()> run;
    std::shared_ptr<CUevent_st> external;  // a cudaEventRecordExternal record: completes `external`
    bool bookkeeping = false;
  };
  struct Member {
    std::size_t actions = 0;  // captured operations and waits issued to the stream so far
    std::size_t joined = 0;   // how many of them the origin stream has waited for
  };
  cudaStream_t origin = nullptr;
  bool open = true;
  cudaError_t error = cudaSuccess;  // the first misuse: the capture is invalidated
  std::vector<Node> nodes;
  std::map<cudaStream_t, Member> members;
  std::vector<void*> allocations;  // graph-owned
  std::set<void*> freed;           // graph-owned allocations that a node of the graph frees

  void invalidate(cudaError_t e) {
    if (error == cudaSuccess) error = e;
  }
  ~Capture();
};
// Which capture owns a graph allocation.
inline std::map<void*, Capture*>& graph_memory() {
  static std::map<void*, Capture*> owners;
  return owners;
}

}  // namespace gpipe::test::cuda_emulation

// The runtime's opaque handle types, defined here.

struct CUstream_st {
  explicit CUstream_st(int gpu_) : gpu(gpu_), worker([this] { loop(); }) {}
  CUstream_st(const CUstream_st&) = delete;
  CUstream_st& operator=(const CUstream_st&) = delete;
  ~CUstream_st() {
    synchronize();
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    ready.notify_all();
    worker.join();
  }

  // After a failure the stream skips its work, but still runs `bookkeeping` ops (event
  // completions, frees, NCCL partners), so that other streams waiting on them do not hang; a
  // GPU would fail those waits instead.
  void submit(std::function<void()> op, bool bookkeeping = false) {
    if (capture != nullptr) {
      capture->nodes.push_back({std::move(op), nullptr, bookkeeping});
      ++capture->members[this].actions;
      return;
    }
    {
      std::lock_guard lock(mutex);
      ops.push_back({std::move(op), bookkeeping});
    }
    ready.notify_all();
  }
  // An event record: on an idle stream it completes at once, as on a GPU (an emulated stream
  // would otherwise wait for its thread to wake, and timing anchors would carry that delay).
  void submit_record(const std::function<void()>& op) {
    std::unique_lock lock(mutex);
    if (ops.empty() && !running) {
      op();
      return;
    }
    ops.push_back({op, true});
    lock.unlock();
    ready.notify_all();
  }
  // cudaStreamQuery: cudaErrorNotReady while work is pending, else the stream's error.
  cudaError_t query() {
    if (capture != nullptr) return capture_misuse();
    std::lock_guard lock(mutex);
    return !ops.empty() || running ? cudaErrorNotReady : error;
  }
  // Waits until every operation submitted so far has run; the stream's error, if any.
  cudaError_t synchronize() {
    if (capture != nullptr) return capture_misuse();
    std::unique_lock lock(mutex);
    idle.wait(lock, [this] { return ops.empty() && !running; });
    return error;
  }

  const int gpu;
  // The capture this stream is part of (set and read by the issuing host thread only).
  std::shared_ptr<gpipe::test::cuda_emulation::Capture> capture;

 private:
  // What CUDA answers to a call that would wait for a capturing stream: an error, and the capture
  // is invalidated.
  cudaError_t capture_misuse() {
    capture->invalidate(cudaErrorStreamCaptureUnsupported);
    return cudaErrorStreamCaptureUnsupported;
  }

  void loop() {
    std::unique_lock lock(mutex);
    for (;;) {
      ready.wait(lock, [this] { return stop || !ops.empty(); });
      if (ops.empty()) return;
      Op op = std::move(ops.front());
      ops.pop_front();
      running = true;
      const bool skip = error != cudaSuccess && !op.bookkeeping;
      lock.unlock();
      std::string fault;
      if (!skip) {
        try {
          op.run();
        } catch (const std::exception& e) {
          fault = e.what();
        }
      }
      op.run = nullptr;
      lock.lock();
      if (!fault.empty() && error == cudaSuccess) {
        std::fprintf(stderr, "cuda emulator: stream of GPU %d failed: %s\n", gpu, fault.c_str());
        error = cudaErrorLaunchFailure;
      }
      running = false;
      idle.notify_all();
    }
  }

  std::mutex mutex;
  std::condition_variable ready, idle;
  struct Op {
    std::function<void()> run;
    bool bookkeeping;
  };
  std::deque<Op> ops;
  bool running = false, stop = false;
  cudaError_t error = cudaSuccess;
  std::thread worker;  // last: starts once the rest exists
};

struct CUevent_st {
  CUevent_st(int gpu_, bool timing_) : gpu(gpu_), timing(timing_) {}
  const int gpu;  // current when it was created: only that GPU's streams may record it
  const bool timing;
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // records issued
  std::uint64_t completed = 0;  // the latest record that its stream has reached
  std::chrono::steady_clock::time_point when{};
  // Its latest record was issued to a capturing stream: the capture, the stream and how many of
  // the stream's captured actions precede it.
  std::weak_ptr<gpipe::test::cuda_emulation::Capture> captured;
  cudaStream_t captured_on = nullptr;
  std::size_t captured_after = 0;

  // A new record; its generation.
  std::uint64_t record() {
    std::lock_guard lock(mutex);
    return ++recorded;
  }
  // The generation that a wait issued now waits for (0: never recorded, nothing to wait for).
  std::uint64_t latest() {
    std::lock_guard lock(mutex);
    return recorded;
  }
  void complete(std::uint64_t generation) {
    {
      std::lock_guard lock(mutex);
      if (generation > completed) {
        completed = generation;
        when = std::chrono::steady_clock::now();
      }
    }
    cv.notify_all();
  }
  void wait_for(std::uint64_t generation) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return completed >= generation; });
  }
};

struct CUmemPoolHandle_st {
  int gpu;
};

namespace gpipe::test::cuda_emulation {

// Events live until their last pending record or wait has run, also when destroyed before.
inline std::map<CUevent_st*, std::shared_ptr<CUevent_st>>& events() {
  static std::map<CUevent_st*, std::shared_ptr<CUevent_st>> all;
  return all;
}
inline std::mutex& events_mutex() {
  static std::mutex m;
  return m;
}
inline std::shared_ptr<CUevent_st> event_of(cudaEvent_t e) {
  std::lock_guard lock(events_mutex());
  auto it = events().find(e);
  return it == events().end() ? nullptr : it->second;
}

// op in the order of `stream`; at once on the null stream.
inline void run_on(cudaStream_t stream, std::function<void()> op) {
  if (stream == nullptr) {
    op();
  } else {
    stream->submit(std::move(op));
  }
}

inline void enqueue_launch(cudaStream_t stream, std::function<void()> launch) {
  if (stream != nullptr && stream->gpu != current_gpu()) {
    last_error() = cudaErrorInvalidResourceHandle;  // a stream of another device
    return;
  }
  run_on(stream, std::move(launch));
}

inline int gpu_of_memory(const void* p) { return machine().gpu_of(p); }
inline bool may_access(int gpu, int owner) {
  std::lock_guard lock(machine().mutex);
  return gpu == owner || machine().peer_access.count({owner, gpu}) != 0;
}
inline int gpu_of_stream(cudaStream_t stream) {
  return stream != nullptr ? stream->gpu : current_gpu();
}

#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
void require_kernel_argument(const void* p, std::size_t index, int gpu) {
  const int owner = p == nullptr ? gpu : gpu_of_memory(p);
  if (owner < 0)
    throw Error("cuda emulator: kernel argument " + std::to_string(index) +
                " is not device memory (host memory, or freed before the kernel ran)");
  if (!may_access(gpu, owner))
    throw Error("cuda emulator: kernel argument " + std::to_string(index) + " is memory of GPU " +
                std::to_string(owner) + ", which GPU " + std::to_string(gpu) +
                " (running the kernel) may not access");
}
#endif  // GPIPE_CUDA_EMULATION_LINKED

inline cudaError_t fail(cudaError_t error) {
  last_error() = error;
  return error;
}

// `bytes` of device memory on `gpu`, filled with 0xff and followed by a red zone.
inline cudaError_t allocate_device(void** ptr, std::size_t bytes, int gpu) {
  Machine& m = machine();
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  {
    std::lock_guard lock(m.mutex);
    if (m.used[static_cast<std::size_t>(gpu)] + rounded > m.gpu_memory)
      return fail(cudaErrorMemoryAllocation);
    m.used[static_cast<std::size_t>(gpu)] += rounded;
  }
  void* p = std::aligned_alloc(256, rounded + Machine::redzone);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  if (!dry_run()) std::memset(p, 0xff, rounded + Machine::redzone);
  std::lock_guard lock(m.mutex);
  m.device[reinterpret_cast<std::uintptr_t>(p)] = {bytes, rounded, gpu};
  *ptr = p;
  return cudaSuccess;
}

}  // namespace gpipe::test::cuda_emulation

// The runtime functions that the backend and its kernels call.

#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
extern "C" {

cudaError_t cudaGetLastError() {
  return std::exchange(gpipe::test::cuda_emulation::last_error(), cudaSuccess);
}
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    default:
      return cudaGetErrorName(error);
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = gpipe::test::cuda_emulation::machine().gpus;
  return *count > 0 ? cudaSuccess : gpipe::test::cuda_emulation::fail(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int device) {
  using namespace gpipe::test::cuda_emulation;
  if (device < 0 || device >= machine().gpus) return fail(cudaErrorInvalidDevice);
  current_gpu() = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = gpipe::test::cuda_emulation::current_gpu();
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  using namespace gpipe::test::cuda_emulation;
  if (device < 0 || device >= machine().gpus) return fail(cudaErrorInvalidDevice);
  *prop = {};
  std::snprintf(prop->name, sizeof prop->name, "%s",
                dry_run() ? "NVIDIA H200 (gpipe CUDA emulator, dry run: nothing runs)"
                          : "gpipe CUDA emulator (CPU)");
  prop->totalGlobalMem = machine().gpu_memory;
  prop->multiProcessorCount = 1;  // blocks run one after another
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->major = 9;
  // UUID: the machine, then the device ordinal
  const std::uint64_t id = machine().id;
  std::memcpy(prop->uuid.bytes, &id, sizeof id);
  std::memcpy(prop->uuid.bytes + sizeof id, &device, sizeof device);
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  using namespace gpipe::test::cuda_emulation;
  if (device < 0 || device >= machine().gpus || peer < 0 || peer >= machine().gpus)
    return fail(cudaErrorInvalidDevice);
  *can = device != peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = new CUstream_st(gpipe::test::cuda_emulation::current_gpu());
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return gpipe::test::cuda_emulation::fail(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return stream == nullptr ? cudaSuccess : stream->query();
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return stream == nullptr ? cudaSuccess : stream->synchronize();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  using namespace gpipe::test::cuda_emulation;
  auto e = std::make_shared<CUevent_st>(current_gpu(), (flags & cudaEventDisableTiming) == 0);
  std::lock_guard lock(events_mutex());
  events()[e.get()] = e;
  *event = e.get();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  using namespace gpipe::test::cuda_emulation;
  std::lock_guard lock(events_mutex());
  if (events().erase(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  std::shared_ptr<CUevent_st> e = event_of(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // "event and stream must be on the same device" (the null stream: the current device's)
  if (gpu_of_stream(stream) != e->gpu) return fail(cudaErrorInvalidResourceHandle);
  if (stream != nullptr && stream->capture != nullptr) {  // a dependency inside the capture
    e->captured = stream->capture;
    e->captured_on = stream;
    e->captured_after = stream->capture->members[stream].actions;
    return cudaSuccess;
  }
  e->captured.reset();
  auto complete = [e, generation = e->record()] { e->complete(generation); };
  if (stream == nullptr) {
    complete();
  } else {
    stream->submit_record(complete);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  using namespace gpipe::test::cuda_emulation;
  std::shared_ptr<CUevent_st> e = event_of(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (std::shared_ptr<Capture> c = e->captured.lock(); c != nullptr && c->open) {
    // A wait for a record inside a capture: the stream joins that capture (CUDA's fork) or, as a
    // member, depends on the record (the origin's wait is a join).
    if (stream == nullptr) return fail(cudaErrorStreamCaptureImplicit);
    if (stream->capture == nullptr) stream->capture = c;
    if (stream->capture != c) {
      c->invalidate(cudaErrorStreamCaptureMerge);
      return fail(cudaErrorStreamCaptureMerge);
    }
    Capture::Member& m = c->members[stream];
    ++m.actions;
    if (stream == c->origin) {
      Capture::Member& other = c->members[e->captured_on];
      other.joined = std::max(other.joined, e->captured_after);
    }
    return cudaSuccess;
  }
  if (stream != nullptr && stream->capture != nullptr) {  // on work outside the capture
    stream->capture->invalidate(cudaErrorStreamCaptureIsolation);
    return fail(cudaErrorStreamCaptureIsolation);
  }
  if (const std::uint64_t target = e->latest(); target != 0)
    run_on(stream, [e, target] { e->wait_for(target); });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  using namespace gpipe::test::cuda_emulation;
  std::shared_ptr<CUevent_st> e = event_of(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (std::shared_ptr<Capture> c = e->captured.lock(); c != nullptr && c->open) {
    c->invalidate(cudaErrorStreamCaptureUnsupported);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  std::lock_guard lock(e->mutex);
  return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  using namespace gpipe::test::cuda_emulation;
  std::shared_ptr<CUevent_st> e = event_of(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (std::shared_ptr<Capture> c = e->captured.lock(); c != nullptr && c->open) {
    c->invalidate(cudaErrorStreamCaptureUnsupported);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  e->wait_for(e->latest());
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  using namespace gpipe::test::cuda_emulation;
  std::shared_ptr<CUevent_st> a = event_of(start), b = event_of(end);
  if (a == nullptr || b == nullptr || !a->timing || !b->timing || a->gpu != b->gpu)
    return fail(cudaErrorInvalidResourceHandle);
  std::scoped_lock lock(a->mutex, b->mutex);
  if (a->recorded == 0 || b->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
  if (a->completed < a->recorded || b->completed < b->recorded) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  using namespace gpipe::test::cuda_emulation;
  if (props->location.type != cudaMemLocationTypeDevice || props->location.id < 0 ||
      props->location.id >= machine().gpus)
    return fail(cudaErrorInvalidValue);
  *pool = new CUmemPoolHandle_st{props->location.id};
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr, void* value) {
  return pool != nullptr && value != nullptr
             ? cudaSuccess
             : gpipe::test::cuda_emulation::fail(cudaErrorInvalidValue);
}
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const cudaMemAccessDesc* list, size_t count) {
  using namespace gpipe::test::cuda_emulation;
  if (pool == nullptr) return fail(cudaErrorInvalidValue);
  for (size_t i = 0; i < count; ++i)
    if (list[i].location.id < 0 || list[i].location.id >= machine().gpus ||
        list[i].location.id == pool->gpu)  // CUDA refuses the owner's own access
      return fail(cudaErrorInvalidDevice);
  // Granted per GPU pair here (gpipe has one pool per GPU); CUDA grants it per pool.
  std::lock_guard lock(machine().mutex);
  for (size_t i = 0; i < count; ++i) {
    if (list[i].flags == cudaMemAccessFlagsProtReadWrite)
      machine().peer_access.insert({pool->gpu, list[i].location.id});
    else
      machine().peer_access.erase({pool->gpu, list[i].location.id});
  }
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  delete pool;
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t bytes, cudaMemPool_t pool,
                                    cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  if (pool == nullptr || ptr == nullptr) return fail(cudaErrorInvalidValue);
  // memory exists from now on, which satisfies stream order
  const cudaError_t made = allocate_device(ptr, bytes, pool->gpu);
  if (made == cudaSuccess && stream != nullptr && stream->capture != nullptr) {
    stream->capture->allocations.push_back(*ptr);  // an allocation node: the graph's memory
    std::lock_guard lock(machine().mutex);
    graph_memory()[*ptr] = stream->capture.get();
  }
  return made;
}
// cudaMalloc: from the current GPU, at once.
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  using namespace gpipe::test::cuda_emulation;
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  return allocate_device(ptr, bytes, current_gpu());
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  Machine& m = machine();
  {
    std::lock_guard lock(m.mutex);
    if (m.device.count(reinterpret_cast<std::uintptr_t>(p)) == 0)
      return fail(cudaErrorInvalidValue);
    // Graph memory is freed by a node of its own graph only, and lives as long as the graph.
    const auto owner = graph_memory().find(p);
    Capture* capturing = stream != nullptr ? stream->capture.get() : nullptr;
    if (owner != graph_memory().end() || capturing != nullptr) {
      if (owner == graph_memory().end() || owner->second != capturing) {
        if (capturing != nullptr) capturing->invalidate(cudaErrorInvalidValue);
        return fail(cudaErrorInvalidValue);
      }
      capturing->freed.insert(p);
      ++capturing->members[stream].actions;
      return cudaSuccess;
    }
  }
  auto free = [p, &m] {
    Machine::Allocation a{};
    {
      std::lock_guard lock(m.mutex);
      auto it = m.device.find(reinterpret_cast<std::uintptr_t>(p));
      a = it->second;
      m.used[static_cast<std::size_t>(a.gpu)] -= a.rounded;
      m.device.erase(it);
    }
    // Everything past the requested bytes must still hold the fill.
    const auto* bytes = static_cast<const unsigned char*>(p);
    bool intact = true;
    for (std::size_t i = a.bytes; i < a.rounded + Machine::redzone && !dry_run(); ++i)
      intact = intact && bytes[i] == 0xff;
    std::free(p);
    if (!intact)
      throw std::runtime_error("device memory written past the end of an allocation of " +
                               std::to_string(a.bytes) + " bytes (found when it was freed)");
  };
  if (stream != nullptr) {
    stream->submit(free, /*bookkeeping=*/true);
    return cudaSuccess;
  }
  try {
    free();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda emulator: %s\n", e.what());
    return fail(cudaErrorLaunchFailure);
  }
  return cudaSuccess;
}
// cudaFree: at once. On a GPU it first waits for the device's work; here the caller must have
// synchronized the streams that use p (the benchmarks do), or they fault when they touch it.
cudaError_t cudaFree(void* p) { return p == nullptr ? cudaSuccess : cudaFreeAsync(p, nullptr); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  using namespace gpipe::test::cuda_emulation;
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  std::lock_guard lock(machine().mutex);
  machine().pinned[reinterpret_cast<std::uintptr_t>(*p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  using namespace gpipe::test::cuda_emulation;
  {
    std::lock_guard lock(machine().mutex);
    if (machine().pinned.erase(reinterpret_cast<std::uintptr_t>(p)) == 0)
      return fail(cudaErrorInvalidValue);
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  using namespace gpipe::test::cuda_emulation;
  *attributes = {};
  const int gpu = machine().gpu_of(p);
  if (gpu >= 0) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = gpu;
    attributes->devicePointer = const_cast<void*>(p);
  } else {
    attributes->type = machine().is_pinned(p) ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  if (bytes == 0) return cudaSuccess;
  const bool dst_device = machine().gpu_of(dst) >= 0, src_device = machine().gpu_of(src) >= 0;
  const bool ok = kind == cudaMemcpyDefault ||
                  (kind == cudaMemcpyHostToDevice && dst_device && !src_device) ||
                  (kind == cudaMemcpyDeviceToHost && !dst_device && src_device) ||
                  (kind == cudaMemcpyDeviceToDevice && dst_device && src_device) ||
                  (kind == cudaMemcpyHostToHost && !dst_device && !src_device);
  if (!ok) {
    std::fprintf(stderr, "cuda emulator: cudaMemcpyAsync of kind %d between %s and %s memory\n",
                 static_cast<int>(kind), dst_device ? "device" : "host",
                 src_device ? "device" : "host");
    return fail(cudaErrorInvalidValue);
  }
  if (stream != nullptr && stream->capture != nullptr &&
      ((!dst_device && !machine().is_pinned(dst)) || (!src_device && !machine().is_pinned(src)))) {
    // a copy from or to pageable memory would happen at capture, not at each launch
    stream->capture->invalidate(cudaErrorStreamCaptureUnsupported);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (dry_run() && dst_device && src_device) return cudaSuccess;
  run_on(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_gpu, const void* src, int src_gpu, size_t bytes,
                                cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  if (bytes == 0) return cudaSuccess;
  if (machine().gpu_of(dst) != dst_gpu || machine().gpu_of(src) != src_gpu)
    return fail(cudaErrorInvalidValue);
  if (dry_run()) return cudaSuccess;
  run_on(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (gpipe::test::cuda_emulation::dry_run()) return cudaSuccess;
  gpipe::test::cuda_emulation::run_on(stream,
                                      [dst, value, bytes] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  gpipe::test::cuda_emulation::run_on(stream, [fn, data] { fn(data); });
  return cudaSuccess;
}

}  // extern "C"
#endif  // GPIPE_CUDA_EMULATION_LINKED
