#pragma once
// Launch records: while a gpipe::cuda::LaunchRecorder is alive, each kernel launch, cuBLAS and
// cuBLASLt call, device-to-device copy, upload, download and memset of the CUDA backend records
// what it does (LaunchKind says which), as its launcher computes it from its own arguments (no
// GPU counters): the kernel's name, its sizes, the floating-point operations and the bytes it
// must read and write in global memory (each operand once: the compulsory traffic; tiles that a
// kernel reads again are counted once, as if the L2 cache held them). The same records come from
// a GPU and from the CUDA emulator, so a step's launches, its bytes outside GEMMs and a roofline
// prediction (bench/cuda_gpt_step.cu) can be read on a machine without a GPU.
//
// Cost when no recorder is alive: one relaxed atomic load per launch.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/launch_log.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <string_view>
#include <vector>

#include "gpipe/error.hpp"

namespace gpipe::cuda {

/// What a launch record describes.
enum class LaunchKind {
  kernel,       ///< one of gpipe's kernels
  gemm,         ///< a matrix product on cuBLAS
  device_copy,  ///< a copy between device buffers (a hand-over, a copy op)
  memset,       ///< cudaMemsetAsync
  host_copy,    ///< an upload or download between host and device memory
};

/// What one launch does (see the top of gpipe/backend/cuda/launch_log.cuh).
struct LaunchRecord {
  std::string_view kernel;               ///< the kernel's (or cuBLAS call's) name, static storage
  std::array<std::size_t, 3> shape{};    ///< its sizes, e.g. (rows, cols) or (m, n, k); 0: unused
  double flops = 0;                      ///< floating-point operations (a multiply-add is 2)
  double bytes_read = 0;                 ///< bytes read from global memory, each operand once
  double bytes_written = 0;              ///< bytes written to global memory
  LaunchKind kind = LaunchKind::kernel;  ///< what it is
  bool tensor_cores = false;             ///< its FLOPs run on tensor cores (bf16 operands)
  cudaStream_t stream = nullptr;         ///< the stream it was enqueued on
};

namespace detail {

struct LaunchLog {
  std::atomic<bool> on{false};
  std::mutex mutex;
  std::vector<LaunchRecord> records;
};
inline LaunchLog& launch_log() {
  static LaunchLog log;
  return log;
}

// Records `r` if a LaunchRecorder is alive (any thread's launches; in the order they are
// enqueued by the host, interleaved across threads).
inline void record_launch(const LaunchRecord& r) {
  LaunchLog& log = launch_log();
  if (!log.on.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(log.mutex);
  if (log.on.load(std::memory_order_relaxed)) log.records.push_back(r);
}

// The record of a kernel with sizes `shape` (positional, shorter to write at a launch site).
inline void record_kernel(std::string_view kernel, std::array<std::size_t, 3> shape, double flops,
                          double read, double written, cudaStream_t stream) {
  record_launch({.kernel = kernel,
                 .shape = shape,
                 .flops = flops,
                 .bytes_read = read,
                 .bytes_written = written,
                 .stream = stream});
}
// Bytes of n elements of T, as a double (for records).
template <class T>
constexpr double bytes_of(std::size_t n) {
  return static_cast<double>(sizeof(T)) * static_cast<double>(n);
}

// The record of an elementwise pass over n elements: `read` and `written` bytes per element.
inline void record_map(std::string_view kernel, std::size_t n, double flops_per, double read,
                       double written, cudaStream_t stream) {
  const auto count = static_cast<double>(n);
  record_launch({.kernel = kernel,
                 .shape = {n, 0, 0},
                 .flops = flops_per * count,
                 .bytes_read = read * count,
                 .bytes_written = written * count,
                 .stream = stream});
}

}  // namespace detail

/// Collects the launch records of every thread from its construction until its destruction (see
/// the top of gpipe/backend/cuda/launch_log.cuh); at most one is alive at a time.
class LaunchRecorder {
 public:
  /// Starts recording; throws `gpipe::Error` if another recorder is alive.
  LaunchRecorder() {
    detail::LaunchLog& log = detail::launch_log();
    std::lock_guard lock(log.mutex);
    if (log.on.load()) throw Error("gpipe: a LaunchRecorder is already recording");
    log.records.clear();
    log.on.store(true);
  }
  /// Stops recording.
  ~LaunchRecorder() {
    detail::LaunchLog& log = detail::launch_log();
    std::lock_guard lock(log.mutex);
    log.on.store(false);
    log.records.clear();
  }
  LaunchRecorder(const LaunchRecorder&) = delete;
  LaunchRecorder& operator=(const LaunchRecorder&) = delete;

  /// The records so far, in the order the host enqueued them.
  std::vector<LaunchRecord> records() const {
    detail::LaunchLog& log = detail::launch_log();
    std::lock_guard lock(log.mutex);
    return log.records;
  }
};

}  // namespace gpipe::cuda
