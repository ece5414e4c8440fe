#pragma once
// The GPUs and virtual devices of one cuda::Backend: which GPU each virtual device is on, and the
// CUDA resources they hold (pools, streams, events, cuBLAS and cuBLASLt handles, NCCL
// communicators), made together and released together.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/device_set.cuh is CUDA code: compile it with nvcc"
#endif

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpipe/backend/cuda/device.cuh"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/error.hpp"

#if GPIPE_CUDA_NCCL
#include <nccl.h>
#endif

namespace gpipe::cuda::detail {

// The GPU of each of `num_devices` virtual devices: `gpus` as given, or d % (number of GPUs) when
// it is empty. Throws gpipe::Error when there is no usable GPU, or for a count or a mapping out
// of range.
inline std::vector<int> gpu_mapping(std::size_t num_devices, const std::vector<int>& gpus) {
  gpipe::detail::require(num_devices > 0, "cuda::Backend needs at least one device");
  gpipe::detail::require(num_devices <= 1024, "cuda::Backend supports at most 1024 devices, got " +
                                                  std::to_string(num_devices));
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
  std::vector<int> mapping = gpus;
  if (mapping.empty())
    for (std::size_t d = 0; d < num_devices; ++d) mapping.push_back(static_cast<int>(d % count));
  gpipe::detail::require(mapping.size() == num_devices, "BackendOptions::gpus has " +
                                                            std::to_string(mapping.size()) +
                                                            " entries, expected one per device (" +
                                                            std::to_string(num_devices) + ")");
  for (std::size_t d = 0; d < num_devices; ++d) {
    gpipe::detail::require(mapping[d] >= 0 && mapping[d] < count,
                           "BackendOptions::gpus[" + std::to_string(d) +
                               "] = " + std::to_string(mapping[d]) +
                               " is not a GPU; this machine has " + std::to_string(count) +
                               " (ordinals 0.." + std::to_string(count - 1) + ")");
  }
  return mapping;
}

// The GPUs of a backend, in order of first use, and its virtual devices. Per GPU a memory pool
// that every other GPU of the set may use, the epoch event of its timing, and with NCCL a
// communicator and a send stream; per virtual device its streams, transfer events and cuBLAS
// handle. The destructor (or release()) frees all of it, also after a create() that threw part
// way; the streams must be idle by then.
class DeviceSet {
 public:
  DeviceSet() = default;
  DeviceSet(const DeviceSet&) = delete;
  DeviceSet& operator=(const DeviceSet&) = delete;
  ~DeviceSet() { release(); }

  // Virtual device d on GPU mapping[d]; cuBLAS in TF32 math when `tf32`; cross-GPU hand-overs
  // through NCCL when `nccl` and the mapping spans several GPUs (a build with NCCL); a wait for a
  // staging block lasts at most `wait_timeout` (HostStaging).
  void create(const std::vector<int>& mapping, bool tf32, bool nccl,
              std::chrono::milliseconds wait_timeout) {
    std::vector<int> ids;
    for (int g : mapping)
      if (std::find(ids.begin(), ids.end(), g) == ids.end()) ids.push_back(g);
    gpus_.resize(ids.size());  // never reallocates after this: DeviceState points into it
    for (std::size_t i = 0; i < ids.size(); ++i) create_gpu(gpus_[i], ids[i], static_cast<int>(i));
    grant_peer_access();
    nccl = nccl && gpus_.size() > 1;
    if (nccl) create_nccl(ids);
    for (std::size_t d = 0; d < mapping.size(); ++d) {
      const auto gpu = std::find(ids.begin(), ids.end(), mapping[d]) - ids.begin();
      create_device(d, gpus_[static_cast<std::size_t>(gpu)], tf32, nccl);
      devices_.back()->staging.wait_timeout = wait_timeout;
    }
  }

  std::size_t size() const { return devices_.size(); }
  DeviceState& operator[](std::size_t device) const { return *devices_[device]; }
  std::vector<GpuState>& gpus() { return gpus_; }

  // Waits for every stream; returns the first CUDA error as a message ("" when none).
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
    for (GpuState& g : gpus_) sync(g.send, 0);
    (void)cudaGetLastError();
    return first;
  }

  // Polls every stream (cudaStreamQuery, through poll_until) until none has work left, or until
  // `deadline`: false when one still has work then. A stream's error counts as finished:
  // wait_for_streams() reports it.
  bool idle_by(std::chrono::steady_clock::time_point deadline) noexcept {
    return poll_until(deadline, [this]() noexcept { return streams_idle(); });
  }

  // Whether every stream has finished the work enqueued on it (cudaStreamQuery).
  bool streams_idle() noexcept {
    auto idle = [](cudaStream_t stream) {
      return stream == nullptr || cudaStreamQuery(stream) != cudaErrorNotReady;
    };
    bool all = true;
    for (auto& s : devices_) all = all && idle(s->compute) && idle(s->copy);
    for (GpuState& g : gpus_) all = all && idle(g.send);
    (void)cudaGetLastError();
    return all;
  }

  // Whether device d's streams have finished their work.
  bool device_idle(std::size_t d) const noexcept {
    const bool idle = cudaStreamQuery(devices_[d]->compute) != cudaErrorNotReady &&
                      cudaStreamQuery(devices_[d]->copy) != cudaErrorNotReady;
    (void)cudaGetLastError();
    return idle;
  }

  // Lets go of every resource without freeing it, for work on the GPU that never finished:
  // memory it may still use stays allocated, and its streams stay, until the process ends.
  void abandon() noexcept {
    (void)new std::vector<std::unique_ptr<DeviceState>>(std::move(devices_));  // leaked on purpose
    (void)new std::vector<GpuState>(std::move(gpus_));
    devices_.clear();
    gpus_.clear();
  }

  // Frees whatever create() made. Never throws.
  void release() noexcept {
    int caller_gpu = 0;
    const bool restore = cudaGetDevice(&caller_gpu) == cudaSuccess;
    for (auto& s : devices_) release_device(*s);
    devices_.clear();
    for (GpuState& g : gpus_) release_gpu(g);
    gpus_.clear();
    if (restore) (void)cudaSetDevice(caller_gpu);
    (void)cudaGetLastError();
  }

 private:
  // A pool that keeps freed memory cached however much (until the backend goes), and the epoch
  // event of the GPU's timing.
  static void create_gpu(GpuState& g, int id, int rank) {
    g.id = id;
    g.rank = rank;
    DeviceGuard guard(g.id);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = g.id;
    GPIPE_CUDA_CHECK(cudaMemPoolCreate(&g.pool, &props));
    std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
    GPIPE_CUDA_CHECK(cudaMemPoolSetAttribute(g.pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    GPIPE_CUDA_CHECK(cudaEventCreate(&g.epoch));
  }

  // Pool memory is visible to other GPUs only where granted (cudaDeviceEnablePeerAccess does not
  // apply to pools): lets every peer-capable GPU of the set read and write every pool.
  void grant_peer_access() {
    for (GpuState& owner : gpus_) {
      for (GpuState& peer : gpus_) {
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
  }

  // One communicator per GPU (ncclCommInitAll over `ids`), and a stream for its sends.
  void create_nccl([[maybe_unused]] std::vector<int>& ids) {
#if GPIPE_CUDA_NCCL
    std::vector<ncclComm_t> comms(gpus_.size());
    GPIPE_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(ids.size()), ids.data()));
    for (std::size_t i = 0; i < gpus_.size(); ++i) {
      gpus_[i].comm = comms[i];
      DeviceGuard guard(gpus_[i].id);
      GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&gpus_[i].send, cudaStreamNonBlocking));
      GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&gpus_[i].send_done, cudaEventDisableTiming));
    }
#endif
  }

  void create_device(std::size_t d, GpuState& gpu, bool tf32, bool nccl) {
    devices_.push_back(std::make_unique<DeviceState>());
    DeviceState& s = *devices_.back();
    s.index = d;
    s.gpu = &gpu;
    s.multi_gpu = gpus_.size() > 1;
    s.nccl = nccl;
    s.gpus = &gpus_;
    DeviceGuard guard(gpu.id);
    GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
    GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.copy, cudaStreamNonBlocking));
    GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
    GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    GPIPE_CUBLAS_CHECK(cublasCreate(&s.blas));
    GPIPE_CUBLAS_CHECK(cublasSetStream(s.blas, s.compute));
    GPIPE_CUBLAS_CHECK(
        cublasSetMathMode(s.blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    GPIPE_CUBLAS_CHECK(cublasLtCreate(&s.blas_lt));
    s.tf32 = tf32;
  }

  static void release_device(DeviceState& s) noexcept {
    if (s.gpu != nullptr) (void)cudaSetDevice(s.gpu->id);  // cuBLAS wants its handle's device
    bool freed = false;
    for (float* block : {s.scratch, s.wide, s.cast, s.lt_workspace})
      if (block != nullptr && cudaFreeAsync(block, s.compute) == cudaSuccess) freed = true;
    if (freed) (void)cudaStreamSynchronize(s.compute);
    s.staging.release_all();
    if (s.blas != nullptr) (void)cublasDestroy(s.blas);
    if (s.blas_lt != nullptr) (void)cublasLtDestroy(s.blas_lt);
    if (s.ready != nullptr) (void)cudaEventDestroy(s.ready);
    if (s.done != nullptr) (void)cudaEventDestroy(s.done);
    if (s.compute != nullptr) (void)cudaStreamDestroy(s.compute);
    if (s.copy != nullptr) (void)cudaStreamDestroy(s.copy);
  }

  static void release_gpu(GpuState& g) noexcept {
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

  std::vector<GpuState> gpus_;
  std::vector<std::unique_ptr<DeviceState>> devices_;
};

}  // namespace gpipe::cuda::detail
