// The CUDA kernels of the Llama family's layers (gpipe/backend/cuda/kernels/rms_norm.cuh and
// llama.cuh), compiled by the host compiler and run on the CPU emulator, against the host
// kernels (backend/host/layers/rms_norm.hpp and llama.hpp): RMSNorm's three ops (one column
// chunk and several), RoPE forward and back with and without document ids (columns past the
// rotated heads untouched), SwiGLU forward and backward; float and bf16. Buffers end at an
// inaccessible page, so a kernel that reads or writes past one faults.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/kernels/llama.cuh"
#include "gpipe/backend/cuda/kernels/rms_norm.cuh"
#include "gpipe/backend/host.hpp"
#include "support/guarded_buffer.hpp"
#include "support/relative_error.hpp"

namespace {

namespace cu = gpipe::cuda;
using gpipe::bf16;
using gpipe::Rng;
using gpipe::test::relative_error;

// Device buffers that end at a guard page.
class Buffers {
 public:
  template <class T>
  T* put(const std::vector<T>& v) {
    buffers_.push_back(std::make_unique<gpipe::test::GuardedBuffer>(v.size() * sizeof(T), 0));
    T* p = static_cast<T*>(buffers_.back()->data());
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  bool intact() const {
    for (const auto& b : buffers_)
      if (!b->tail_intact()) return false;
    return true;
  }

 private:
  std::vector<std::unique_ptr<gpipe::test::GuardedBuffer>> buffers_;
};

template <class T>
std::vector<T> random(std::size_t n, std::uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  Rng rng(seed);
  std::vector<T> out(n);
  for (T& v : out) v = T(rng.uniform(lo, hi));
  return out;
}

template <class T>
std::vector<double> widened(const T* p, std::size_t n) {
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  return out;
}

// float: within float's rounding of the host's double computation; bf16: one rounding apart.
template <class T>
constexpr double tolerance = std::is_same_v<T, float> ? 1e-5 : 2.0 / 256;

template <class T>
void check_rms_norm(std::size_t rows, std::size_t cols) {
  CAPTURE(rows);
  CAPTURE(cols);
  using Host = gpipe::LayerKernels<gpipe::RMSNormOp, gpipe::host::Kernels<T>>;
  gpipe::host::Kernels<T> host;
  const auto x = random<T>(rows * cols, 1), dy = random<T>(rows * cols, 2);
  const auto weight = random<float>(cols, 3, 0.5f, 1.5f);
  std::vector<T> y(rows * cols), dx(rows * cols), stats(2 * rows);
  std::vector<float> dweight = random<float>(cols, 4);
  const std::vector<float> dweight0 = dweight;
  Host::forward(host, rows, cols, 1e-5, x.data(), weight.data(), y.data(), stats.data());
  Host::backward_input(host, rows, cols, x.data(), dy.data(), weight.data(), stats.data(),
                       dx.data());
  Host::backward_weight(host, rows, cols, x.data(), dy.data(), stats.data(), dweight.data());

  Buffers mem;
  const T* dx_ = mem.put(x);
  const T* ddy = mem.put(dy);
  const float* dw = mem.put(weight);
  T* dy_out = mem.put(std::vector<T>(rows * cols, T(std::nanf(""))));
  T* ddx = mem.put(std::vector<T>(rows * cols, T(std::nanf(""))));
  T* dstats = mem.put(std::vector<T>(2 * rows, T(std::nanf(""))));
  float* ddw = mem.put(dweight0);
  std::vector<float> scratch(cu::rms_norm_backward_weight_scratch(rows, cols), std::nanf(""));
  cu::rms_norm_forward(rows, cols, 1e-5, dx_, dw, dy_out, dstats, nullptr);
  cu::rms_norm_backward_input(rows, cols, dx_, ddy, dw, dstats, ddx, nullptr);
  cu::rms_norm_backward_weight(rows, cols, dx_, ddy, dstats, ddw,
                               scratch.empty() ? nullptr : scratch.data(), nullptr);
  REQUIRE_MESSAGE(mem.intact(), "a kernel wrote past a buffer");
  CHECK(relative_error(widened(dy_out, rows * cols), widened(y.data(), rows * cols)) <
        tolerance<T>);
  std::vector<double> got_rstd(rows), want_rstd(rows);
  for (std::size_t r = 0; r < rows; ++r) {  // the stash's encoding is the host's
    got_rstd[r] = gpipe::detail::rstd_of(dstats, r);
    want_rstd[r] = gpipe::detail::rstd_of(stats.data(), r);
  }
  CHECK(relative_error(got_rstd, want_rstd) < 1e-6);
  CHECK(relative_error(widened(ddx, rows * cols), widened(dx.data(), rows * cols)) < tolerance<T>);
  CHECK(relative_error(widened(ddw, cols), widened(dweight.data(), cols)) < 1e-5);
}

// A residual's add fused into RMSNorm, forward and input gradient: bit for bit the add kernel and
// the plain kernels, and within tolerance of the host's fused kernels.
template <class T>
void check_residual_rms_norm(std::size_t rows, std::size_t cols) {
  CAPTURE(rows);
  CAPTURE(cols);
  const std::size_t n = rows * cols;
  using Host = gpipe::LayerKernels<gpipe::RMSNormOp, gpipe::host::Kernels<T>>;
  gpipe::host::Kernels<T> host;
  const auto x = random<T>(n, 11), r = random<T>(n, 12), dy = random<T>(n, 13),
             r_grad = random<T>(n, 14);
  const auto weight = random<float>(cols, 15, 0.5f, 1.5f);
  std::vector<T> host_x = x, y(n), dx(n), stats(2 * rows);
  Host::forward_add(host, rows, cols, 1e-5, host_x.data(), r.data(), weight.data(), y.data(),
                    stats.data());
  Host::backward_input_add(host, rows, cols, host_x.data(), dy.data(), weight.data(), stats.data(),
                           r_grad.data(), dx.data());

  Buffers mem;
  const auto nan = [](std::size_t count) { return std::vector<T>(count, T(std::nanf(""))); };
  T* fused_x = mem.put(x);
  T* plain_x = mem.put(x);
  const T* dr = mem.put(r);
  const T* ddy = mem.put(dy);
  const T* dr_grad = mem.put(r_grad);
  const float* dw = mem.put(weight);
  T *fused_y = mem.put(nan(n)), *plain_y = mem.put(nan(n));
  T *fused_stats = mem.put(nan(2 * rows)), *plain_stats = mem.put(nan(2 * rows));
  T *fused_dx = mem.put(nan(n)), *plain_dx = mem.put(nan(n));
  cu::residual_rms_norm_forward(rows, cols, 1e-5, fused_x, dr, dw, fused_y, fused_stats, nullptr);
  cu::add(n, plain_x, dr, plain_x, nullptr);
  cu::rms_norm_forward(rows, cols, 1e-5, plain_x, dw, plain_y, plain_stats, nullptr);
  cu::residual_rms_norm_backward_input(rows, cols, plain_x, ddy, dw, plain_stats, dr_grad, fused_dx,
                                       nullptr);
  cu::rms_norm_backward_input(rows, cols, plain_x, ddy, dw, plain_stats, plain_dx, nullptr);
  cu::add(n, plain_dx, dr_grad, plain_dx, nullptr);
  REQUIRE_MESSAGE(mem.intact(), "a kernel wrote past a buffer");
  const auto same = [](const T* a, const T* b, std::size_t count) {
    return std::memcmp(a, b, count * sizeof(T)) == 0;
  };
  CHECK(same(fused_x, plain_x, n));
  CHECK(same(fused_y, plain_y, n));
  CHECK(same(fused_stats, plain_stats, 2 * rows));
  CHECK(same(fused_dx, plain_dx, n));
  CHECK(relative_error(widened(fused_x, n), widened(host_x.data(), n)) == 0);  // one add, rounded
  CHECK(relative_error(widened(fused_y, n), widened(y.data(), n)) < tolerance<T>);
  CHECK(relative_error(widened(fused_dx, n), widened(dx.data(), n)) < 2 * tolerance<T>);
}

template <class T>
void check_rope(bool documents, bool transpose) {
  CAPTURE(documents);
  CAPTURE(transpose);
  // 3 samples of 20 tokens, 5 heads of 8 rotated in rows of 50 (10 columns left alone)
  constexpr std::size_t tokens = 20, rows = 3 * tokens, heads = 5, hd = 8, ld = 50;
  const double base = 500000;
  std::vector<std::int32_t> document(rows);
  for (std::size_t r = 0; r < rows; ++r)  // runs of 7 across sample borders, one id again later
    document[r] = static_cast<std::int32_t>(r / 7 % 4);
  const auto x = random<T>(rows * ld, 5);
  std::vector<T> want = x;
  gpipe::host::Kernels<T> host;
  gpipe::LayerKernels<gpipe::RopeOp, gpipe::host::Kernels<T>>::rotate(
      host, rows, tokens, heads, hd, ld, base, documents ? document.data() : nullptr, want.data(),
      transpose);
  Buffers mem;
  T* dx = mem.put(x);
  const std::int32_t* ddoc = documents ? mem.put(document) : nullptr;
  std::vector<float> scratch(cu::rope_scratch(rows), std::nanf(""));
  cu::rope(rows, tokens, heads, hd, ld, base, ddoc, dx, transpose, scratch.data(), nullptr);
  REQUIRE_MESSAGE(mem.intact(), "a kernel wrote past a buffer");
  CHECK(relative_error(widened(dx, rows * ld), widened(want.data(), rows * ld)) < tolerance<T>);
  bool untouched = true;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = heads * hd; c < ld; ++c)
      untouched = untouched && std::memcmp(&dx[r * ld + c], &x[r * ld + c], sizeof(T)) == 0;
  CHECK(untouched);
  // the rotation is orthogonal: rotating back gives x again
  cu::rope(rows, tokens, heads, hd, ld, base, ddoc, dx, !transpose, scratch.data(), nullptr);
  CHECK(relative_error(widened(dx, rows * ld), widened(x.data(), rows * ld)) < 2 * tolerance<T>);
}

template <class T>
void check_swiglu(std::size_t rows, std::size_t F) {
  CAPTURE(rows);
  CAPTURE(F);
  using Host = gpipe::LayerKernels<gpipe::SwiGLUOp, gpipe::host::Kernels<T>>;
  gpipe::host::Kernels<T> host;
  const auto x = random<T>(rows * 2 * F, 6, -6.0f, 6.0f), dy = random<T>(rows * F, 7);
  std::vector<T> y(rows * F), dx(rows * 2 * F);
  Host::forward(host, rows, F, x.data(), y.data());
  Host::backward(host, rows, F, x.data(), dy.data(), dx.data());
  Buffers mem;
  const T* dx_in = mem.put(x);
  const T* ddy = mem.put(dy);
  T* dy_out = mem.put(std::vector<T>(rows * F, T(std::nanf(""))));
  T* ddx = mem.put(std::vector<T>(rows * 2 * F, T(std::nanf(""))));
  cu::swiglu_forward(rows, F, dx_in, dy_out, nullptr);
  cu::swiglu_backward(rows, F, dx_in, ddy, ddx, nullptr);
  REQUIRE_MESSAGE(mem.intact(), "a kernel wrote past a buffer");
  CHECK(relative_error(widened(dy_out, rows * F), widened(y.data(), rows * F)) < tolerance<T>);
  CHECK(relative_error(widened(ddx, rows * 2 * F), widened(dx.data(), rows * 2 * F)) <
        tolerance<T>);
}

}  // namespace

TEST_SUITE("cuda llama kernels, emulated") {
  TEST_CASE_TEMPLATE("RMSNorm's kernels are the host's", T, float, bf16) {
    check_rms_norm<T>(37, 100);
    check_rms_norm<T>(5, 33);
    check_rms_norm<T>(300, 16);  // several row chunks: partial sums added in order
  }
  TEST_CASE_TEMPLATE("a residual's add fused into RMSNorm is the add then RMSNorm, bit for bit", T,
                     float, bf16) {
    check_residual_rms_norm<T>(37, 100);
    check_residual_rms_norm<T>(5, 33);
  }
  TEST_CASE_TEMPLATE("RoPE's kernel is the host's, forward and back, with and without documents", T,
                     float, bf16) {
    for (bool documents : {false, true})
      for (bool transpose : {false, true}) check_rope<T>(documents, transpose);
  }
  TEST_CASE_TEMPLATE("SwiGLU's kernels are the host's", T, float, bf16) {
    check_swiglu<T>(37, 29);
    check_swiglu<T>(4, 256);
  }
}
