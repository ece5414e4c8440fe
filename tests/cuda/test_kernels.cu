// Every kernel of gpipe::cuda::Kernels against the host backend's kernel on the same random
// inputs: the kernel conformance suite (tests/support/conformance_cuda_kernels.hpp, which
// tests/backend/cuda/test_kernels_emulated.cpp also runs on the CPU emulator), then what only a
// GPU has: cuBLAS GEMMs, TF32, the staged host copies.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
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
