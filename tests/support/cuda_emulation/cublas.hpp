#pragma once
// The emulated cuBLAS: handles bound to a GPU and a stream, and cublasSgemm and
// cublasSgemmStridedBatched as a column-major FP32 reference run in stream order (TF32 math
// rounds the operands first); cublasGemmEx for bf16 A and B (float or bf16 C, float compute).

#include <cublas_v2.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "support/cuda_emulation/runtime.hpp"

struct cublasContext {
  int gpu;
  cudaStream_t stream = nullptr;
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

namespace gpipe::test::cuda_emulation {

// Rounds to TF32 (10 explicit mantissa bits), to nearest.
inline float to_tf32(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace gpipe::test::cuda_emulation

// The cuBLAS functions that the backend calls.

#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext{gpipe::test::cuda_emulation::current_gpu()};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS (emulated)";
  }
}
const char* cublasGetStatusString(cublasStatus_t status) { return cublasGetStatusName(status); }

}  // extern "C"
#endif  // GPIPE_CUDA_EMULATION_LINKED

namespace gpipe::test::cuda_emulation {

// The checks every emulated GEMM makes before it is enqueued: the shapes and leading dimensions
// (CUBLAS_STATUS_INVALID_VALUE), the handle's GPU against the current one and its stream's
// (CUBLAS_STATUS_EXECUTION_FAILED, with a message). SUCCESS when the call may go on.
inline cublasStatus_t check_call(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                                 int m, int n, int k, int lda, int ldb, int ldc, int batch) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool trans_a = ta != CUBLAS_OP_N, trans_b = tb != CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, trans_a ? k : m) ||
      ldb < std::max(1, trans_b ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (handle->gpu != current_gpu() ||
      (handle->stream != nullptr && handle->stream->gpu != handle->gpu)) {
    std::fprintf(stderr, "cublas emulator: handle of GPU %d used with GPU %d current\n",
                 handle->gpu, current_gpu());
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// When the GEMM runs: `p` must be device memory that `gpu` may access (else it would fault).
inline void require_accessible(const char* name, int gpu, const void* p) {
  const int owner = gpu_of_memory(p);
  if (owner < 0)
    throw std::runtime_error(std::string(name) + " on memory that is not device memory");
  if (!may_access(gpu, owner))
    throw std::runtime_error(std::string(name) + " on GPU " + std::to_string(gpu) +
                             " with memory of GPU " + std::to_string(owner) +
                             ", which it may not access");
}

// For each of `batch` problems i: C_i(m, n) = alpha op(A_i)(m, k) op(B_i)(k, n) + beta C_i,
// column-major, X_i = X + i stride_x.
inline cublasStatus_t sgemm_batched(const char* name, cublasHandle_t handle, cublasOperation_t ta,
                                    cublasOperation_t tb, int m, int n, int k, const float* alpha,
                                    const float* a, int lda, long long stride_a, const float* b,
                                    int ldb, long long stride_b, const float* beta, float* c,
                                    int ldc, long long stride_c, int batch) {
  const bool trans_a = ta != CUBLAS_OP_N, trans_b = tb != CUBLAS_OP_N;
  if (const cublasStatus_t status = check_call(handle, ta, tb, m, n, k, lda, ldb, ldc, batch);
      status != CUBLAS_STATUS_SUCCESS)
    return status;
  const float al = *alpha, be = *beta;
  const bool tf32 = handle->mode == CUBLAS_TF32_TENSOR_OP_MATH;
  counts().add_gemm();
  if (dry_run()) return CUBLAS_STATUS_SUCCESS;
  run_on(handle->stream, [=, gpu = handle->gpu] {
    for (int i = 0; i < batch; ++i) {
      const float* ai = a + i * stride_a;
      const float* bi = b + i * stride_b;
      float* ci = c + i * stride_c;
      for (const void* p : {static_cast<const void*>(ai), static_cast<const void*>(bi),
                            static_cast<const void*>(ci)})
        require_accessible(name, gpu, p);
      auto at = [&](std::size_t r, std::size_t p) {
        const float v = trans_a ? ai[p + r * static_cast<std::size_t>(lda)]
                                : ai[r + p * static_cast<std::size_t>(lda)];
        return tf32 ? to_tf32(v) : v;
      };
      auto bt = [&](std::size_t p, std::size_t j) {
        const float v = trans_b ? bi[j + p * static_cast<std::size_t>(ldb)]
                                : bi[p + j * static_cast<std::size_t>(ldb)];
        return tf32 ? to_tf32(v) : v;
      };
      for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j)
        for (std::size_t r = 0; r < static_cast<std::size_t>(m); ++r) {
          float sum = 0;
          for (std::size_t p = 0; p < static_cast<std::size_t>(k); ++p) sum += at(r, p) * bt(p, j);
          float& out = ci[r + j * static_cast<std::size_t>(ldc)];
          out = be == 0.0f ? al * sum : al * sum + be * out;
        }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

// An element of an Ex operand: float, or bf16 (its 16 bits, widened exactly).
inline float element(const void* p, cudaDataType_t type, std::size_t i) {
  if (type == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i])
                             << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
// Stores v as `type`: float, or bf16 rounded to nearest even (NaN kept quiet).
inline void store(void* p, cudaDataType_t type, std::size_t i, float v) {
  if (type == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  const auto bits = (u & 0x7fffffffu) > 0x7f800000u
                        ? static_cast<std::uint16_t>((u >> 16) | 0x0040u)
                        : static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  static_cast<std::uint16_t*>(p)[i] = bits;
}

// cublasGemmEx for what the backend calls: A and B bf16 (CUDA_R_16BF), C bf16 or float, float
// compute and scale types (CUBLAS_COMPUTE_32F); products of the widened values summed in float.
inline cublasStatus_t gemm_ex(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, const void* alpha, const void* a,
                              cudaDataType_t a_type, int lda, const void* b, cudaDataType_t b_type,
                              int ldb, const void* beta, void* c, cudaDataType_t c_type, int ldc,
                              cublasComputeType_t compute) {
  if (a_type != CUDA_R_16BF || b_type != CUDA_R_16BF ||
      (c_type != CUDA_R_16BF && c_type != CUDA_R_32F) || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool trans_a = ta != CUBLAS_OP_N, trans_b = tb != CUBLAS_OP_N;
  if (const cublasStatus_t status = check_call(handle, ta, tb, m, n, k, lda, ldb, ldc, 1);
      status != CUBLAS_STATUS_SUCCESS)
    return status;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  counts().add_gemm();
  if (dry_run()) return CUBLAS_STATUS_SUCCESS;
  run_on(handle->stream, [=, gpu = handle->gpu] {
    for (const void* p : {a, b, static_cast<const void*>(c)})
      require_accessible("cublasGemmEx", gpu, p);
    const auto ld_a = static_cast<std::size_t>(lda), ld_b = static_cast<std::size_t>(ldb),
               ld_c = static_cast<std::size_t>(ldc);
    for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j)
      for (std::size_t r = 0; r < static_cast<std::size_t>(m); ++r) {
        float sum = 0;
        for (std::size_t p = 0; p < static_cast<std::size_t>(k); ++p)
          sum += element(a, a_type, trans_a ? p + r * ld_a : r + p * ld_a) *
                 element(b, b_type, trans_b ? j + p * ld_b : p + j * ld_b);
        const std::size_t at = r + j * ld_c;
        store(c, c_type, at, be == 0.0f ? al * sum : al * sum + be * element(c, c_type, at));
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace gpipe::test::cuda_emulation

#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
extern "C" {

// C(m, n) = alpha op(A)(m, k) op(B)(k, n) + beta C, column-major.
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, const float* alpha, const float* a, int lda,
                              const float* b, int ldb, const float* beta, float* c, int ldc) {
  return gpipe::test::cuda_emulation::sgemm_batched("cublasSgemm", handle, ta, tb, m, n, k, alpha,
                                                    a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

// The same for `batch` problems, operand i at X + i stride_x.
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float* alpha, const float* a, int lda,
                                         long long stride_a, const float* b, int ldb,
                                         long long stride_b, const float* beta, float* c, int ldc,
                                         long long stride_c, int batch) {
  return gpipe::test::cuda_emulation::sgemm_batched("cublasSgemmStridedBatched", handle, ta, tb, m,
                                                    n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                                                    beta, c, ldc, stride_c, batch);
}

// C(m, n) = alpha op(A) op(B) + beta C, column-major, of the types gemm_ex supports.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void* alpha, const void* a,
                            cudaDataType_t a_type, int lda, const void* b, cudaDataType_t b_type,
                            int ldb, const void* beta, void* c, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  return gpipe::test::cuda_emulation::gemm_ex(handle, ta, tb, m, n, k, alpha, a, a_type, lda, b,
                                              b_type, ldb, beta, c, c_type, ldc, compute);
}

}  // extern "C"
#endif  // GPIPE_CUDA_EMULATION_LINKED
