#pragma once
// Checks for every CUDA, cuBLAS and NCCL call of the CUDA backend: a failure becomes a
// gpipe::Error (gpipe::OutOfMemory for an allocation failure) whose message names the error, the
// call, and the file and line of the call.
//
//   GPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
//   GPIPE_CUDA_LAUNCH(add_kernel<4, float>, grid, block, stream)(n, a, b, y);
//   GPIPE_CUDA_CHECK_LAUNCH("add_kernel");

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/error.cuh is CUDA code: compile it with nvcc (see gpipe/cuda.cuh)"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "gpipe/error.hpp"

#if GPIPE_CUDA_NCCL
#include <nccl.h>
#endif

namespace gpipe::cuda::detail {

inline std::string where(const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line);
}

[[noreturn]] inline void throw_cuda_error(cudaError_t error, const char* call, const char* file,
                                          int line) {
  // Clears a non-sticky error, so that the next launch check does not report it again.
  (void)cudaGetLastError();
  const std::string message = std::string("gpipe: CUDA error ") + cudaGetErrorName(error) + " (" +
                              cudaGetErrorString(error) + ") in " + call + " at " +
                              where(file, line);
  if (error == cudaErrorMemoryAllocation) throw OutOfMemory(message);
  throw Error(message);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  const std::string message = std::string("gpipe: cuBLAS error ") + cublasGetStatusName(status) +
                              " (" + cublasGetStatusString(status) + ") in " + call + " at " +
                              where(file, line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(message);
  throw Error(message);
}

#if GPIPE_CUDA_NCCL
[[noreturn]] inline void throw_nccl_error(ncclResult_t result, const char* call, const char* file,
                                          int line) {
  throw Error(std::string("gpipe: NCCL error ") + std::to_string(static_cast<int>(result)) + " (" +
              ncclGetErrorString(result) + ") in " + call + " at " + where(file, line));
}
#endif

}  // namespace gpipe::cuda::detail

/// Runs a CUDA runtime call; unless it returns cudaSuccess, throws `gpipe::Error`
/// (`gpipe::OutOfMemory` for cudaErrorMemoryAllocation) naming the error, the call, file and line.
#define GPIPE_CUDA_CHECK(call)                                                               \
  do {                                                                                       \
    const cudaError_t gpipe_cuda_error_ = (call);                                            \
    if (gpipe_cuda_error_ != cudaSuccess)                                                    \
      ::gpipe::cuda::detail::throw_cuda_error(gpipe_cuda_error_, #call, __FILE__, __LINE__); \
  } while (0)

/// After each kernel launch: a bad configuration throws `gpipe::Error` here, naming
/// `kernel_name` (a string literal); a fault inside the kernel shows at the next synchronization.
#define GPIPE_CUDA_CHECK_LAUNCH(kernel_name)                                               \
  do {                                                                                     \
    const cudaError_t gpipe_cuda_error_ = cudaGetLastError();                              \
    if (gpipe_cuda_error_ != cudaSuccess)                                                  \
      ::gpipe::cuda::detail::throw_cuda_error(gpipe_cuda_error_, "launch of " kernel_name, \
                                              __FILE__, __LINE__);                         \
  } while (0)

/// Runs a cuBLAS call; unless it returns CUBLAS_STATUS_SUCCESS, throws `gpipe::Error`
/// (`gpipe::OutOfMemory` for CUBLAS_STATUS_ALLOC_FAILED) naming the status, the call, file and
/// line.
#define GPIPE_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                            \
    const cublasStatus_t gpipe_cublas_status_ = (call);                                           \
    if (gpipe_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::gpipe::cuda::detail::throw_cublas_error(gpipe_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

#if GPIPE_CUDA_NCCL
/// Runs an NCCL call; unless it returns ncclSuccess, throws `gpipe::Error` naming the result, the
/// call, file and line. Defined only in a build with NCCL (GPIPE_CUDA_NCCL).
#define GPIPE_NCCL_CHECK(call)                                                                \
  do {                                                                                        \
    const ncclResult_t gpipe_nccl_result_ = (call);                                           \
    if (gpipe_nccl_result_ != ncclSuccess)                                                    \
      ::gpipe::cuda::detail::throw_nccl_error(gpipe_nccl_result_, #call, __FILE__, __LINE__); \
  } while (0)
#endif
