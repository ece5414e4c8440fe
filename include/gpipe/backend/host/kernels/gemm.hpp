#pragma once
// Row-major GEMM through CBLAS (OpenBLAS): C(m, n) = alpha * op(A) * op(B) + beta * C.

#include <cblas.h>

#include <cstddef>
#include <type_traits>

namespace gpipe::host {

// op(A) is (m, k): A is (m, k), or (k, m) when trans_a. op(B) is (k, n): B is (k, n), or (n, k)
// when trans_b. All matrices are dense row-major.
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
          const T* a, const T* b, T beta, T* c) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if (m == 0 || n == 0) return;
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto lda = static_cast<int>(trans_a ? m : k);
  const auto ldb = static_cast<int>(trans_b ? k : n);
  const auto mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (k == 0) {  // BLAS leaves C untouched for k == 0 only when beta == 1; be explicit.
    for (std::size_t i = 0; i < m * n; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, mi, ni, ki, alpha, a, lda, b, ldb, beta, c, ni);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, mi, ni, ki, alpha, a, lda, b, ldb, beta, c, ni);
  }
}

}  // namespace gpipe::host
