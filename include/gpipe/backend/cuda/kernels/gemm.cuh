#pragma once
// Row-major GEMM through cuBLAS (column-major): C(m, n) = alpha op(A) op(B) + beta C.
//
// A row-major (r, c) matrix is the column-major (c, r) matrix of its transpose, so
//   C^T(n, m) = op(B)^T(n, k) op(A)^T(k, m)
// is one column-major cublasSgemm with the operands swapped and the same transposition flags,
// leading dimensions as the host reference (gpipe/backend/host/kernels/gemm.hpp). The handle
// carries the stream and the math mode (TF32 or not; see BackendOptions::tf32).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/gemm.cuh is CUDA code: compile it with nvcc"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <string>
#include <type_traits>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/model/precision.hpp"

namespace gpipe::cuda {

namespace detail {
// What a GEMM does before cuBLAS: nothing for an empty C; C = beta C for k == 0 (C not read when
// beta == 0, as the host reference); true when that was all. Throws for dimensions past cuBLAS's
// 32 bits.
template <class C>
bool gemm_without_products(std::size_t m, std::size_t n, std::size_t k, float beta, C* c,
                           cudaStream_t stream) {
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    if (beta == 0.0f) {
      fill(m * n, 0.0f, c, stream);
    } else if (beta != 1.0f) {
      scale(m * n, beta, c, stream);
    }
    return true;
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
    throw Error("gpipe: gemm of (" + std::to_string(m) + ", " + std::to_string(n) + ", " +
                std::to_string(k) + ") exceeds cuBLAS's 32-bit dimensions");
  return false;
}

// The launch record of `batch` products C(m, n) = alpha op(A) op(B) + beta C: A and B read
// once, C read when beta != 0 and written.
template <class A, class B, class C>
void record_gemm(std::string_view call, std::size_t m, std::size_t n, std::size_t k, float beta,
                 cudaStream_t stream, std::size_t batch = 1) {
  const double products = static_cast<double>(batch) * static_cast<double>(m) *
                          static_cast<double>(n) * static_cast<double>(k);
  const double c_bytes = static_cast<double>(batch) * bytes_of<C>(m * n);
  record_launch(
      {.kernel = call,
       .shape = {m, n, k},
       .flops = 2 * products,
       .bytes_read = static_cast<double>(batch) * (bytes_of<A>(m * k) + bytes_of<B>(k * n)) +
                     (beta != 0.0f ? c_bytes : 0.0),
       .bytes_written = c_bytes,
       .kind = LaunchKind::gemm,
       .tensor_cores = std::is_same_v<A, bf16>,
       .stream = stream});
}
}  // namespace detail

/// op(A) is (m, k): A is (m, k), or (k, m) when trans_a. op(B) is (k, n): B is (k, n), or (n, k)
/// when trans_b. All dense row-major, device memory of the handle's device.
inline void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, std::size_t m, std::size_t n,
                 std::size_t k, float alpha, const float* a, const float* b, float beta, float* c,
                 cudaStream_t stream) {
  if (detail::gemm_without_products(m, n, k, beta, c, stream)) return;
  detail::record_gemm<float, float, float>("cublasSgemm", m, n, k, beta, stream);
  const auto mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int lda = trans_a ? mi : ki;
  const int ldb = trans_b ? ki : ni;
  GPIPE_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, ni, mi, ki, &alpha, b, ldb, a,
                                 lda, &beta, c, ni));
}

/// C(m, n) = alpha op(A) op(B) + beta C with bf16 A and B, C float or bf16, products and sums in
/// float (cublasGemmEx, CUBLAS_COMPUTE_32F: tensor cores where the GPU has them); shapes and
/// layout as gemm's.
template <class C>
inline void gemm_bf16(cublasHandle_t handle, bool trans_a, bool trans_b, std::size_t m,
                      std::size_t n, std::size_t k, float alpha, const bf16* a, const bf16* b,
                      float beta, C* c, cudaStream_t stream) {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, bf16>,
                "gpipe: gemm_bf16 writes float or bf16");
  if (detail::gemm_without_products(m, n, k, beta, c, stream)) return;
  detail::record_gemm<bf16, bf16, C>("cublasGemmEx", m, n, k, beta, stream);
  const auto mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int lda = trans_a ? mi : ki;
  const int ldb = trans_b ? ki : ni;
  constexpr cudaDataType_t c_type = std::is_same_v<C, float> ? CUDA_R_32F : CUDA_R_16BF;
  GPIPE_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, ni, mi, ki, &alpha, b,
                                  CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &beta, c, c_type, ni,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace gpipe::cuda
