#pragma once
// Row-major GEMM of the host backend: C(m, n) = alpha * op(A) * op(B) + beta * C.
//
// float goes through oneDNN's dnnl_sgemm, which picks its kernel (AVX-512, AVX2, ...) for the CPU
// it runs on, always in fp32 (the gemm API has no reduced-precision mode), or through OpenBLAS's
// cblas_sgemm where gemm_library() chooses it (AMD Zen CPUs, or GPIPE_HOST_GEMM=openblas; see
// gemm_library.hpp). It runs on the calling thread alone: a device's worker is one compute
// thread, so K devices use K cores and never oversubscribe them; a device given a Team of more
// threads (kernels/team.hpp) splits each large GEMM's output into one block per thread, each
// block again a one-thread library call. A build configured with
// GPIPE_HOST_ONEDNN=OFF (CMake) defines GPIPE_HOST_GEMM_REFERENCE and uses reference_gemm for
// float too: correct, and slow. double (the finite-difference tests and the double-precision
// reference model) always takes reference_gemm: no optimized library is needed for test sizes.

#include <climits>
#include <cstddef>
#include <string>
#include <type_traits>

#include "gpipe/backend/host/kernels/team.hpp"
#include "gpipe/error.hpp"

#ifdef GPIPE_HOST_GEMM_MISSING
#error \
    "gpipe's host backend needs oneDNN, which the gpipe package did not find (Debian/Ubuntu: libdnnl-dev); configure with -DGPIPE_HOST_ONEDNN=OFF for plain-loop GEMMs, or link only gpipe::core / gpipe::cuda"
#endif

#ifndef GPIPE_HOST_GEMM_REFERENCE
#include <oneapi/dnnl/dnnl.h>

#include "gpipe/backend/host/kernels/gemm_library.hpp"

/// The OpenMP runtime oneDNN is built on (its thread count is a per-thread setting).
extern "C" int omp_get_max_threads() noexcept;
extern "C" void omp_set_num_threads(int num_threads) noexcept;
#endif

namespace gpipe::host {

/// Leading dimensions of a GEMM's row-major operands: the distance between consecutive rows of
/// A, B and C as stored (a sub-matrix of a wider one has its parent's row length).
struct GemmStrides {
  /// Elements (not bytes) from one stored row of A to the next.
  std::size_t lda, ldb, ldc;
  /// \var ldb
  /// Elements (not bytes) from one stored row of B to the next.
  /// \var ldc
  /// Elements (not bytes) from one stored row of C to the next.
};

/// Dense operands: the row lengths that op(A) (m, k), op(B) (k, n) and C (m, n) have in memory.
constexpr GemmStrides dense_strides(bool trans_a, bool trans_b, std::size_t m, std::size_t n,
                                    std::size_t k) {
  return {trans_a ? m : k, trans_b ? k : n, n};
}

/// reference_gemm: plain loops, for any arithmetic T. op(A) is (m, k): A is (m, k), or (k, m) when
/// trans_a. op(B) is (k, n): B is (k, n), or (n, k) when trans_b. Row-major with leading
/// dimensions ld. The inner loops run over contiguous memory where the layout allows, so the
/// compiler vectorizes them; beta == 0 overwrites C (NaN in C does not survive), as BLAS does.
template <class T>
void reference_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                    T alpha, const T* a, const T* b, T beta, T* c, GemmStrides ld) {
  auto a_at = [&](std::size_t i, std::size_t p) {
    return trans_a ? a[p * ld.lda + i] : a[i * ld.lda + p];
  };
  for (std::size_t i = 0; i < m; ++i) {
    T* c_row = c + i * ld.ldc;
    for (std::size_t j = 0; j < n; ++j) c_row[j] = beta == T(0) ? T(0) : beta * c_row[j];
    if (trans_b) {  // B is (n, k): C(i, j) += alpha * dot(op(A)(i, :), B(j, :))
      for (std::size_t j = 0; j < n; ++j) {
        T sum = 0;
        for (std::size_t p = 0; p < k; ++p) sum += a_at(i, p) * b[j * ld.ldb + p];
        c_row[j] += alpha * sum;
      }
    } else {  // B is (k, n): C(i, :) += alpha * op(A)(i, p) * B(p, :)
      for (std::size_t p = 0; p < k; ++p) {
        const T s = alpha * a_at(i, p);
        const T* b_row = b + p * ld.ldb;
        for (std::size_t j = 0; j < n; ++j) c_row[j] += s * b_row[j];
      }
    }
  }
}

/// reference_gemm on dense operands (the strides of dense_strides()).
template <class T>
void reference_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                    T alpha, const T* a, const T* b, T beta, T* c) {
  reference_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c,
                 dense_strides(trans_a, trans_b, m, n, k));
}

#ifndef GPIPE_HOST_GEMM_REFERENCE
}  // namespace gpipe::host

namespace gpipe::detail {

// Runs its scope with one OpenMP thread on the calling thread, as oneDNN reads it, and restores
// the caller's setting after.
class SingleComputeThread {
 public:
  SingleComputeThread() : previous_(omp_get_max_threads()) {
    if (previous_ != 1) omp_set_num_threads(1);
  }
  SingleComputeThread(const SingleComputeThread&) = delete;
  SingleComputeThread& operator=(const SingleComputeThread&) = delete;
  ~SingleComputeThread() {
    if (previous_ != 1) omp_set_num_threads(previous_);
  }

 private:
  int previous_;
};

// The two libraries' float GEMMs, k > 0; each runs with the calling thread's OpenMP setting
// (host::gemm sets it to one thread around them).
inline void onednn_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                         float alpha, const float* a, const float* b, float beta, float* c,
                         host::GemmStrides ld) {
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', static_cast<dnnl_dim_t>(m),
                 static_cast<dnnl_dim_t>(n), static_cast<dnnl_dim_t>(k), alpha, a,
                 static_cast<dnnl_dim_t>(ld.lda), b, static_cast<dnnl_dim_t>(ld.ldb), beta, c,
                 static_cast<dnnl_dim_t>(ld.ldc));
  if (status != dnnl_success)
    throw Error("gpipe: oneDNN sgemm failed (status " + std::to_string(static_cast<int>(status)) +
                ") for m = " + std::to_string(m) + ", n = " + std::to_string(n) +
                ", k = " + std::to_string(k));
}

inline void openblas_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                           float alpha, const float* a, const float* b, float beta, float* c,
                           host::GemmStrides ld) {
  const OpenBlas* blas = OpenBlas::get();
  if (blas == nullptr) throw Error("gpipe: OpenBLAS (libopenblas.so.0) is not loaded");
  for (std::size_t v : {m, n, k, ld.lda, ld.ldb, ld.ldc})
    if (v > static_cast<std::size_t>(INT_MAX))
      throw Error("gpipe: OpenBLAS takes GEMM sizes and strides up to " + std::to_string(INT_MAX) +
                  ", got " + std::to_string(v));
  blas->sgemm(OpenBlas::row_major, trans_a ? OpenBlas::trans : OpenBlas::no_trans,
              trans_b ? OpenBlas::trans : OpenBlas::no_trans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(ld.lda), b,
              static_cast<int>(ld.ldb), beta, c, static_cast<int>(ld.ldc));
}

}  // namespace gpipe::detail

namespace gpipe::host {
#endif

/// C(m, n) = alpha op(A) op(B) + beta C, shapes and strides as for reference_gemm; T is float
/// or double. float goes through the library gemm_library() names (throws `gpipe::Error` if it
/// fails) unless the build defines GPIPE_HOST_GEMM_REFERENCE; m = 0 or n = 0 leaves C untouched.
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
          const T* a, const T* b, T beta, T* c, GemmStrides ld) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if (m == 0 || n == 0) return;
#ifndef GPIPE_HOST_GEMM_REFERENCE
  if constexpr (std::is_same_v<T, float>) {
    if (k > 0) {
      detail::SingleComputeThread one_thread;  // oneDNN's, and an OpenMP-built OpenBLAS's
      if (gemm_library() == GemmLibrary::openblas)
        return detail::openblas_sgemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, ld);
      return detail::onednn_sgemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, ld);
    }
  }
#endif
  reference_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, ld);
}

/// gemm on dense operands (the strides of dense_strides()).
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
          const T* a, const T* b, T beta, T* c) {
  gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, dense_strides(trans_a, trans_b, m, n, k));
}

/// How gemm() splits a GEMM over a team: C's columns (`by_columns`) or rows cut into blocks.
struct GemmSplit : BlockSplit {
  /// Whether blocks are column ranges of C (op(B)'s columns) or row ranges (op(A)'s rows).
  bool by_columns = true;
};

/// Blocks are whole multiples of this many columns or rows (64 bytes of floats), so that no two
/// threads write one cache line of C and each library call keeps its full register tiles.
inline constexpr std::size_t gemm_split_align = 16;
/// A block is not worth a hand-over below this many multiply-adds: waking a helper and waiting
/// for it costs a third of such a block's GEMM on one core (bench_host_kernels' BM_TeamRun and
/// BM_Gemm; BENCHMARKS.md has the times).
inline constexpr std::size_t gemm_split_min_work = std::size_t{1} << 21;

/// The split gemm() uses for an (m, n, k) GEMM on a team of `threads`: along the longer of C's two
/// dimensions, into at most `threads` blocks of whole multiples of gemm_split_align columns (rows)
/// and at least gemm_split_min_work multiply-adds each (block_split).
constexpr GemmSplit gemm_split(std::size_t m, std::size_t n, std::size_t k, std::size_t threads) {
  const bool by_columns = n >= m;
  const std::size_t extent = by_columns ? n : m, other = by_columns ? m : n;
  GemmSplit split;
  static_cast<BlockSplit&>(split) =
      block_split(extent, other * k, threads, gemm_split_align, gemm_split_min_work);
  split.by_columns = by_columns;
  return split;
}

/// gemm() with C split over `team`'s threads as gemm_split() says (a null team, or a GEMM too
/// small to gain, runs on the calling thread alone). Each block is its own library call, so the
/// result is the library's for each block's shape; every element of C still sums its k products
/// in one call.
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
          const T* a, const T* b, T beta, T* c, GemmStrides ld, Team* team) {
  const GemmSplit split = gemm_split(m, n, k, team == nullptr ? 1 : team->size());
  run_blocks(team, split.by_columns ? n : m, split, [&](std::size_t first, std::size_t count) {
    if (split.by_columns)  // C(:, first..) = op(A) op(B)(:, first..)
      gemm(trans_a, trans_b, m, count, k, alpha, a, trans_b ? b + first * ld.ldb : b + first, beta,
           c + first, ld);
    else  // C(first.., :) = op(A)(first.., :) op(B)
      gemm(trans_a, trans_b, count, n, k, alpha, trans_a ? a + first : a + first * ld.lda, b, beta,
           c + first * ld.ldc, ld);
  });
}

}  // namespace gpipe::host
