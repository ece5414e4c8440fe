// Every kernel of gpipe::cuda::Kernels against the host backend's kernel on the same random
// inputs: the kernel conformance suite (tests/support/conformance_cuda_kernels.hpp, which
// tests/backend/cuda/test_kernels_emulated.cpp also runs on the CPU emulator), then what only a
// GPU has: cuBLAS GEMMs, Linear through cuBLASLt with its bias epilogues, TF32, the staged host
// copies.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/backend/host.hpp"
#include "gpipe/cuda.cuh"
#include "support/conformance_cuda_kernels.hpp"
#include "support/cuda_factory.cuh"
#include "support/reference_model.hpp"

namespace {

using gpipe::Rng;
using gpipe::test::relative_error;
using Kernels = gpipe::cuda::Kernels;

std::vector<float> random(std::size_t n, std::uint64_t seed, float lo = -1, float hi = 1) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}
std::vector<double> wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// One virtual device and helpers to move vectors to and from it. `offset` floats of padding in
// front of each buffer make its data pointer misaligned for 16-byte packs when odd.
class GpuDevice {
 public:
  explicit GpuDevice(gpipe::cuda::BackendOptions options = {}) : backend_(1, std::move(options)) {}

  // A device copy of v, starting `offset` floats into its allocation.
  template <class T>
  T* put(const std::vector<T>& v, std::size_t offset = 0) {
    buffers_.push_back(backend_.allocate<float>(0, (v.size() * sizeof(T) + 3) / 4 + offset + 1));
    T* p = reinterpret_cast<T*>(buffers_.back().data() + offset);
    run([&](Kernels& k) { k.upload(v.size(), v.data(), p); });
    return p;
  }
  // Uninitialized (poisoned with NaN) device memory for n floats.
  float* make(std::size_t n, std::size_t offset = 0) {
    return put(std::vector<float>(n, std::nanf("")), offset);
  }
  template <class T>
  std::vector<T> get(const T* p, std::size_t n) {
    std::vector<T> out(n);
    run([&](Kernels& k) { k.download(n, p, out.data()); });
    return out;
  }
  template <class F>
  void run(F&& f) {
    backend_.submit(0, {"test kernel"}, std::forward<F>(f));
    backend_.synchronize();
  }

 private:
  gpipe::cuda::Backend backend_;
  std::vector<gpipe::cuda::Buffer<float>> buffers_;
};

gpipe::host::Kernels<double> reference;

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(kernels_elementwise, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_bias, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_layer_norm, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_layer_norm_bf16, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_residual_layer_norm, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_loss, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_loss_bf16, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_empty_loss, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_optimizers, GpuDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_embedding, GpuDevice);

TEST_SUITE("cuda kernels") {
  TEST_CASE("GEMM matches the host's in every transposition") {
    GpuDevice dev;
    // (m, n, k), with k = 0 (C = beta C) and shapes of the test models' Linear layers.
    const std::size_t shapes[][3] = {{1, 1, 1}, {10, 16, 6},     {16, 6, 10},     {5, 16, 16},
                                     {3, 7, 0}, {256, 384, 512}, {1000, 10, 1024}};
    for (const auto& [m, n, k] : shapes) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          for (float beta : {0.0f, 1.0f, 0.5f}) {
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(ta);
            CAPTURE(tb);
            CAPTURE(beta);
            const auto a = random(m * k, m * 7 + k), b = random(k * n, n * 11 + k),
                       c0 = random(m * n, m + n);
            float* da = dev.put(a);
            float* db = dev.put(b);
            float* dc = dev.put(c0);
            dev.run([&](Kernels& kk) { kk.gemm(ta, tb, m, n, k, 1.5f, da, db, beta, dc); });
            std::vector<double> ref = wide(c0);
            reference.gemm(ta, tb, m, n, k, 1.5, wide(a).data(), wide(b).data(),
                           static_cast<double>(beta), ref.data());
            // FP32 products and sums of k terms in cuBLAS's order: < 1e-5 of the largest entry
            const std::vector<float> got = dev.get(dc, m * n);
            CHECK(all_finite(got));
            CHECK(relative_error(wide(got), ref) < 1e-5);
          }
        }
      }
    }
  }

  TEST_CASE("TF32 GEMMs are opt-in and within TF32's precision") {
    GpuDevice dev({.tf32 = true});
    const std::size_t m = 512, n = 512, k = 1024;
    const auto a = random(m * k, 1), b = random(k * n, 2);
    float* da = dev.put(a);
    float* db = dev.put(b);
    float* dc = dev.make(m * n);
    dev.run([&](Kernels& kk) { kk.gemm(false, true, m, n, k, 1.0f, da, db, 0.0f, dc); });
    std::vector<double> ref(m * n);
    reference.gemm(false, true, m, n, k, 1.0, wide(a).data(), wide(b).data(), 0.0, ref.data());
    // 10-bit mantissas in the products: about 1e-3 relative per product, averaging down
    CHECK(relative_error(wide(dev.get(dc, m * n)), ref) < 5e-3);
  }

  TEST_CASE("Linear's fused forward and weight gradient match the host's") {
    GpuDevice dev;
    // (rows, in, out): single elements, odd sizes, the test models' widths; every pointer one
    // float off 16-byte alignment when offset is 1 (the heuristic is told the real alignment).
    const std::size_t shapes[][3] = {
        {1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 256, 384}, {200, 48, 130}};
    for (const auto& [rows, in, out] : shapes) {
      for (std::size_t offset : {0u, 1u}) {
        CAPTURE(rows);
        CAPTURE(in);
        CAPTURE(out);
        CAPTURE(offset);
        const auto x = random(rows * in, rows + in), w = random(out * in, out * 3 + in),
                   b = random(out, out + 5);
        float* dx = dev.put(x, offset);
        float* dw = dev.put(w, offset);
        std::vector<double> ref(rows * out);
        reference.gemm(false, true, rows, out, in, 1.0, wide(x).data(), wide(w).data(), 0.0,
                       ref.data());
        reference.bias_add(rows, out, wide(b).data(), ref.data());
        // the bias at `offset` (less than 16-byte aligned: the GEMM and the bias pass instead of
        // the epilogue) and aligned
        for (float* dbias : {dev.put(b, offset), dev.put(b)}) {
          float* dy = dev.make(rows * out, offset);  // NaN: overwritten, never read
          dev.run([&](Kernels& k) { k.linear_forward(rows, in, out, dx, dw, dbias, dy); });
          // FP32 products and sums of `in` terms in cuBLASLt's order, b added once
          CHECK(relative_error(wide(dev.get(dy, rows * out)), ref) < 1e-5);
        }

        // the weight gradient of two micro-batches (rows and rows + 3), accumulated onto
        // existing gradients: dW += dy^T x, db += the column sums of dy
        const std::size_t rows2 = rows + 3;
        const auto g1 = random(rows * out, 71 + rows), g2 = random(rows2 * out, 72 + rows),
                   x2 = random(rows2 * in, 73 + in), dw0 = random(out * in, 74),
                   db0 = random(out, 75);
        float* dg1 = dev.put(g1, offset);
        float* dg2 = dev.put(g2, offset);
        float* dx2 = dev.put(x2, offset);
        auto weight_gradient = [&] {
          float* gw = dev.put(dw0, offset);
          float* gb = dev.put(db0, offset);
          dev.run([&](Kernels& k) {
            k.linear_backward_weight(rows, in, out, dg1, dx, gw, gb);
            k.linear_backward_weight(rows2, in, out, dg2, dx2, gw, gb);
          });
          return std::pair{dev.get(gw, out * in), dev.get(gb, out)};
        };
        const auto [got_w, got_b] = weight_gradient();
        std::vector<double> ref_w = wide(dw0), ref_b = wide(db0);
        reference.gemm(true, false, out, in, rows, 1.0, wide(g1).data(), wide(x).data(), 1.0,
                       ref_w.data());
        reference.gemm(true, false, out, in, rows2, 1.0, wide(g2).data(), wide(x2).data(), 1.0,
                       ref_w.data());
        reference.bias_grad(rows, out, wide(g1).data(), ref_b.data());
        reference.bias_grad(rows2, out, wide(g2).data(), ref_b.data());
        CHECK(relative_error(wide(got_w), ref_w) < 1e-5);
        CHECK(relative_error(wide(got_b), ref_b) < 1e-5);
        // deterministic: the same inputs give the same bits
        const auto [again_w, again_b] = weight_gradient();
        CHECK(again_w == got_w);
        CHECK(again_b == got_b);
      }
    }
  }

  TEST_CASE("the input gradient through GELUTanh and a Linear is one GEMM, in both precisions") {
    GpuDevice dev;
    constexpr double a = 0.044715, c = 0.79788456080286535588;
    const auto gelu_derivative = [&](double v) {
      const double th = std::tanh(c * (v + a * v * v * v));
      return 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * c * (1 + 3 * a * v * v);
    };
    // (rows, in, out): dx (rows, in) = (dy (rows, out) W (out, in)) * GELU'(pre (rows, in)); in
    // a multiple of 8 (the auxiliary matrix's leading dimension), and one that is not (declined)
    const std::size_t shapes[][3] = {{1, 8, 8}, {33, 64, 24}, {64, 384, 256}, {7, 12, 5}};
    for (const auto& [rows, in, out] : shapes) {
      for (bool bf16 : {false, true}) {
        CAPTURE(rows);
        CAPTURE(in);
        CAPTURE(bf16);
        // bf16-exact inputs, so that one double reference serves both precisions
        auto exact = [&](std::vector<float> v) {
          for (float& f : v) f = static_cast<float>(gpipe::bf16(f));
          return v;
        };
        const auto dy = exact(random(rows * out, rows + out)), w = exact(random(out * in, 3 * in)),
                   pre = exact(random(rows * in, 5 + rows, -3, 3));
        // float arrays, or bf16 ones in buffers of as many floats (the rest unused)
        auto put = [&](const std::vector<float>& v) {
          float* p = dev.make(v.size());
          dev.run([&](Kernels& k) {
            if (bf16)
              k.bf16_context().upload(v.size(), v.data(), reinterpret_cast<gpipe::bf16*>(p));
            else
              k.upload(v.size(), v.data(), p);
          });
          return p;
        };
        float *pdy = put(dy), *pw = put(w), *ppre = put(pre), *pdx = dev.make(rows * in);
        bool done = false;
        using B16 = gpipe::bf16;
        dev.run([&](Kernels& k) {
          if (bf16)
            done = k.bf16_context().linear_backward_input_gelu_tanh(
                rows, in, out, reinterpret_cast<const B16*>(pdy), reinterpret_cast<const B16*>(pw),
                reinterpret_cast<const B16*>(ppre), reinterpret_cast<B16*>(pdx));
          else
            done = k.linear_backward_input_gelu_tanh(rows, in, out, pdy, pw, ppre, pdx);
        });
        CHECK(done == (in % 8 == 0));
        std::vector<float> got(rows * in);
        dev.run([&](Kernels& k) {
          if (bf16)
            k.bf16_context().download(got.size(), reinterpret_cast<const B16*>(pdx), got.data());
          else
            k.download(got.size(), pdx, got.data());
        });
        if (!done) {
          CHECK(!all_finite(got));  // declined: nothing written
          continue;
        }
        std::vector<double> ref(rows * in);
        reference.gemm(false, false, rows, in, out, 1.0, wide(dy).data(), wide(w).data(), 0.0,
                       ref.data());
        for (std::size_t i = 0; i < ref.size(); ++i) ref[i] *= gelu_derivative(pre[i]);
        // FP32 sums of `out` products: < 1e-5; bf16 rounds each result once (2^-9)
        CHECK(relative_error(wide(got), ref) < (bf16 ? 4e-3 : 1e-5));
      }
    }
  }

  TEST_CASE("Linear's fused forward runs in TF32 only where the backend allows it") {
    const std::size_t rows = 64, in = 1024, out = 96;
    const auto x = random(rows * in, 5), w = random(out * in, 6), b = random(out, 7);
    std::vector<double> ref(rows * out);
    reference.gemm(false, true, rows, out, in, 1.0, wide(x).data(), wide(w).data(), 0.0,
                   ref.data());
    reference.bias_add(rows, out, wide(b).data(), ref.data());
    for (bool tf32 : {false, true}) {
      CAPTURE(tf32);
      GpuDevice dev({.tf32 = tf32});
      float* dx = dev.put(x);
      float* dw = dev.put(w);
      float* dbias = dev.put(b);
      float* dy = dev.make(rows * out);
      dev.run([&](Kernels& k) { k.linear_forward(rows, in, out, dx, dw, dbias, dy); });
      // FP32: < 1e-5; TF32's 10-bit mantissas: about 1e-3 relative per product
      CHECK(relative_error(wide(dev.get(dy, rows * out)), ref) < (tf32 ? 5e-3 : 1e-5));
    }
  }

  TEST_CASE("upload and download round-trip any size, through several staging blocks") {
    GpuDevice dev;
    // 40 MB: ten 4 MiB staging blocks, more than the eight a device keeps, so some are reused
    // once their copy has finished.
    const std::size_t n = 10'000'000;
    std::vector<std::int32_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(i * 2654435761u);
    const std::int32_t* d = dev.put(v, 1);
    CHECK(dev.get(d, n) == v);
  }
}
