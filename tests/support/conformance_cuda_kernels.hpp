#pragma once
// Backend conformance for kernels: every kernel of a CUDA kernel context against the host
// backend's kernel on the same random inputs. host::Kernels<double> on the inputs widened to
// double is the reference, and each op states its bound on
//   max |device - reference| / max |reference|     (relative_error, support/reference_model.hpp)
// Shapes cover the 16-byte packed paths and the scalar ones (odd sizes, pointers one float off
// alignment), one- and two-pass column sums, and sizes past one block of staging memory. The
// bf16 kernels (gpipe::MixedBf16: LayerNorm, the losses) read and write bf16 arrays: each result
// is a float result within the float kernel's bound, rounded once (bf16_error).
//
// Instantiated with a device type (tests/cuda/test_kernels.cu: gpipe::cuda::Kernels on a GPU;
// tests/backend/cuda/test_kernels_emulated.cpp: the same kernels under tests/support/
// cuda_emulation/device.hpp), which provides
//   Device dev;                       one device
//   T* dev.put(std::vector<T>, offset)  a device copy, `offset` floats into its allocation
//   float* dev.make(n, offset)        n floats of device memory, poisoned with NaN
//   std::vector<T> dev.get(p, n)      a host copy
//   dev.run(f)                        f(kernels), then waits for the device; kernels.stream()
//                                     is the stream its launchers use (for kernels called
//                                     directly, such as the streaming LayerNorm), and
//                                     kernels.bf16_context() the bf16 context (its stream(),
//                                     softmax_cross_entropy, mse and LayerNorm's kernels)
// and invoked as TEST_CASE_TEMPLATE_INVOKE(kernels_elementwise, Device) etc. (the ids below).

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/kernels/layer_norm.cuh"
#include "gpipe/backend/host.hpp"
#include "gpipe/model/layer.hpp"
#include "support/layer_kernels.hpp"
#include "support/reference_model.hpp"

namespace gpipe::test::conformance {

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1,
                                        float hi = 1) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}
inline std::vector<double> wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// bf16 arrays (gpipe::MixedBf16's activations): floats rounded to bf16, the floats they hold, a
// NaN-poisoned output.
inline constexpr double bf16_u = 1.0 / 256;  // bf16's unit roundoff: |bf16(x) - x| <= u |x|
inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out;
  for (const float x : v) out.push_back(bf16(x));
  return out;
}
inline std::vector<float> widened(const std::vector<bf16>& v) { return {v.begin(), v.end()}; }
inline std::vector<double> wide(const std::vector<bf16>& v) { return {v.begin(), v.end()}; }
inline std::vector<bf16> bf16_nan(std::size_t n) {
  return std::vector<bf16>(n, bf16::from_bits(0x7fc0));
}
inline std::vector<std::uint16_t> bits(const std::vector<bf16>& v) {
  std::vector<std::uint16_t> out;
  for (const bf16 x : v) out.push_back(x.bits);
  return out;
}
// max_i |got_i - ref_i| / (u |ref_i| + (1 + u) bound max|ref|): at most 1 where each element is
// a float within bound max|ref| of the reference, rounded once to bf16 (NaN where any is NaN).
inline double bf16_error(const std::vector<bf16>& got, const std::vector<double>& ref,
                         double bound) {
  double scale = 0, worst = 0;
  for (const double r : ref) scale = std::max(scale, std::abs(r));
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(static_cast<double>(float(got[i])) - ref[i]);
    const double allowed = bf16_u * std::abs(ref[i]) + (1 + bf16_u) * bound * scale;
    if (std::isnan(err)) return err;
    worst = std::max(worst, allowed > 0 ? err / allowed : err > 0 ? INFINITY : 0.0);
  }
  return worst;
}

// The double-precision reference of every kernel.
inline host::Kernels<double> kernel_reference;

// The elementwise cases' largest size: millions of elements on a GPU; on the emulator, which
// runs a kernel's threads one after another, a tenth (still hundreds of blocks and a ragged tail:
// the same paths of the kernels and launchers).
#ifdef GPIPE_CUDA_EMULATION
inline constexpr std::size_t large_elementwise = 300001;
#else
inline constexpr std::size_t large_elementwise = 3000001;
#endif

}  // namespace gpipe::test::conformance

TEST_CASE_TEMPLATE_DEFINE("elementwise kernels match the host's", Device, kernels_elementwise) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{1000},
                              std::size_t{65537}, large_elementwise}) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(n);
      CAPTURE(offset);
      const auto x = random_floats(n, n + 1, -3, 3), g = random_floats(n, n + 2);
      float* dx = dev.put(x, offset);
      float* dg = dev.put(g, offset);
      float* out = dev.make(n, offset);
      std::vector<double> ref(n);

      // relu forward and backward: exact
      dev.run(
          [&](auto& k) { gpipe::test::layer_kernels<gpipe::ReluOp>(k).forward(k, n, dx, out); });
      gpipe::test::layer_kernels<gpipe::ReluOp>(kernel_reference)
          .forward(kernel_reference, n, wide(x).data(), ref.data());
      CHECK(relative_error(wide(dev.get(out, n)), ref) == 0);
      dev.run([&](auto& k) {
        gpipe::test::layer_kernels<gpipe::ReluOp>(k).backward(k, n, dx, dg, out);
      });
      gpipe::test::layer_kernels<gpipe::ReluOp>(kernel_reference)
          .backward(kernel_reference, n, wide(x).data(), wide(g).data(), ref.data());
      CHECK(relative_error(wide(dev.get(out, n)), ref) == 0);

      // GELU forward and backward: erff and expf are within 2 ulp
      dev.run(
          [&](auto& k) { gpipe::test::layer_kernels<gpipe::GeluOp>(k).forward(k, n, dx, out); });
      gpipe::test::layer_kernels<gpipe::GeluOp>(kernel_reference)
          .forward(kernel_reference, n, wide(x).data(), ref.data());
      CHECK(relative_error(wide(dev.get(out, n)), ref) < 1e-6);
      dev.run([&](auto& k) {
        gpipe::test::layer_kernels<gpipe::GeluOp>(k).backward(k, n, dx, dg, out);
      });
      gpipe::test::layer_kernels<gpipe::GeluOp>(kernel_reference)
          .backward(kernel_reference, n, wide(x).data(), wide(g).data(), ref.data());
      CHECK(relative_error(wide(dev.get(out, n)), ref) < 2e-6);

      // add, accumulate (one rounding each, as on the host: exact against host float)
      std::vector<float> host(n);
      dev.run([&](auto& k) { k.add(n, dx, dg, out); });
      gpipe::host::add(n, x.data(), g.data(), host.data());
      CHECK(dev.get(out, n) == host);
      dev.run([&](auto& k) { k.add(n, out, dg, out); });  // y aliases a
      gpipe::host::add(n, host.data(), g.data(), host.data());
      CHECK(dev.get(out, n) == host);
      dev.run([&](auto& k) { k.accumulate(n, dx, out); });
      gpipe::host::accumulate(n, x.data(), host.data());
      CHECK(dev.get(out, n) == host);

      // copy, fill: exact
      dev.run([&](auto& k) { k.copy(n, dg, out); });
      CHECK(dev.get(out, n) == g);
      dev.run([&](auto& k) { k.fill(n, 0.25f, out); });
      CHECK(dev.get(out, n) == std::vector<float>(n, 0.25f));

      // scale (one rounding, as on the host), and the sum of squares in its fixed order: the
      // host's bits exactly (backend/common.hpp), and the double reference's value
      dev.run([&](auto& k) {
        k.copy(n, dx, out);
        k.scale(n, 0.75f, out);
      });
      host = x;
      gpipe::host::scale(n, 0.75f, host.data());
      CHECK(dev.get(out, n) == host);
      float* sum = dev.make(2, 0);  // one double
      dev.run([&](auto& k) { k.sum_of_squares(n, dx, reinterpret_cast<double*>(sum)); });
      const std::vector<float> sum_bits = dev.get(sum, 2);
      double got = 0, expected = 0;
      std::memcpy(&got, sum_bits.data(), sizeof got);
      host::Kernels<float>(0).sum_of_squares(n, x.data(), &expected);
      long double exact = 0;  // 64 bits of mantissa on x86: far below the tolerance
      for (const float v : x) exact += static_cast<long double>(v) * v;
      CHECK(got == expected);
      CHECK(std::abs(static_cast<long double>(got) - exact) <= 1e-12L * exact);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("bias add and bias gradient match the host's", Device, kernels_bias) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  // (rows, cols): packed and scalar rows, one chunk and several (two-pass) column sums.
  const std::size_t shapes[][2] = {{1, 1},     {7, 5},       {64, 256},  {10, 4096},
                                   {5000, 37}, {4096, 1024}, {333, 4097}};
  for (const auto& [rows, cols] : shapes) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(offset);
      const auto y = random_floats(rows * cols, rows + cols), bias = random_floats(cols, cols);
      float* dy = dev.put(y, offset);
      float* dbias = dev.put(bias, offset);

      // bias add: one rounding per element, exact against host float
      dev.run([&](auto& k) { k.bias_add(rows, cols, dbias, dy); });
      std::vector<float> host = y;
      gpipe::host::bias_add(rows, cols, bias.data(), host.data());
      CHECK(dev.get(dy, rows * cols) == host);

      // bias gradient, accumulated onto existing values: float sums of up to 5000 terms in
      // another order, < 1e-5 of the largest column sum
      const auto db0 = random_floats(cols, 99);
      float* db = dev.put(db0, offset);
      dev.run([&](auto& k) { k.bias_grad(rows, cols, dy, db); });
      std::vector<double> ref = wide(db0);
      kernel_reference.bias_grad(rows, cols, wide(host).data(), ref.data());
      CHECK(relative_error(wide(dev.get(db, cols)), ref) < 1e-5);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("LayerNorm forward and backward match the host's", Device,
                          kernels_layer_norm) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  // (rows, cols): the resident kernels' layouts (a warp per row with 1, 2, 4 or 8 packs per
  // thread; a block of 64, 128 or 512 threads per row, the last with idle packs), rows too wide
  // for registers, and (odd cols, offset 1) the streaming kernels' scalar path.
  const std::size_t shapes[][2] = {{1, 1},      {3, 5},       {16, 16},  {9, 256},
                                   {7, 512},    {1000, 1024}, {5, 2048}, {64, 4096},
                                   {17, 12288}, {3, 40000},   {5000, 33}};
  for (const auto& [rows, cols] : shapes) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(offset);
      // An offset mean (|mean| >> std) exercises the variance's cancellation.
      const auto x = random_floats(rows * cols, rows * 31 + cols, 2, 4);
      const auto dy = random_floats(rows * cols, rows * 37 + cols);
      const auto gamma = random_floats(cols, cols + 5, 0.5, 1.5),
                 beta = random_floats(cols, cols + 6);
      float* dx_in = dev.put(x, offset);
      float* ddy = dev.put(dy, offset);
      float* dgamma_in = dev.put(gamma, offset);
      float* dbeta_in = dev.put(beta, offset);

      std::vector<double> ref_y(rows * cols), ref_stats(2 * rows);
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(kernel_reference)
          .forward(kernel_reference, rows, cols, 1e-5, wide(x).data(), wide(gamma).data(),
                   wide(beta).data(), ref_y.data(), ref_stats.data());
      // The launchers (resident kernels where rows fit registers), then the streaming kernels
      // alone on the same shape.
      for (const bool streaming : {false, true}) {
        CAPTURE(streaming);
        float* y = dev.make(rows * cols, offset);  // fresh (NaN) outputs for each kernel
        float* stats = dev.make(2 * rows);
        // forward: float statistics; y and (mean, rstd) within 1e-5
        dev.run([&](auto& k) {
          if (streaming) {
            cuda::layer_norm_forward_streaming(rows, cols, 1e-5, dx_in, dgamma_in, dbeta_in, y,
                                               stats, k.stream());
          } else {
            gpipe::test::layer_kernels<gpipe::LayerNormOp>(k).forward(
                k, rows, cols, 1e-5, dx_in, dgamma_in, dbeta_in, y, stats);
          }
        });
        CHECK(relative_error(wide(dev.get(y, rows * cols)), ref_y) < 1e-5);
        const std::vector<float> got_stats = dev.get(stats, 2 * rows);
        std::vector<double> means, rstds, ref_means, ref_rstds;
        for (std::size_t r = 0; r < rows; ++r) {
          means.push_back(got_stats[2 * r]);
          rstds.push_back(got_stats[2 * r + 1]);
          ref_means.push_back(ref_stats[2 * r]);
          ref_rstds.push_back(ref_stats[2 * r + 1]);
        }
        CHECK(relative_error(means, ref_means) < 1e-6);
        CHECK(relative_error(rstds, ref_rstds) < 1e-5);
      }

      // backward input (from the reference statistics, so that only this op is measured):
      // two row sums in float, < 1e-5
      float* ref_stats_dev = dev.put(std::vector<float>(ref_stats.begin(), ref_stats.end()));
      std::vector<double> ref_dx(rows * cols);
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(kernel_reference)
          .backward_input(kernel_reference, rows, cols, wide(x).data(), wide(dy).data(),
                          wide(gamma).data(), ref_stats.data(), ref_dx.data());
      for (const bool streaming : {false, true}) {
        CAPTURE(streaming);
        float* dx = dev.make(rows * cols, offset);
        dev.run([&](auto& k) {
          if (streaming) {
            cuda::layer_norm_backward_input_streaming(rows, cols, dx_in, ddy, dgamma_in,
                                                      ref_stats_dev, dx, k.stream());
          } else {
            gpipe::test::layer_kernels<gpipe::LayerNormOp>(k).backward_input(
                k, rows, cols, dx_in, ddy, dgamma_in, ref_stats_dev, dx);
          }
        });
        CHECK(relative_error(wide(dev.get(dx, rows * cols)), ref_dx) < 1e-5);
      }

      // backward weight, accumulated: column sums of up to 5000 terms, < 1e-5
      const auto g0 = random_floats(cols, 5), b0 = random_floats(cols, 6);
      float* dgamma = dev.put(g0, offset);
      float* dbeta = dev.put(b0, offset);
      dev.run([&](auto& k) {
        gpipe::test::layer_kernels<gpipe::LayerNormOp>(k).backward_weight(
            k, rows, cols, dx_in, ddy, ref_stats_dev, dgamma, dbeta);
      });
      std::vector<double> ref_dgamma = wide(g0), ref_dbeta = wide(b0);
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(kernel_reference)
          .backward_weight(kernel_reference, rows, cols, wide(x).data(), wide(dy).data(),
                           ref_stats.data(), ref_dgamma.data(), ref_dbeta.data());
      CHECK(relative_error(wide(dev.get(dgamma, cols)), ref_dgamma) < 1e-5);
      CHECK(relative_error(wide(dev.get(dbeta, cols)), ref_dbeta) < 1e-5);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE(
    "bf16 LayerNorm is the float kernels' bits rounded once, within bf16 of "
    "the host's",
    Device, kernels_layer_norm_bf16) {
  // bf16 x and dy (the floats they hold: xw, dyw), read and written as bf16 by the kernels; the
  // same kernels on float copies give the float results that the bf16 ones must round to, bit for
  // bit (the same sums in the same order: the bf16 backward recomputes the forward's mean), and
  // the double reference bounds both. Shapes as for float, and 12 (packs of 4, not of 8); offset
  // 1 puts bf16 rows 4 bytes off their packs (streaming kernels, and the weight gradient's
  // column tiles after a statistics pass).
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  host::Kernels<bf16> host16;
  const std::size_t shapes[][2] = {{1, 1},     {3, 5},      {16, 16},    {9, 256},
                                   {6, 12},    {7, 512},    {300, 1024}, {5, 2048},
                                   {64, 4096}, {17, 12288}, {3, 40000},  {1000, 33}};
  for (const auto& [rows, cols] : shapes) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(offset);
      const std::size_t n = rows * cols;
      const auto x = to_bf16(random_floats(n, rows * 31 + cols, 2, 4));
      const auto dy = to_bf16(random_floats(n, rows * 37 + cols));
      const auto gamma = random_floats(cols, cols + 5, 0.5, 1.5),
                 beta = random_floats(cols, cols + 6);
      bf16* x16 = dev.put(x, offset);
      bf16* dy16 = dev.put(dy, offset);
      float* xw = dev.put(widened(x), offset);
      float* dyw = dev.put(widened(dy), offset);
      float* dgamma_in = dev.put(gamma, offset);
      float* dbeta_in = dev.put(beta, offset);

      std::vector<double> ref_y(n), ref_stats(2 * rows), ref_dx(n);
      const auto ln_ref = gpipe::test::layer_kernels<gpipe::LayerNormOp>(kernel_reference);
      ln_ref.forward(kernel_reference, rows, cols, 1e-5, wide(x).data(), wide(gamma).data(),
                     wide(beta).data(), ref_y.data(), ref_stats.data());
      ln_ref.backward_input(kernel_reference, rows, cols, wide(x).data(), wide(dy).data(),
                            wide(gamma).data(), ref_stats.data(), ref_dx.data());
      std::vector<bf16> host_y(n), host_stash(2 * rows), host_dx(n);
      const auto ln_host = gpipe::test::layer_kernels<gpipe::LayerNormOp>(host16);
      ln_host.forward(host16, rows, cols, 1e-5, x.data(), gamma.data(), beta.data(), host_y.data(),
                      host_stash.data());
      ln_host.backward_input(host16, rows, cols, x.data(), dy.data(), gamma.data(),
                             host_stash.data(), host_dx.data());

      bf16* stash = nullptr;  // the launchers' forward stash, for the weight gradient
      for (const bool streaming : {false, true}) {
        CAPTURE(streaming);
        bf16* y16 = dev.put(bf16_nan(n), offset);
        bf16* stash16 = dev.put(bf16_nan(2 * rows));
        bf16* dx16 = dev.put(bf16_nan(n), offset);
        float* y = dev.make(n, offset);
        float* stats = dev.make(2 * rows);
        float* dx = dev.make(n, offset);
        dev.run([&](auto& k) {
          auto& k16 = k.bf16_context();
          if (streaming) {
            cuda::layer_norm_forward_streaming(rows, cols, 1e-5, x16, dgamma_in, dbeta_in, y16,
                                               stash16, k16.stream());
            cuda::layer_norm_backward_input_streaming(rows, cols, x16, dy16, dgamma_in, stash16,
                                                      dx16, k16.stream());
            cuda::layer_norm_forward_streaming(rows, cols, 1e-5, xw, dgamma_in, dbeta_in, y, stats,
                                               k.stream());
            cuda::layer_norm_backward_input_streaming(rows, cols, xw, dyw, dgamma_in, stats, dx,
                                                      k.stream());
          } else {
            const auto ln16 = gpipe::test::layer_kernels<gpipe::LayerNormOp>(k16);
            ln16.forward(k16, rows, cols, 1e-5, x16, dgamma_in, dbeta_in, y16, stash16);
            ln16.backward_input(k16, rows, cols, x16, dy16, dgamma_in, stash16, dx16);
            const auto ln = gpipe::test::layer_kernels<gpipe::LayerNormOp>(k);
            ln.forward(k, rows, cols, 1e-5, xw, dgamma_in, dbeta_in, y, stats);
            ln.backward_input(k, rows, cols, xw, dyw, dgamma_in, stats, dx);
          }
        });
        if (!streaming) stash = stash16;
        const std::vector<bf16> got_y = dev.get(y16, n), got_dx = dev.get(dx16, n);
        const std::vector<bf16> got_stash = dev.get(stash16, 2 * rows);
        const std::vector<float> float_stats = dev.get(stats, 2 * rows);
        // the float kernels' y and dx rounded once; the stash: their rstd's bits
        CHECK(bits(got_y) == bits(to_bf16(dev.get(y, n))));
        CHECK(bits(got_dx) == bits(to_bf16(dev.get(dx, n))));
        std::vector<double> rstds, ref_rstds, host_rstds;
        for (std::size_t r = 0; r < rows; ++r) {
          const float rstd = std::bit_cast<float>(
              static_cast<std::uint32_t>(got_stash[2 * r].bits) << 16 | got_stash[2 * r + 1].bits);
          CHECK(std::bit_cast<std::uint32_t>(rstd) ==
                std::bit_cast<std::uint32_t>(float_stats[2 * r + 1]));
          rstds.push_back(rstd);
          ref_rstds.push_back(ref_stats[2 * r + 1]);
          host_rstds.push_back(
              std::bit_cast<float>(static_cast<std::uint32_t>(host_stash[2 * r].bits) << 16 |
                                   host_stash[2 * r + 1].bits));
        }
        // against the double reference: the float kernels' bounds (1e-5), then one rounding; the
        // host's bf16 results are roundings of floats as close, so within two roundings
        CHECK(bf16_error(got_y, ref_y, 1e-5) <= 1);
        CHECK(bf16_error(got_dx, ref_dx, 1e-5) <= 1);
        CHECK(relative_error(rstds, ref_rstds) < 1e-5);
        CHECK(relative_error(rstds, host_rstds) < 1e-5);
        CHECK(relative_error(wide(got_y), wide(host_y)) < 2 * bf16_u + 2e-5);
        CHECK(relative_error(wide(got_dx), wide(host_dx)) < 2 * bf16_u + 2e-5);
      }

      // backward weight from the stash, accumulated in float: column sums of up to 1000 terms,
      // < 1e-5 of the double reference's (which takes the exact statistics)
      const auto g0 = random_floats(cols, 5), b0 = random_floats(cols, 6);
      float* dgamma = dev.put(g0, offset);
      float* dbeta = dev.put(b0, offset);
      dev.run([&](auto& k) {
        auto& k16 = k.bf16_context();
        gpipe::test::layer_kernels<gpipe::LayerNormOp>(k16).backward_weight(
            k16, rows, cols, x16, dy16, stash, dgamma, dbeta);
      });
      std::vector<double> ref_dgamma = wide(g0), ref_dbeta = wide(b0);
      ln_ref.backward_weight(kernel_reference, rows, cols, wide(x).data(), wide(dy).data(),
                             ref_stats.data(), ref_dgamma.data(), ref_dbeta.data());
      CHECK(relative_error(wide(dev.get(dgamma, cols)), ref_dgamma) < 1e-5);
      CHECK(relative_error(wide(dev.get(dbeta, cols)), ref_dbeta) < 1e-5);
    }
  }
}

namespace gpipe::test::conformance {

// One shape of kernels_residual_layer_norm in T (float or bf16).
template <class T, class Device>
void check_residual_layer_norm(Device& dev, std::size_t rows, std::size_t cols,
                               std::size_t offset) {
  const std::size_t n = rows * cols;
  const auto as_t = [](const std::vector<float>& v) {
    if constexpr (std::is_same_v<T, float>)
      return v;
    else
      return to_bf16(v);
  };
  const auto t_nan = [](std::size_t count) {
    if constexpr (std::is_same_v<T, float>)
      return std::vector<float>(count, std::nanf(""));
    else
      return bf16_nan(count);
  };
  const auto t_bits = [](const std::vector<T>& v) {
    std::vector<std::uint32_t> out;
    for (const T x : v) {
      if constexpr (std::is_same_v<T, float>)
        out.push_back(std::bit_cast<std::uint32_t>(x));
      else
        out.push_back(x.bits);
    }
    return out;
  };
  // x: a block's output, r: its input (an offset mean, as a residual stream has); dy, and the
  // residual gradient r_grad added to LayerNorm's input gradient
  const std::vector<T> x = as_t(random_floats(n, rows * 41 + cols, -1, 1));
  const std::vector<T> r = as_t(random_floats(n, rows * 43 + cols, 2, 4));
  const std::vector<T> dy = as_t(random_floats(n, rows * 47 + cols));
  const std::vector<T> r_grad = as_t(random_floats(n, rows * 53 + cols));
  const auto gamma = random_floats(cols, cols + 7, 0.5, 1.5), beta = random_floats(cols, cols + 8);
  T* fused_x = dev.put(x, offset);
  T* plain_x = dev.put(x, offset);
  const T* dr = dev.put(r, offset);
  const T* ddy = dev.put(dy, offset);
  const T* dr_grad = dev.put(r_grad, offset);
  const float* dgamma = dev.put(gamma, offset);
  const float* dbeta = dev.put(beta, offset);
  T* fused_y = dev.put(t_nan(n), offset);
  T* plain_y = dev.put(t_nan(n), offset);
  T* fused_stats = dev.put(t_nan(2 * rows));
  T* plain_stats = dev.put(t_nan(2 * rows));
  T* fused_dx = dev.put(t_nan(n), offset);
  T* plain_dx = dev.put(t_nan(n), offset);
  dev.run([&](auto& k) {
    const cudaStream_t s = k.stream();
    cuda::residual_layer_norm_forward(rows, cols, 1e-5, fused_x, dr, dgamma, dbeta, fused_y,
                                      fused_stats, s);
    cuda::add(n, plain_x, dr, plain_x, s);
    cuda::layer_norm_forward(rows, cols, 1e-5, plain_x, dgamma, dbeta, plain_y, plain_stats, s);
    cuda::residual_layer_norm_backward_input(rows, cols, plain_x, ddy, dgamma, plain_stats, dr_grad,
                                             fused_dx, s);
    cuda::layer_norm_backward_input(rows, cols, plain_x, ddy, dgamma, plain_stats, plain_dx, s);
    cuda::add(n, plain_dx, dr_grad, plain_dx, s);
  });
  // bit for bit the add then LayerNorm, and LayerNorm's input gradient then the add
  const std::vector<T> sum = dev.get(fused_x, n);
  CHECK(t_bits(sum) == t_bits(dev.get(plain_x, n)));
  CHECK(t_bits(dev.get(fused_y, n)) == t_bits(dev.get(plain_y, n)));
  CHECK(t_bits(dev.get(fused_stats, 2 * rows)) == t_bits(dev.get(plain_stats, 2 * rows)));
  const std::vector<T> dx = dev.get(fused_dx, n);
  CHECK(t_bits(dx) == t_bits(dev.get(plain_dx, n)));

  // against the double reference: the sum within one rounding of x + r; LayerNorm's output and
  // input gradient from the stored sum, the latter plus r_grad
  std::vector<double> ref_sum(n), ref_y(n), ref_stats(2 * rows), ref_dx(n);
  for (std::size_t i = 0; i < n; ++i)
    ref_sum[i] = static_cast<double>(x[i]) + static_cast<double>(r[i]);
  const std::vector<double> stored(sum.begin(), sum.end());
  const auto ln_ref = gpipe::test::layer_kernels<gpipe::LayerNormOp>(kernel_reference);
  ln_ref.forward(kernel_reference, rows, cols, 1e-5, stored.data(), wide(gamma).data(),
                 wide(beta).data(), ref_y.data(), ref_stats.data());
  ln_ref.backward_input(kernel_reference, rows, cols, stored.data(), wide(dy).data(),
                        wide(gamma).data(), ref_stats.data(), ref_dx.data());
  for (std::size_t i = 0; i < n; ++i) ref_dx[i] += static_cast<double>(r_grad[i]);
  const std::vector<T> y = dev.get(fused_y, n);
  if constexpr (std::is_same_v<T, float>) {
    CHECK(relative_error(wide(sum), ref_sum) < 1e-7);
    CHECK(relative_error(wide(y), ref_y) < 1e-5);
    CHECK(relative_error(wide(dx), ref_dx) < 1e-5);
  } else {
    CHECK(bf16_error(sum, ref_sum, 0) <= 1);
    CHECK(bf16_error(y, ref_y, 1e-5) <= 1);
    // LayerNorm's gradient rounded once before the add, the sum once after
    CHECK(bf16_error(dx, ref_dx, 2 * bf16_u + 1e-5) <= 1);
  }
}

}  // namespace gpipe::test::conformance

TEST_CASE_TEMPLATE_DEFINE(
    "a residual's add fused into LayerNorm is the add then LayerNorm, bit for bit, float and "
    "bf16",
    Device, kernels_residual_layer_norm) {
  // Forward: x = x + r in place, then y and the stats from it; input gradient: LayerNorm's dx
  // plus r. Shapes: the resident kernels' layouts (a warp per row, a block per row), rows too
  // wide for registers and (offset 1) unaligned rows, which take the add and the plain kernels.
  using namespace gpipe::test::conformance;
  Device dev;
  const std::size_t shapes[][2] = {{3, 5}, {9, 256}, {6, 12}, {7, 512}, {5, 2048}, {2, 20000}};
  for (const auto& [rows, cols] : shapes) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(offset);
      check_residual_layer_norm<float>(dev, rows, cols, offset);
      check_residual_layer_norm<gpipe::bf16>(dev, rows, cols, offset);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("softmax cross-entropy and MSE match the host's", Device, kernels_loss) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  // (rows, classes): packed rows (classes % 4 == 0, offset 0) and scalar ones
  const std::size_t shapes[][2] = {{1, 1},     {10, 5},    {2, 4},     {3, 1000},
                                   {4096, 10}, {9, 32768}, {64, 50257}};
  for (const auto& [rows, classes] : shapes) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(rows);
      CAPTURE(classes);
      CAPTURE(offset);
      const auto logits = random_floats(rows * classes, rows + classes, -8, 8);
      std::vector<std::int32_t> targets(rows);
      Rng rng(rows);
      for (auto& t : targets) t = static_cast<std::int32_t>(rng.next_u64() % classes);
      for (std::size_t r = 2; r < rows; r += 3) targets[r] = ignore_index;  // zero rows, no loss
      const float scale = 1.0f / static_cast<float>(rows);
      float* dlogits_in = dev.put(logits, offset);
      std::int32_t* dtargets = dev.put(targets);
      float* dlogits = dev.make(rows * classes, offset);
      float* loss = dev.make(1);

      // gradient within 5e-6 of its largest entry (p = exp(z - logsumexp) in float: the
      // exponent carries the rounding of values up to 16, 2 ulp = 4e-6); the summed loss 1e-5
      dev.run([&](auto& k) {
        k.softmax_cross_entropy(rows, classes, dlogits_in, dtargets, scale, dlogits, loss);
      });
      std::vector<double> ref_d(rows * classes);
      double ref_loss = 0;
      kernel_reference.softmax_cross_entropy(rows, classes, wide(logits).data(), targets.data(),
                                             scale, ref_d.data(), &ref_loss);
      const std::vector<float> got_d = dev.get(dlogits, rows * classes);
      CHECK(relative_error(wide(got_d), ref_d) < 5e-6);
      CHECK(dev.get(loss, 1)[0] == doctest::Approx(ref_loss).epsilon(1e-5));
      bool ignored_rows_zero = true;
      for (std::size_t r = 2; r < rows; r += 3)
        for (std::size_t c = 0; c < classes; ++c)
          ignored_rows_zero = ignored_rows_zero && got_d[r * classes + c] == 0.0f;
      CHECK(ignored_rows_zero);

      // MSE over the same elements: dy = 2 scale (y - t) within 1e-6, loss within 1e-5
      const std::size_t n = rows * classes;
      const auto target = random_floats(n, n + 3);
      float* dtarget = dev.put(target, offset);
      float* dy = dev.make(n, offset);
      dev.run([&](auto& k) { k.mse(n, dlogits_in, dtarget, scale, dy, loss); });
      double ref_mse = 0;
      kernel_reference.mse(n, wide(logits).data(), wide(target).data(), scale, ref_d.data(),
                           &ref_mse);
      CHECK(relative_error(wide(dev.get(dy, n)), ref_d) < 1e-6);
      CHECK(dev.get(loss, 1)[0] == doctest::Approx(ref_mse).epsilon(1e-5));
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("bf16 softmax cross-entropy and MSE read and write bf16, in place or not",
                          Device, kernels_loss_bf16) {
  // bf16 logits (classes a multiple of 8: 16-byte packs; of 4 only, or odd, or offset 1: scalar
  // loads); the gradient written beside the logits and over them (loss_in_place) must be the same
  // bits, each element the float bound of the float kernels' test from the double reference,
  // rounded once; the losses (float, never rounded to bf16) within 1e-5.
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  host::Kernels<bf16> host16;
  const std::size_t shapes[][2] = {{1, 1},     {10, 5},    {2, 4},     {7, 12},    {3, 1000},
                                   {4096, 10}, {9, 32768}, {5, 50304}, {16, 50257}};
  for (const auto& [rows, classes] : shapes) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(rows);
      CAPTURE(classes);
      CAPTURE(offset);
      const std::size_t n = rows * classes;
      const auto logits = to_bf16(random_floats(n, rows + classes, -8, 8));
      std::vector<std::int32_t> targets(rows);
      Rng rng(rows);
      for (auto& t : targets) t = static_cast<std::int32_t>(rng.next_u64() % classes);
      for (std::size_t r = 2; r < rows; r += 3) targets[r] = ignore_index;  // zero rows, no loss
      const float scale = 1.0f / static_cast<float>(rows);
      bf16* z = dev.put(logits, offset);
      bf16* in_place = dev.put(logits, offset);
      bf16* dz = dev.put(bf16_nan(n), offset);
      std::int32_t* dtargets = dev.put(targets);
      float* loss = dev.make(2);
      dev.run([&](auto& k) {
        auto& k16 = k.bf16_context();
        k16.softmax_cross_entropy(rows, classes, z, dtargets, scale, dz, loss);
        k16.softmax_cross_entropy(rows, classes, in_place, dtargets, scale, in_place, loss + 1);
      });
      std::vector<double> ref_d(n);
      double ref_loss = 0;
      kernel_reference.softmax_cross_entropy(rows, classes, wide(logits).data(), targets.data(),
                                             scale, ref_d.data(), &ref_loss);
      std::vector<bf16> host_d(n);
      float host_loss = 0;
      host16.softmax_cross_entropy(rows, classes, logits.data(), targets.data(), scale,
                                   host_d.data(), &host_loss);
      const std::vector<bf16> got = dev.get(dz, n);
      CHECK(bf16_error(got, ref_d, 5e-6) <= 1);
      CHECK(bits(dev.get(in_place, n)) == bits(got));
      CHECK(relative_error(wide(got), wide(host_d)) < 2 * bf16_u + 1e-5);
      const std::vector<float> losses = dev.get(loss, 2);
      CHECK(losses[0] == doctest::Approx(ref_loss).epsilon(1e-5));
      CHECK(losses[1] == losses[0]);
      CHECK(losses[0] == doctest::Approx(host_loss).epsilon(1e-5));

      // MSE of the same bf16 values against float targets: dy within 1e-6, then rounded once
      const auto target = random_floats(n, n + 3);
      float* dtarget = dev.put(target, offset);
      bf16* dy = dev.put(bf16_nan(n), offset);
      bf16* y_in_place = dev.put(logits, offset);
      dev.run([&](auto& k) {
        auto& k16 = k.bf16_context();
        k16.mse(n, z, dtarget, scale, dy, loss);
        k16.mse(n, y_in_place, dtarget, scale, y_in_place, loss + 1);
      });
      double ref_mse = 0;
      kernel_reference.mse(n, wide(logits).data(), wide(target).data(), scale, ref_d.data(),
                           &ref_mse);
      const std::vector<bf16> got_dy = dev.get(dy, n);
      CHECK(bf16_error(got_dy, ref_d, 1e-6) <= 1);
      CHECK(bits(dev.get(y_in_place, n)) == bits(got_dy));
      const std::vector<float> mse_losses = dev.get(loss, 2);
      CHECK(mse_losses[0] == doctest::Approx(ref_mse).epsilon(1e-5));
      CHECK(mse_losses[1] == mse_losses[0]);
    }
  }
  // no rows: a zero loss
  float* loss = dev.put(std::vector<float>{7.0f, 7.0f});
  dev.run([&](auto& k) {
    auto& k16 = k.bf16_context();
    k16.softmax_cross_entropy(0, 5, static_cast<const bf16*>(nullptr), nullptr, 1.0f, nullptr,
                              loss);
    k16.mse(0, static_cast<const bf16*>(nullptr), nullptr, 1.0f, nullptr, loss + 1);
  });
  CHECK(dev.get(loss, 2) == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE_TEMPLATE_DEFINE("an empty loss is zero", Device, kernels_empty_loss) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  float* loss = dev.put(std::vector<float>{7.0f});
  dev.run([&](auto& k) { k.mse(0, nullptr, nullptr, 1.0f, nullptr, loss); });
  CHECK(dev.get(loss, 1)[0] == 0.0f);
}

TEST_CASE_TEMPLATE_DEFINE("SGD and AdamW updates match the host's", Device, kernels_optimizers) {
  using namespace gpipe;
  using namespace gpipe::test;
  using namespace gpipe::test::conformance;
  Device dev;
  for (std::size_t n : {1u, 5u, 1024u, 100003u}) {
    for (std::size_t offset : {0u, 1u}) {
      CAPTURE(n);
      CAPTURE(offset);
      const auto p0 = random_floats(n, 1), g = random_floats(n, 2), s0 = random_floats(n, 3, 0, 1);
      // The same float operations as the host: within 1e-6 of the parameters' scale (the GPU
      // may contract a multiply-add into one rounding).
      for (int variant = 0; variant < 4; ++variant) {
        CAPTURE(variant);
        const double momentum = variant == 0 ? 0.0 : 0.9, dampening = variant == 2 ? 0.1 : 0.0;
        const bool nesterov = variant == 3, first = variant == 1;
        float* p = dev.put(p0, offset);
        float* buf = dev.put(s0, offset);
        float* dg = dev.put(g, offset);
        dev.run([&](auto& k) {
          k.sgd_update(n, p, dg, buf, 0.1, momentum, dampening, 0.01, nesterov, first);
        });
        std::vector<float> hp = p0, hb = s0;
        gpipe::host::sgd_update(n, hp.data(), g.data(), hb.data(), 0.1, momentum, dampening, 0.01,
                                nesterov, first);
        CHECK(relative_error(wide(dev.get(p, n)), wide(hp)) < 1e-6);
        if (momentum != 0) CHECK(relative_error(wide(dev.get(buf, n)), wide(hb)) < 1e-6);
      }
      for (std::size_t step : {1u, 2u, 100u}) {
        CAPTURE(step);
        float* p = dev.put(p0, offset);
        float* m = dev.put(g, offset);
        float* v = dev.put(s0, offset);
        float* dg = dev.put(g, offset);
        dev.run(
            [&](auto& k) { k.adamw_update(n, p, dg, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01, step); });
        std::vector<float> hp = p0, hm = g, hv = s0;
        gpipe::host::adamw_update(n, hp.data(), g.data(), hm.data(), hv.data(), 1e-3, 0.9, 0.999,
                                  1e-8, 0.01, step);
        CHECK(relative_error(wide(dev.get(p, n)), wide(hp)) < 1e-6);
        CHECK(relative_error(wide(dev.get(m, n)), wide(hm)) < 1e-6);
        CHECK(relative_error(wide(dev.get(v, n)), wide(hv)) < 1e-6);
      }
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("Embedding's weight gradient is the host's, bit for bit", Device,
                          kernels_embedding) {
  // The device sorts the rows by id and adds each id's rows in row order: the host's order, so
  // the float sums are equal, not close. Ids: random, all one id (one long run), ids past 2^16
  // (the sort's third digit); rows over several sort chunks and not a whole number of them. With
  // document ids (runs of 1 to 40 rows, ids that come back) the positions restart at each run,
  // T past 256 (two digits of position): forward's gather and dwpe's sums are the host's too.
  using namespace gpipe;
  using namespace gpipe::test::conformance;
  Device dev;
  struct Shape {
    std::size_t rows, tokens, width, vocab;
    bool one_id, documents;
  };
  for (const Shape& s :
       {Shape{4, 4, 3, 7, false, false}, Shape{600, 300, 33, 50, false, false},
        Shape{600, 200, 16, 50, true, false}, Shape{515, 515, 8, 70000, false, false},
        Shape{4, 4, 3, 7, false, true}, Shape{600, 300, 33, 50, false, true},
        Shape{1200, 600, 8, 50, true, true}}) {
    CAPTURE(s.rows);
    CAPTURE(s.vocab);
    CAPTURE(s.one_id);
    CAPTURE(s.documents);
    Rng rng(s.rows + s.vocab);
    std::vector<float> ids(s.rows);
    for (float& id : ids) id = s.one_id ? 3.0f : static_cast<float>(rng.next_u64() % s.vocab);
    std::vector<std::int32_t> documents;
    if (s.documents) {
      std::int32_t id = 0;
      for (std::size_t r = 0; r < s.rows; ++r) {
        if (rng.next_u64() % 40 == 0) id = static_cast<std::int32_t>(rng.next_u64() % 3);
        documents.push_back(id);
      }
    }
    const std::int32_t* host_document = s.documents ? documents.data() : nullptr;
    const std::int32_t* ddocument = s.documents ? dev.put(documents) : nullptr;
    const auto dy = random_floats(s.rows * s.width, 5);
    const auto wte0 = random_floats(s.vocab * s.width, 6),
               wpe0 = random_floats(s.tokens * s.width, 7);
    // float activations
    float* did = dev.put(ids);
    float* ddy = dev.put(dy);
    float* dwte = dev.put(wte0);
    float* dwpe = dev.put(wpe0);
    float* dout = dev.make(s.rows * s.width);
    dev.run([&](auto& k) {
      gpipe::test::layer_kernels<EmbeddingOp>(k).forward(k, s.rows, s.tokens, s.width, did, dwte,
                                                         dwpe, dout, ddocument);
      gpipe::test::layer_kernels<EmbeddingOp>(k).backward_weight(k, s.rows, s.tokens, s.width, did,
                                                                 ddy, dwte, dwpe, ddocument);
    });
    std::vector<float> wte = wte0, wpe = wpe0, out(s.rows * s.width);
    host::Kernels<float> host_k;
    gpipe::test::layer_kernels<EmbeddingOp>(host_k).forward(host_k, s.rows, s.tokens, s.width,
                                                            ids.data(), wte.data(), wpe.data(),
                                                            out.data(), host_document);
    gpipe::test::layer_kernels<EmbeddingOp>(host_k).backward_weight(
        host_k, s.rows, s.tokens, s.width, ids.data(), dy.data(), wte.data(), wpe.data(),
        host_document);
    CHECK(dev.get(dout, out.size()) == out);
    CHECK(dev.get(dwte, wte.size()) == wte);
    CHECK(dev.get(dwpe, wpe.size()) == wpe);
    if (s.vocab > 65536) continue;  // bf16 activations carry ids in 16 bits
    // bf16 activations: ids in the 16 bits, dy rounded to bf16 and widened on load
    std::vector<bf16> ids16(s.rows), dy16(dy.size());
    for (std::size_t r = 0; r < s.rows; ++r)
      ids16[r] = bf16::from_bits(static_cast<std::uint16_t>(ids[r]));
    for (std::size_t i = 0; i < dy.size(); ++i) dy16[i] = bf16(dy[i]);
    bf16* did16 = dev.put(ids16);
    bf16* ddy16 = dev.put(dy16);
    dwte = dev.put(wte0);
    dwpe = dev.put(wpe0);
    dev.run([&](auto& k) {
      auto& k16 = k.bf16_context();
      gpipe::test::layer_kernels<EmbeddingOp>(k16).backward_weight(
          k16, s.rows, s.tokens, s.width, did16, ddy16, dwte, dwpe, ddocument);
    });
    wte = wte0;
    wpe = wpe0;
    host::Kernels<bf16> host16;
    gpipe::test::layer_kernels<EmbeddingOp>(host16).backward_weight(
        host16, s.rows, s.tokens, s.width, ids16.data(), dy16.data(), wte.data(), wpe.data(),
        host_document);
    CHECK(dev.get(dwte, wte.size()) == wte);
    CHECK(dev.get(dwpe, wpe.size()) == wpe);
  }
}
