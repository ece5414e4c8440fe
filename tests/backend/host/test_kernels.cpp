// The host backend's kernels against references written here: the GEMM (the process's library
// for float, oneDNN and OpenBLAS each where installed, reference_gemm for double, and
// reference_gemm for float too), the choice of library from GPIPE_HOST_GEMM, and Linear's fused
// forward against a plain double-precision triple loop for every transpose combination, alpha and
// beta, and odd shapes; the SIMD elementwise kernels against their scalar definitions at every
// length around the pack width (tails), in place where the contract allows; the SIMD exp and tanh
// against double over their whole float range, packs against scalars bit for bit, and the float
// GELUTanh, softmax cross-entropy and attention kernels built on them against double definitions;
// and that a GEMM runs on its caller's thread alone without changing the caller's OpenMP setting;
// and a GEMM split over a Team of threads (gemm_split's blocks) against the same definition.

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels_bf16.hpp"
#include "gpipe/backend/host/layers/activation.hpp"
#include "gpipe/backend/host/layers/attention.hpp"
#include "gpipe/backend/host/layers/gelu_tanh.hpp"
#include "gpipe/backend/host/layers/layer_norm.hpp"
#include "gpipe/backend/host/layers/rms_norm.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/layer_norm.hpp"
#include "gpipe/model/rms_norm.hpp"
#include "support/layer_kernels.hpp"
#include "support/relative_error.hpp"

namespace {

using gpipe::test::relative_error;

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  gpipe::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-1, 1);
  return v;
}

// C = alpha op(A) op(B) + beta C in double, by the definition.
std::vector<double> naive_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k,
                               double alpha, const std::vector<float>& a,
                               const std::vector<float>& b, double beta,
                               const std::vector<float>& c) {
  std::vector<double> out(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::size_t p = 0; p < k; ++p)
        sum += double(ta ? a[p * m + i] : a[i * k + p]) * double(tb ? b[j * k + p] : b[p * n + j]);
      out[i * n + j] = alpha * sum + (beta == 0 ? 0.0 : beta * c[i * n + j]);
    }
  return out;
}

struct Shape {
  std::size_t m, n, k;
};
constexpr Shape shapes[] = {{1, 1, 1},     {3, 5, 7}, {17, 33, 9},
                            {64, 48, 130}, {5, 4, 0}, {32, 1024, 64}};

// Runs gemm (float through gpipe::host::gemm, or reference_gemm<T>) on every case and checks it.
template <class Gemm>
void check_gemm(Gemm gemm, double tolerance) {
  for (const Shape& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f, -0.5f}) {
          INFO("m ", s.m, " n ", s.n, " k ", s.k, " trans_a ", ta, " trans_b ", tb, " beta ", beta);
          const auto a = random_floats(s.m * s.k, 1), b = random_floats(s.k * s.n, 2);
          auto c = random_floats(s.m * s.n, 3);
          // beta == 0 must overwrite C, NaN included.
          if (beta == 0.0f) c.assign(c.size(), std::numeric_limits<float>::quiet_NaN());
          const auto expected = naive_gemm(ta, tb, s.m, s.n, s.k, 1.5, a, b, beta, c);
          gemm(ta, tb, s.m, s.n, s.k, 1.5f, a.data(), b.data(), beta, c.data());
          CHECK(relative_error(c, expected) < tolerance);
        }
}

// k.linear_forward(rows, in, out) against x W^T + b in double, y's NaNs overwritten.
void check_linear_forward(gpipe::host::Kernels<float>& k, std::size_t rows, std::size_t in,
                          std::size_t out) {
  const auto x = random_floats(rows * in, 8), w = random_floats(out * in, 9),
             b = random_floats(out, 10);
  std::vector<float> y(rows * out, std::numeric_limits<float>::quiet_NaN());
  k.linear_forward(rows, in, out, x.data(), w.data(), b.data(), y.data());
  std::vector<float> bias_rows(rows * out);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) bias_rows[r * out + o] = b[o];
  CHECK(relative_error(y, naive_gemm(false, true, rows, out, in, 1.0, x, w, 1.0, bias_rows)) <
        1e-5);
}

template <class T>
std::vector<T> iota_signed(std::size_t n, T scale) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * (T(i % 7) - T(3));  // includes 0
  return v;
}

}  // namespace

TEST_SUITE("backend host kernels") {
  TEST_CASE("float GEMM matches the definition for every transpose, alpha and beta") {
    check_gemm(
        [](auto... args) {
          gpipe::host::Kernels<float> k;
          k.gemm(args...);
        },
        1e-5);
  }

#ifndef GPIPE_HOST_GEMM_REFERENCE
  TEST_CASE("each float GEMM library matches the definition, strided operands included") {
    INFO("this process's choice: ", gpipe::host::gemm_library_description());
    // Each library's sgemm (k > 0) on dense strides; k = 0 is host::gemm's to handle.
    auto dense = [](auto sgemm) {
      return [sgemm](bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                     const float* a, const float* b, float beta, float* c) {
        if (k == 0) return gpipe::host::reference_gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
        sgemm(ta, tb, m, n, k, alpha, a, b, beta, c, gpipe::host::dense_strides(ta, tb, m, n, k));
      };
    };
    check_gemm(dense(gpipe::detail::onednn_sgemm), 1e-5);
    if (gpipe::detail::OpenBlas::get() == nullptr) {
      MESSAGE("skipped: OpenBLAS (libopenblas.so.0) is not installed, so only oneDNN was checked");
      return;
    }
    check_gemm(dense(gpipe::detail::openblas_sgemm), 1e-5);
    // A sub-matrix: C's and A's rows longer than their width (leading dimensions of a parent).
    const std::size_t m = 5, n = 6, k = 7, lda = 11, ldc = 9;
    const auto a = random_floats(m * lda, 11), b = random_floats(k * n, 12);
    std::vector<float> c(m * ldc, 2.0f);
    gpipe::detail::openblas_sgemm(false, false, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c.data(),
                                  {lda, n, ldc});
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        double sum = 0;
        for (std::size_t p = 0; p < k; ++p) sum += double(a[i * lda + p]) * double(b[p * n + j]);
        CHECK(std::abs(c[i * ldc + j] - sum) < 1e-5 * (1 + std::abs(sum)));
      }
      for (std::size_t j = n; j < ldc; ++j) CHECK(c[i * ldc + j] == 2.0f);  // untouched
    }
  }

  TEST_CASE("GPIPE_HOST_GEMM chooses the GEMM library, and a bad value is a clear error") {
    using gpipe::host::GemmLibrary;
    CHECK(gpipe::detail::choose_gemm_library("onednn") == GemmLibrary::onednn);
    CHECK_THROWS_WITH_AS(
        gpipe::detail::choose_gemm_library("mkl"),
        doctest::Contains("GPIPE_HOST_GEMM is \"mkl\"; use onednn, openblas or auto"),
        gpipe::Error);
    const gpipe::detail::OpenBlas* blas = gpipe::detail::OpenBlas::get();
    if (blas != nullptr) {
      CHECK(gpipe::detail::choose_gemm_library("openblas") == GemmLibrary::openblas);
    } else {
      CHECK_THROWS_WITH_AS(
          gpipe::detail::choose_gemm_library("openblas"),
          doctest::Contains("libopenblas.so.0 (with cblas_sgemm) cannot be loaded"), gpipe::Error);
    }
    // auto (and unset): OpenBLAS exactly on AMD CPUs it has Zen kernels for, outside sanitizers.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    const bool sanitized = true;
#else
    const bool sanitized = false;
#endif
    const bool zen = gpipe::detail::amd_cpu() && blas != nullptr && blas->core.starts_with("Zen");
    const GemmLibrary expected = zen && !sanitized ? GemmLibrary::openblas : GemmLibrary::onednn;
    CHECK(gpipe::detail::choose_gemm_library(nullptr) == expected);
    CHECK(gpipe::detail::choose_gemm_library("auto") == expected);
    MESSAGE("auto chooses ", std::string(expected == GemmLibrary::openblas ? "OpenBLAS" : "oneDNN"),
            " here (AMD CPU: ", gpipe::detail::amd_cpu(),
            ", OpenBLAS core: ", blas != nullptr ? blas->core : std::string("not installed"), ")");
  }
#endif

  TEST_CASE("gemm_split cuts the longer side of C into aligned blocks, and small GEMMs not") {
    using gpipe::host::gemm_split;
    for (const Shape& s :
         {Shape{256, 1024, 1024}, Shape{1500, 48, 128}, Shape{96, 1030, 128}, Shape{32, 1024, 1024},
          Shape{256, 16, 1024}, Shape{32, 16, 1024}, Shape{8, 8, 8}, Shape{4096, 4096, 0}})
      for (std::size_t threads : {1u, 2u, 3u, 8u}) {
        INFO("m ", s.m, " n ", s.n, " k ", s.k, " threads ", threads);
        const auto split = gemm_split(s.m, s.n, s.k, threads);
        const std::size_t extent = split.by_columns ? s.n : s.m, other = s.m + s.n - extent;
        CHECK(split.by_columns == (s.n >= s.m));
        CHECK(split.parts >= 1);
        CHECK(split.parts <= threads);
        if (split.parts == 1) continue;
        CHECK(split.block % gpipe::host::gemm_split_align == 0);
        CHECK(split.block * (split.parts - 1) < extent);  // every block has columns (rows)
        CHECK(split.block * split.parts >= extent);       // and together they cover C
        CHECK(split.block * other * s.k >= gpipe::host::gemm_split_min_work);
      }
    // The MLP's layers split over two threads; a 32-row head GEMM (0.5 M multiply-adds) does not.
    CHECK(gemm_split(256, 1024, 1024, 2).parts == 2);
    CHECK(gemm_split(32, 1024, 1024, 2).parts == 2);
    CHECK(gemm_split(256, 16, 1024, 2).parts == 2);
    CHECK(gemm_split(32, 16, 1024, 2).parts == 1);
    CHECK(gemm_split(8, 8, 8, 8).parts == 1);
    CHECK(gemm_split(4096, 4096, 0, 8).parts == 1);
  }

  TEST_CASE("a GEMM split over a team matches the definition, strided operands included") {
    // Shapes gemm_split cuts into 2 and 3 blocks, by columns and by rows, the last block shorter;
    // pad > 0 stores every operand inside a wider parent, whose padding must stay untouched.
    for (std::size_t threads : {2u, 3u}) {
      gpipe::host::Team team(threads);
      for (const Shape& s : {Shape{64, 1000, 96}, Shape{1500, 48, 128}, Shape{96, 1030, 128}}) {
        const auto split = gpipe::host::gemm_split(s.m, s.n, s.k, threads);
        REQUIRE(split.parts > 1);
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (std::size_t pad : {0u, 5u}) {
              const float beta = pad == 0 ? 0.0f : -0.5f;
              INFO("threads ", threads, " m ", s.m, " n ", s.n, " k ", s.k, " trans_a ", ta,
                   " trans_b ", tb, " pad ", pad, " parts ", split.parts);
              const auto a = random_floats(s.m * s.k, 1), b = random_floats(s.k * s.n, 2);
              const auto c0 = random_floats(s.m * s.n, 3);
              const gpipe::host::GemmStrides dense =
                  gpipe::host::dense_strides(ta, tb, s.m, s.n, s.k);
              const gpipe::host::GemmStrides ld{dense.lda + pad, dense.ldb + pad, dense.ldc + pad};
              // Each operand's stored rows inside a parent of rows ld long, padding = 7.
              auto embed = [](const std::vector<float>& v, std::size_t cols, std::size_t stride) {
                std::vector<float> parent(v.size() / cols * stride, 7.0f);
                for (std::size_t r = 0; r < v.size() / cols; ++r)
                  std::copy_n(v.begin() + r * cols, cols, parent.begin() + r * stride);
                return parent;
              };
              const auto pa = embed(a, dense.lda, ld.lda), pb = embed(b, dense.ldb, ld.ldb);
              auto pc = embed(c0, s.n, ld.ldc);
              if (beta == 0.0f)  // beta = 0 overwrites C, NaN included
                for (std::size_t r = 0; r < s.m; ++r)
                  std::fill_n(pc.begin() + r * ld.ldc, s.n,
                              std::numeric_limits<float>::quiet_NaN());
              gpipe::host::gemm(ta, tb, s.m, s.n, s.k, 1.5f, pa.data(), pb.data(), beta, pc.data(),
                                ld, &team);
              std::vector<float> c(s.m * s.n);
              bool padding_kept = true;
              for (std::size_t r = 0; r < s.m; ++r) {
                std::copy_n(pc.begin() + r * ld.ldc, s.n, c.begin() + r * s.n);
                for (std::size_t j = s.n; j < ld.ldc; ++j)
                  padding_kept = padding_kept && pc[r * ld.ldc + j] == 7.0f;
              }
              CHECK(padding_kept);
              CHECK(relative_error(c, naive_gemm(ta, tb, s.m, s.n, s.k, 1.5, a, b, beta, c0)) <
                    1e-5);
            }
      }
    }
  }

  TEST_CASE("a kernel context with a team splits its GEMMs and Linear's forward over it") {
    gpipe::host::Team team(2);
    gpipe::host::Kernels<float> k(0, &team);
    CHECK(k.threads() == 2);
    CHECK(gpipe::host::Kernels<float>().threads() == 1);
    const std::size_t rows = 256, in = 512, out = 64;
    REQUIRE(gpipe::host::gemm_split(rows, out, in, 2).parts == 2);
    check_linear_forward(k, rows, in, out);
    const auto y = random_floats(rows * out, 11), w = random_floats(out * in, 9);
    std::vector<float> dx(rows * in, std::numeric_limits<float>::quiet_NaN());
    k.gemm(false, false, rows, in, out, 1.0f, y.data(), w.data(), 0.0f, dx.data());
    CHECK(relative_error(dx, naive_gemm(false, false, rows, in, out, 1.0, y, w, 0.0, dx)) < 1e-5);
  }

  TEST_CASE("a GEMM or Linear forward too small to split runs on a team as on one thread") {
    // The same library call either way (with oneDNN, Linear's fused matmul), whichever library
    // this process uses: a model of small layers gives bit for bit the same step with a team.
    gpipe::host::Team team(2);
    gpipe::host::Kernels<float> k(0, &team), alone;
    for (const auto& [rows, in, out] :
         {std::array<std::size_t, 3>{5, 8, 8}, {64, 64, 256}, {128, 96, 32}, {7, 300, 3}}) {
      CAPTURE(rows);
      CAPTURE(in);
      CAPTURE(out);
      REQUIRE(gpipe::host::gemm_split(rows, out, in, 2).parts == 1);
      const auto x = random_floats(rows * in, 31), w = random_floats(out * in, 32),
                 b = random_floats(out, 33);
      std::vector<float> y(rows * out), y_alone(rows * out), dx(rows * in), dx_alone(rows * in);
      k.linear_forward(rows, in, out, x.data(), w.data(), b.data(), y.data());
      alone.linear_forward(rows, in, out, x.data(), w.data(), b.data(), y_alone.data());
      CHECK(y == y_alone);
      k.gemm(false, false, rows, in, out, 1.0f, y.data(), w.data(), 0.0f, dx.data());
      alone.gemm(false, false, rows, in, out, 1.0f, y.data(), w.data(), 0.0f, dx_alone.data());
      CHECK(dx == dx_alone);
    }
  }

  TEST_CASE("split over a team, every blocked kernel gives the one-thread result bit for bit") {
    // Sizes the context cuts into three blocks (and an odd tail); each kernel's output from a
    // team of three against the same kernel on one thread, which the tests above check.
    gpipe::host::Team team(3);
    gpipe::host::Kernels<float> split(0, &team), alone;
    const std::size_t n = 3 * gpipe::host::Kernels<float>::split_min_elements + 21;
    const std::size_t rows = 3 * 64 + 5, cols = 1024 + 3;  // rows x cols: three row blocks
    REQUIRE(split.split(n, 1).parts == 3);
    REQUIRE(split.split(rows, cols).parts == 3);
    REQUIRE(alone.split(n, 1).parts == 1);
    const auto x = random_floats(std::max(n, rows * cols), 21);
    const auto dy = random_floats(std::max(n, rows * cols), 22);
    const auto params = random_floats(cols, 23);
    // Runs `kernel(context, out)` on both contexts from the same starting `out`; compares.
    auto same = [&](const char* name, std::size_t size, auto kernel) {
      INFO(name);
      std::vector<float> a = random_floats(size, 24), b = a;
      kernel(split, a.data());
      kernel(alone, b.data());
      CHECK(a == b);
    };
    same("relu_forward", n, [&](auto& k, float* out) {
      gpipe::test::layer_kernels<gpipe::ReluOp>(k).forward(k, n, x.data(), out);
    });
    same("relu_backward", n, [&](auto& k, float* out) {
      gpipe::test::layer_kernels<gpipe::ReluOp>(k).backward(k, n, x.data(), dy.data(), out);
    });
    same("gelu_forward", n, [&](auto& k, float* out) {
      gpipe::test::layer_kernels<gpipe::GeluOp>(k).forward(k, n, x.data(), out);
    });
    same("gelu_backward", n, [&](auto& k, float* out) {
      gpipe::test::layer_kernels<gpipe::GeluOp>(k).backward(k, n, x.data(), dy.data(), out);
    });
    same("add", n, [&](auto& k, float* out) { k.add(n, x.data(), dy.data(), out); });
    same("accumulate", n, [&](auto& k, float* out) { k.accumulate(n, x.data(), out); });
    same("copy", n, [&](auto& k, float* out) { k.copy(n, x.data(), out); });
    same("fill", n, [&](auto& k, float* out) { k.fill(n, 0.25f, out); });
    same("bias_add", rows * cols,
         [&](auto& k, float* out) { k.bias_add(rows, cols, params.data(), out); });
    same("sgd_update", n, [&](auto& k, float* out) {
      std::vector<float> buf(n, 0.5f);
      k.sgd_update(n, out, dy.data(), buf.data(), 0.1, 0.9, 0.0, 0.01, true, false);
      std::copy(buf.begin(), buf.end(), out);  // the momentum buffer, which the update writes
    });
    same("adamw_update", n, [&](auto& k, float* out) {
      std::vector<float> m(n, 0.1f), v(n, 0.2f);
      k.adamw_update(n, out, dy.data(), m.data(), v.data(), 1e-3, 0.9, 0.999, 1e-8, 0.01, 3);
      for (std::size_t i = 0; i < n; ++i) out[i] += m[i] + v[i];  // all three written
    });
    const auto gamma = random_floats(cols, 25), beta = random_floats(cols, 26);
    same("layer_norm_forward", rows * cols + 2 * rows, [&](auto& k, float* out) {
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(k).forward(
          k, rows, cols, 1e-5, x.data(), gamma.data(), beta.data(), out, out + rows * cols);
    });
    std::vector<float> stats(2 * rows), y(rows * cols);
    gpipe::test::layer_kernels<gpipe::LayerNormOp>(alone).forward(
        alone, rows, cols, 1e-5, x.data(), gamma.data(), beta.data(), y.data(), stats.data());
    same("layer_norm_backward_input", rows * cols, [&](auto& k, float* out) {
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(k).backward_input(
          k, rows, cols, x.data(), dy.data(), gamma.data(), stats.data(), out);
    });
    same("GELUTanh forward", n, [&](auto& k, float* out) {
      gpipe::LayerKernels<gpipe::GeluTanhOp, gpipe::host::Kernels<float>>::forward(k, n, x.data(),
                                                                                   out);
    });
    same("GELUTanh backward", n, [&](auto& k, float* out) {
      gpipe::LayerKernels<gpipe::GeluTanhOp, gpipe::host::Kernels<float>>::backward(k, n, x.data(),
                                                                                    dy.data(), out);
    });
    // bias_grad in column blocks (each sums its columns over all rows).
    const std::size_t tall = 3 * gpipe::host::Kernels<float>::split_min_elements / 256;
    REQUIRE(split.split(768, tall).parts == 3);
    const auto g = random_floats(tall * 768, 27);
    same("bias_grad", 768, [&](auto& k, float* out) { k.bias_grad(tall, 768, g.data(), out); });
  }

  TEST_CASE("split over a team, the loss, LayerNorm's weight gradient and attention: bit for bit") {
    // As above, against the same kernel on one thread (the tests above and test_token_layers
    // check those against definitions). Each gets sizes a team of three cuts into blocks.
    gpipe::host::Team team(3);
    gpipe::host::Kernels<float> split(0, &team), alone;

    SUBCASE("softmax cross-entropy, in row blocks, its loss summed in row order") {
      const std::size_t rows = 7, classes = 3 * gpipe::host::Kernels<float>::split_min_elements / 6;
      REQUIRE(split.split(rows, classes).parts == 3);
      auto logits = random_floats(rows * classes, 31);
      for (float& z : logits) z *= 20.0f;
      std::vector<std::int32_t> targets(rows);
      for (std::size_t r = 0; r < rows; ++r)
        targets[r] = static_cast<std::int32_t>(r * 7919 % classes);
      std::vector<float> g_split(rows * classes, 1.0f), g_alone(rows * classes, 2.0f);
      float loss_split = 0, loss_alone = 1;
      for (std::size_t step = 0; step < 2; ++step) {  // the second reuses the row buffer
        split.softmax_cross_entropy(rows, classes, logits.data(), targets.data(), 0.125f,
                                    g_split.data(), &loss_split);
        alone.softmax_cross_entropy(rows, classes, logits.data(), targets.data(), 0.125f,
                                    g_alone.data(), &loss_alone);
        CHECK(loss_split == loss_alone);
        CHECK(g_split == g_alone);
      }
    }

    SUBCASE("LayerNorm's weight gradient, in column blocks") {
      const std::size_t rows = 3 * gpipe::host::Kernels<float>::split_min_elements / 96,
                        cols = 96 + 5;
      REQUIRE(split.split(cols, rows).parts == 3);
      const auto x = random_floats(rows * cols, 32), dy = random_floats(rows * cols, 33),
                 gamma = random_floats(cols, 34), beta = random_floats(cols, 35);
      std::vector<float> y(rows * cols), stats(2 * rows);
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(alone).forward(
          alone, rows, cols, 1e-5, x.data(), gamma.data(), beta.data(), y.data(), stats.data());
      auto dgamma_split = random_floats(cols, 36), dbeta_split = random_floats(cols, 37);
      auto dgamma_alone = dgamma_split, dbeta_alone = dbeta_split;  // both accumulate
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(split).backward_weight(
          split, rows, cols, x.data(), dy.data(), stats.data(), dgamma_split.data(),
          dbeta_split.data());
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(alone).backward_weight(
          alone, rows, cols, x.data(), dy.data(), stats.data(), dgamma_alone.data(),
          dbeta_alone.data());
      CHECK(dgamma_split == dgamma_alone);
      CHECK(dbeta_split == dbeta_alone);
    }

    SUBCASE("the attention core, in blocks of (sample, head) pairs") {
      using Attention = gpipe::LayerKernels<gpipe::CausalAttentionOp, gpipe::host::Kernels<float>>;
      const std::size_t tokens = 128, d = 16;
      // (samples, heads, kv_heads): forward, 48 (sample, head) pairs of 2 causal products of
      // T T d / 2 = 2^17 multiply-adds, 8 at least a block (2^21): three blocks; backward, the
      // (sample, kv head) pairs of 5 such products per query head: three blocks of the 48, and
      // two where 2 pairs (24 query heads each) are all there is.
      for (const auto [samples, heads, kv_heads, backward_blocks] :
           {std::array<std::size_t, 4>{4, 12, 12, 3}, std::array<std::size_t, 4>{2, 24, 1, 2}}) {
        CAPTURE(samples);
        const gpipe::AttentionGeometry g{samples,  tokens,    heads,
                                         kv_heads, d,         (heads + 2 * kv_heads) * d,
                                         0,        heads * d, (heads + kv_heads) * d};
        REQUIRE(gpipe::detail::attention_split(3, g, samples * heads, 2).parts == 3);
        REQUIRE(gpipe::detail::attention_split(3, g, samples * kv_heads, 5 * g.group()).parts ==
                backward_blocks);
        const std::size_t rows = samples * tokens, D = heads * d;
        const auto qkv = random_floats(rows * g.ld, 38), dout = random_floats(rows * D, 39);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> o_split(rows * D, nan), lse_split(rows * heads, nan);
        std::vector<float> o_alone = o_split, lse_alone = lse_split;
        Attention::forward(split, g, qkv.data(), o_split.data(), lse_split.data());
        Attention::forward(alone, g, qkv.data(), o_alone.data(), lse_alone.data());
        CHECK(o_split == o_alone);
        CHECK(lse_split == lse_alone);
        std::vector<float> dqkv_split(rows * g.ld, nan), dqkv_alone = dqkv_split;
        std::vector<float> delta_split(rows * heads, nan), delta_alone = delta_split;
        Attention::backward(split, g, qkv.data(), o_alone.data(), lse_alone.data(), dout.data(),
                            dqkv_split.data(), delta_split.data());
        Attention::backward(alone, g, qkv.data(), o_alone.data(), lse_alone.data(), dout.data(),
                            dqkv_alone.data(), delta_alone.data());
        CHECK(dqkv_split == dqkv_alone);
      }
    }
  }

  TEST_CASE("a residual's add fused into LayerNorm or RMSNorm is the add then the norm, exactly") {
    // LayerNorm's (and RMSNorm's) forward_adding_input (x = x + r in place, then forward) and
    // backward_input_adding (dx + r) against ctx.add and the plain ops, in float on one thread
    // and split over a team of three, in double and in bf16 (the sum rounded before it is
    // normalized, LayerNorm's dx rounded before r is added).
    constexpr std::size_t cols = 256;
    const std::size_t rows = 3 * gpipe::host::Kernels<float>::split_min_elements / cols + 5;
    using LN = gpipe::LayerNorm<cols>;
    using RMS = gpipe::RMSNorm<cols>;
    gpipe::host::Team team(3);
    gpipe::host::Kernels<float> split(0, &team), alone;
    REQUIRE(split.split(rows, cols).parts == 3);
    gpipe::host::Kernels<double> wide;
    gpipe::host::Kernels<gpipe::bf16> half;
    auto check = [&](auto& k, auto norm) {
      using T = typename std::remove_reference_t<decltype(k)>::value_type;
      using LN = decltype(norm);
      using P = gpipe::master_t<T>;
      auto values = [&](std::uint64_t seed, float lo, float hi) {
        gpipe::Rng rng(seed);
        std::vector<T> v(rows * cols);
        for (T& x : v) x = T(rng.uniform(lo, hi));
        return v;
      };
      const std::vector<T> x = values(51, -1, 1), r = values(52, 2, 4), dy = values(53, -1, 1),
                           r_grad = values(54, -1, 1);
      std::vector<P> params(LN::num_params);
      gpipe::Rng rng(55);
      for (P& p : params) p = P(rng.uniform(0.5f, 1.5f));
      const auto bits_of = [](const std::vector<T>& v) {
        std::vector<unsigned char> out(v.size() * sizeof(T));
        std::memcpy(out.data(), v.data(), out.size());
        return out;
      };
      std::vector<T> fused_x = x, plain_x = x, fused_y(x.size()), plain_y(x.size()),
                     fused_stats(2 * rows), plain_stats(2 * rows), fused_dx(x.size()),
                     plain_dx(x.size());
      LN::forward_adding_input(
          k, {rows, fused_x.data(), fused_y.data(), params.data(), fused_stats.data()}, r.data());
      k.add(x.size(), plain_x.data(), r.data(), plain_x.data());
      LN::forward(k, {rows, plain_x.data(), plain_y.data(), params.data(), plain_stats.data()});
      CHECK(bits_of(fused_x) == bits_of(plain_x));
      CHECK(bits_of(fused_y) == bits_of(plain_y));
      CHECK(bits_of(fused_stats) == bits_of(plain_stats));
      LN::backward_input_adding(k,
                                {rows, plain_x.data(), dy.data(), fused_dx.data(), params.data(),
                                 plain_stats.data(), nullptr},
                                r_grad.data());
      LN::backward_input(k, {rows, plain_x.data(), dy.data(), plain_dx.data(), params.data(),
                             plain_stats.data(), nullptr});
      k.add(x.size(), plain_dx.data(), r_grad.data(), plain_dx.data());
      CHECK(bits_of(fused_dx) == bits_of(plain_dx));
      // and not the same as leaving the adds out
      LN::backward_input(k, {rows, plain_x.data(), dy.data(), plain_dx.data(), params.data(),
                             plain_stats.data(), nullptr});
      CHECK(bits_of(fused_dx) != bits_of(plain_dx));
    };
    SUBCASE("float, one thread") { check(alone, LN{}); }
    SUBCASE("float, a team of three") { check(split, LN{}); }
    SUBCASE("double") { check(wide, LN{}); }
    SUBCASE("bf16") { check(half, LN{}); }
    SUBCASE("RMSNorm, float, one thread") { check(alone, RMS{}); }
    SUBCASE("RMSNorm, float, a team of three") { check(split, RMS{}); }
    SUBCASE("RMSNorm, double") { check(wide, RMS{}); }
    SUBCASE("RMSNorm, bf16") { check(half, RMS{}); }
  }

  TEST_CASE("reference_gemm matches the definition, in float and in double") {
    check_gemm([](auto... args) { gpipe::host::reference_gemm<float>(args...); }, 1e-5);
    for (const Shape& s : shapes) {
      const auto a = random_floats(s.m * s.k, 4), b = random_floats(s.k * s.n, 5);
      const std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
      std::vector<double> c(s.m * s.n, std::numeric_limits<double>::quiet_NaN());
      gpipe::host::Kernels<double> k;
      k.gemm(false, true, s.m, s.n, s.k, 1.0, ad.data(), bd.data(), 0.0, c.data());
      const auto expected = naive_gemm(false, true, s.m, s.n, s.k, 1.0, a, b, 0.0, {});
      CHECK(relative_error(c, expected) < 1e-14);
    }
  }

  TEST_CASE("linear_forward is x W^T + b, with y overwritten, for any rows") {
    gpipe::host::Kernels<float> k;
    for (std::size_t rows : {0u, 1u, 33u, 64u, 33u}) {  // 33 twice: the cached primitive again
      for (const Shape& s : {Shape{0, 7, 5}, Shape{0, 1024, 16}, Shape{0, 40, 300}}) {
        INFO("rows ", rows, " in ", s.n, " out ", s.k);
        check_linear_forward(k, rows, s.n, s.k);
      }
    }
  }

  TEST_CASE("elementwise kernels match their scalar definitions at every tail length") {
    gpipe::host::Kernels<float> k;
    for (std::size_t n = 0; n <= 37; ++n) {
      CAPTURE(n);
      const auto x = iota_signed<float>(n, 0.5f), dy = random_floats(n, 6);
      std::vector<float> y(n), expected(n);
      gpipe::test::layer_kernels<gpipe::ReluOp>(k).forward(k, n, x.data(), y.data());
      for (std::size_t i = 0; i < n; ++i) expected[i] = x[i] > 0 ? x[i] : 0.0f;
      CHECK(y == expected);
      gpipe::test::layer_kernels<gpipe::ReluOp>(k).backward(k, n, x.data(), dy.data(), y.data());
      for (std::size_t i = 0; i < n; ++i) expected[i] = x[i] > 0 ? dy[i] : 0.0f;
      CHECK(y == expected);
      y = x;  // in place: y = y + dy
      k.add(n, y.data(), dy.data(), y.data());
      for (std::size_t i = 0; i < n; ++i) expected[i] = x[i] + dy[i];
      CHECK(y == expected);
      k.accumulate(n, dy.data(), y.data());
      for (std::size_t i = 0; i < n; ++i) expected[i] += dy[i];
      CHECK(y == expected);
      k.fill(n, 2.5f, y.data());
      CHECK(y == std::vector<float>(n, 2.5f));
      k.copy(n, x.data(), y.data());
      CHECK(y == x);
    }
  }

  TEST_CASE("SIMD exp and tanh: within their error bounds everywhere, packs equal to scalars") {
    namespace simd = gpipe::host::simd;
    double exp_error = 0, tanh_error = 0;
    std::size_t points = 0;
    // every float in [-90, 90] whose exponent step is small: about 2^20 points, dense near 0
    for (float x = -90; x < 90; ++points) {
      const float e = simd::exp(x), t = simd::tanh(x);
      if (x >= -86.9f && x <= 88.72f) {
        const double ref = std::exp(static_cast<double>(x));
        exp_error = std::max(exp_error, std::fabs(e - ref) / ref);
      }
      tanh_error = std::max(tanh_error, std::fabs(t - std::tanh(static_cast<double>(x))));
      const simd::Pack<float> pack = simd::Pack<float>{} + x;
      const auto packed_e = simd::exp(pack), packed_t = simd::tanh(pack);
      for (std::size_t lane = 0; lane < simd::width_v<float>; ++lane) {
        if (packed_e[lane] != e || packed_t[lane] != t) FAIL("a pack differs from scalar at " << x);
      }
      const float step = std::max(std::fabs(x) * 2e-6f, 1e-6f);
      x = std::nextafter(x + step, 100.0f);
    }
    CHECK(points > 100000);
    CHECK(exp_error < 2e-7);
    CHECK(tanh_error < 2e-7);
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(simd::exp(0.0f) == 1.0f);
    CHECK(simd::exp(-87.0f) == 0.0f);
    CHECK(simd::exp(-inf) == 0.0f);
    CHECK(simd::exp(88.8f) == inf);
    CHECK(simd::exp(inf) == inf);
    CHECK(std::isnan(simd::exp(std::numeric_limits<float>::quiet_NaN())));
    CHECK(simd::tanh(0.0f) == 0.0f);
    CHECK(simd::tanh(50.0f) == 1.0f);
    CHECK(simd::tanh(-inf) == -1.0f);
  }

  TEST_CASE("float GELUTanh matches its double definition at every tail length") {
    using Kernels = gpipe::LayerKernels<gpipe::GeluTanhOp, gpipe::host::Kernels<float>>;
    gpipe::host::Kernels<float> k;
    const double c = std::sqrt(2.0 / std::acos(-1.0)), a = 0.044715;
    for (std::size_t n = 0; n <= 37; ++n) {
      CAPTURE(n);
      std::vector<float> x(n), dy = random_floats(n, 8), y(n), dx(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = -6.0f + 12.0f * static_cast<float>(i) / 37.0f;
      Kernels::forward(k, n, x.data(), y.data());
      Kernels::backward(k, n, x.data(), dy.data(), dx.data());
      for (std::size_t i = 0; i < n; ++i) {
        const double v = x[i], th = std::tanh(c * (v + a * v * v * v));
        const double slope = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * c * (1 + 3 * a * v * v);
        CHECK(std::fabs(y[i] - 0.5 * v * (1 + th)) <= 1e-6 * (1 + std::fabs(v)));
        CHECK(std::fabs(dx[i] - dy[i] * slope) <= 1e-6 * (1 + std::fabs(v)));
      }
    }
  }

  TEST_CASE("float softmax cross-entropy matches double, any class count") {
    gpipe::host::Kernels<float> k;
    for (std::size_t classes : {1u, 3u, 4u, 257u, 1027u, 50304u}) {
      CAPTURE(classes);
      const std::size_t rows = 3;
      std::vector<float> logits = random_floats(rows * classes, 9), dlogits(rows * classes);
      for (float& z : logits) z *= 12.0f;
      logits[classes / 2] = 40.0f;  // a dominant class, and a target far below it
      const std::vector<std::int32_t> targets{0, static_cast<std::int32_t>(classes - 1),
                                              static_cast<std::int32_t>(classes / 3)};
      float loss = 0;
      const float scale = 0.25f;
      k.softmax_cross_entropy(rows, classes, logits.data(), targets.data(), scale, dlogits.data(),
                              &loss);
      std::vector<double> expected(rows * classes);
      double expected_loss = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        const float* z = logits.data() + r * classes;
        double max = z[0], sum = 0;
        for (std::size_t c = 0; c < classes; ++c) max = std::max<double>(max, z[c]);
        for (std::size_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
        expected_loss += std::log(sum) + max - z[targets[r]];
        for (std::size_t c = 0; c < classes; ++c)
          expected[r * classes + c] =
              scale * (std::exp(z[c] - max) / sum - (static_cast<std::int32_t>(c) == targets[r]));
      }
      CHECK(std::fabs(loss - expected_loss) <= 1e-6 * std::fabs(expected_loss));
      CHECK(relative_error(dlogits, expected) < 1e-6);
    }
  }

  TEST_CASE("bias kernels broadcast over rows and sum over rows, any width") {
    gpipe::host::Kernels<double> k;
    for (std::size_t cols : {1u, 3u, 4u, 9u}) {
      const std::size_t rows = 3;
      const auto bias = iota_signed<double>(cols, 1.0), y0 = iota_signed<double>(rows * cols, 0.25);
      std::vector<double> y = y0, db(cols, 1.0), expected_y(rows * cols), expected_db(cols, 1.0);
      k.bias_add(rows, cols, bias.data(), y.data());
      k.bias_grad(rows, cols, y0.data(), db.data());
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) {
          expected_y[r * cols + c] = y0[r * cols + c] + bias[c];
          expected_db[c] += y0[r * cols + c];
        }
      CHECK(y == expected_y);
      CHECK(relative_error(db, expected_db) < 1e-15);
    }
  }

#ifndef GPIPE_HOST_GEMM_REFERENCE
  TEST_CASE("a GEMM leaves its caller's OpenMP thread count as it was") {
    std::thread([] {
      omp_set_num_threads(2);
      gpipe::host::Kernels<float> k;
      const auto a = random_floats(64 * 64, 7);
      std::vector<float> c(64 * 64);
      k.gemm(false, false, 64, 64, 64, 1.0f, a.data(), a.data(), 0.0f, c.data());
      CHECK(omp_get_max_threads() == 2);
    }).join();
  }
#endif
}
