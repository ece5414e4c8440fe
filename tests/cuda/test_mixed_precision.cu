// gpipe::MixedBf16 on the CUDA backend (cuda::Bf16Kernels): the conversions' bits against the
// host's definition; the bf16 GEMM (cublasGemmEx) and Linear's fused forward and weight gradient
// (cuBLASLt) against double within the derived bound; a GPT step's loss and gradients against
// the same step in Fp32 within bf16's bound (the derivation is
// tests/runtime/test_mixed_precision.cpp's), and against the host backend's MixedBf16 step;
// remat's recomputation gives the same bits; peak activations equal predict_memory's and half of
// Fp32's; inference and an MLP with MSE against Fp32; packed documents and ignored targets within
// the same bounds. tests/backend/cuda/
// test_mixed_precision_emulated.cpp runs this file on the CPU emulator.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpipe/cuda.cuh"
#include "gpipe/gpipe.hpp"  // the host backend
#include "support/cuda_factory.cuh"
#include "support/models.hpp"

// Named, so that the CUDA tests also compile as one program (tests/CMakeLists.txt).
namespace cuda_mixed_precision {
namespace {

using namespace gpipe;

constexpr double u = 1.0 / 256, e = 1.0 / (1 << 24);
constexpr std::size_t V = 11, T = 4, D = 16, H = 2;
using Emb = Embedding<V, T, D>;
using Block = TransformerBlock<D, H>;
using Head = Linear<D, V, false>;
using Gpt1 = Pipeline<Stage<Emb, Block, Block, LayerNorm<D>, Head>>;
using Gpt2 = Pipeline<Stage<Emb, Block>, Stage<Block, LayerNorm<D>, Head>>;
// Leaf ops and weight GEMMs of the GPT (as in tests/runtime/test_mixed_precision.cpp).
constexpr std::size_t n_ops = 1 + 2 * 10 + 2, n_gemm = 2 * 4 + 1;

struct Batch {
  std::vector<std::int32_t> tokens, targets;
  std::vector<std::int32_t> documents = {};  // empty: one document per sample
};
Batch batch(std::size_t samples, std::uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (std::size_t i = 0; i < samples * T; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(rng.next_u64() % V));
    b.targets.push_back(static_cast<std::int32_t>(rng.next_u64() % V));
  }
  return b;
}

double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

struct StepResult {
  float loss = 0;
  std::vector<std::vector<float>> gradients;
  std::vector<std::string> names;
};
template <class Model, class Backend, class Precision>
StepResult run_step(const Batch& b, std::size_t m, Remat remat = Remat::never) {
  Backend backend(Model::num_stages);
  Trainer<Model, SoftmaxCrossEntropy, Backend, OneFOneB, Precision> trainer(
      backend, {.micro_batches = m, .remat = remat, .seed = 3});
  StepResult out;
  out.loss = b.documents.empty() ? trainer.forward_backward(b.tokens, b.targets)
                                 : trainer.forward_backward(b.tokens, b.targets, b.documents);
  for (const ParameterInfo& info : trainer.parameter_info()) {
    out.names.push_back(info.name);
    out.gradients.push_back(trainer.gradient(info.name));
  }
  return out;
}

// Device memory of `n` T on virtual device 0 of `backend`, filled from / read back to the host.
template <class T>
cuda::Buffer<T> put(cuda::Backend& backend, const std::vector<T>& host) {
  auto buffer = backend.allocate<T>(0, host.size());
  backend.submit(0, {"upload"},
                 [&](cuda::Kernels& k) { k.upload(host.size(), host.data(), buffer.data()); });
  backend.synchronize();
  return buffer;
}
template <class T>
std::vector<T> get(cuda::Backend& backend, const cuda::Buffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  backend.submit(0, {"download"},
                 [&](cuda::Kernels& k) { k.download(host.size(), buffer.data(), host.data()); });
  backend.synchronize();
  return host;
}

}  // namespace

TEST_CASE("Bf16Kernels: conversions round as gpipe::bf16 does, widen exactly") {
  std::vector<float> x;
  for (std::uint32_t bits :
       {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x00008000u,
        0x00018000u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
        0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x00000001u})
    x.push_back(std::bit_cast<float>(bits));
  Rng rng(1);
  for (int i = 0; i < 1000; ++i)
    x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng.next_u64())));
  cuda::Backend backend(1);
  auto dx = put(backend, x);
  auto d16 = backend.allocate<bf16>(0, x.size());
  auto back = backend.allocate<float>(0, x.size());
  backend.submit(0, {"convert"}, [&](cuda::Kernels& k) {
    k.bf16_context().convert(x.size(), dx.data(), d16.data());
    k.bf16_context().convert(x.size(), d16.data(), back.data());
  });
  backend.synchronize();
  const std::vector<bf16> got = get(backend, d16);
  const std::vector<float> wide = get(backend, back);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(std::bit_cast<std::uint32_t>(x[i]));
    CHECK(got[i].bits == bf16(x[i]).bits);
    CHECK(std::bit_cast<std::uint32_t>(wide[i]) == static_cast<std::uint32_t>(got[i].bits) << 16);
  }
}

TEST_CASE("Bf16Kernels: GEMMs of bf16 operands accumulate in float, within the derived bound") {
  // op(A) (m, k) op(B) (k, n), bf16 values; B also as float weights (rounded at use: u
  // relative) or as their bf16 copy (ForwardArgs::compute_params). The result in float has
  // |error| <= (k + 1) e S (S the sum of the products' magnitudes; alpha and beta are powers of
  // two); stored as bf16 it adds u |C|.
  constexpr std::size_t m = 13, n = 9, k = 37;
  Rng rng(2);
  auto values = [&](std::size_t count) {
    std::vector<bf16> v;
    for (std::size_t i = 0; i < count; ++i) v.push_back(bf16(rng.uniform(-2.0f, 2.0f)));
    return v;
  };
  const std::vector<bf16> a = values(m * k);
  const std::vector<bf16> b = values(k * n);
  std::vector<float> bw;  // B as float weights with low bits set (so rounding matters)
  for (const bf16& v : b) bw.push_back(float(v) * (1.0f + 1.0f / 512));
  std::vector<bf16> bw16;
  for (float w : bw) bw16.push_back(bf16(w));
  const std::vector<float> c0(m * n, 0.75f);
  cuda::Backend backend(1);
  auto da = put(backend, a);
  auto db = put(backend, b);
  auto dbw = put(backend, bw);
  auto dbw16 = put(backend, bw16);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int kind = 0; kind < 3; ++kind) {  // B: bf16, float weights, weights' bf16 copy
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(kind);
        // the operands in the transposed layouts (op(A) = A^T reads A as (k, m))
        std::vector<double> ad(m * k), bd(k * n);
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t p = 0; p < k; ++p) ad[i * k + p] = float(a[ta ? p * m + i : i * k + p]);
        const std::vector<bf16>& b_used = kind == 0 ? b : bw16;
        for (std::size_t p = 0; p < k; ++p)
          for (std::size_t j = 0; j < n; ++j)
            bd[p * n + j] = float(b_used[tb ? j * k + p : p * n + j]);
        auto c_float = put(backend, c0);
        std::vector<bf16> c16_host(m * n, bf16(0.75f));
        auto c16 = put(backend, c16_host);
        backend.submit(0, {"gemm"}, [&](cuda::Kernels& fp32) {
          cuda::Bf16Kernels& k16 = fp32.bf16_context();
          if (kind == 1) {
            k16.gemm(ta, tb, m, n, k, 0.5f, da.data(), dbw.data(), 2.0f, c_float.data());
            k16.gemm(ta, tb, m, n, k, 0.5f, da.data(), dbw.data(), 0.0f, c16.data());
          } else {
            const bf16* b16 = kind == 0 ? db.data() : dbw16.data();
            k16.gemm(ta, tb, m, n, k, 0.5f, da.data(), b16, 2.0f, c_float.data());
            k16.gemm(ta, tb, m, n, k, 0.5f, da.data(), b16, 0.0f, c16.data());
          }
        });
        backend.synchronize();
        const std::vector<float> got = get(backend, c_float);
        const std::vector<bf16> got16 = get(backend, c16);
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (std::size_t p = 0; p < k; ++p) {
              ref += ad[i * k + p] * bd[p * n + j];
              mag += std::abs(ad[i * k + p] * bd[p * n + j]);
            }
            const double want = 0.5 * ref + 2.0 * 0.75, want16 = 0.5 * ref;
            CHECK(std::abs(got[i * n + j] - want) <= (k + 2) * e * (0.5 * mag + 1.5));
            CHECK(std::abs(float(got16[i * n + j]) - want16) <=
                  u * std::abs(want16) + (1 + u) * (k + 1) * e * 0.5 * mag);
          }
      }
}

TEST_CASE("Bf16Kernels: Linear's fused forward and weight gradient, within the derived bound") {
  // y = x W^T + b (cuBLASLt, bias epilogue): bf16 x and W (or float W, rounded at use), float
  // products and sums, b added in float, y rounded once: |y - want| <= u |want| + (1 + u)
  // (in + 1) e (S + |b|), S the sum of the products' magnitudes. dW += dy^T x and db += the
  // column sums of dy over two micro-batches (bias-gradient epilogue into scratch, then added):
  // float sums of r terms onto a float start, |error| <= (r + 2) e (S + |start|).
  Rng rng(4);
  auto values = [&](std::size_t count) {
    std::vector<bf16> v;
    for (std::size_t i = 0; i < count; ++i) v.push_back(bf16(rng.uniform(-2.0f, 2.0f)));
    return v;
  };
  auto floats = [&](std::size_t count) {
    std::vector<float> v;
    for (std::size_t i = 0; i < count; ++i) v.push_back(rng.uniform(-1.0f, 1.0f));
    return v;
  };
  const std::size_t shapes[][3] = {{13, 37, 9}, {64, 48, 130}};  // (rows, in, out)
  for (const auto& [rows, in, out] : shapes) {
    for (bool float_weights : {false, true}) {
      CAPTURE(rows);
      CAPTURE(float_weights);
      const std::vector<bf16> x = values(rows * in), w16 = values(out * in);
      std::vector<float> wf;  // float weights with low bits set, so that rounding matters
      for (const bf16& v : w16) wf.push_back(float(v) * (1.0f + 1.0f / 512));
      std::vector<double> w_used;  // the weights the GEMM multiplies: bf16 values
      for (std::size_t i = 0; i < w16.size(); ++i)
        w_used.push_back(float_weights ? float(bf16(wf[i])) : float(w16[i]));
      const std::vector<float> b = floats(out);
      const std::size_t rows2 = rows + 3;
      const std::vector<bf16> g1 = values(rows * out), g2 = values(rows2 * out),
                              x2 = values(rows2 * in);
      const std::vector<float> dw0 = floats(out * in), db0 = floats(out);
      cuda::Backend backend(1);
      auto dx = put(backend, x), dw16 = put(backend, w16), dg1 = put(backend, g1),
           dg2 = put(backend, g2), dx2 = put(backend, x2);
      auto dwf = put(backend, wf), dbias = put(backend, b), gw = put(backend, dw0),
           gb = put(backend, db0);
      auto dy = put(backend, std::vector<bf16>(rows * out, bf16(std::nanf(""))));
      backend.submit(0, {"linear"}, [&](cuda::Kernels& fp32) {
        cuda::Bf16Kernels& k16 = fp32.bf16_context();
        if (float_weights) {
          k16.linear_forward(rows, in, out, dx.data(), dwf.data(), dbias.data(), dy.data());
        } else {
          k16.linear_forward(rows, in, out, dx.data(), dw16.data(), dbias.data(), dy.data());
        }
        k16.linear_backward_weight(rows, in, out, dg1.data(), dx.data(), gw.data(), gb.data());
        k16.linear_backward_weight(rows2, in, out, dg2.data(), dx2.data(), gw.data(), gb.data());
      });
      backend.synchronize();
      const std::vector<bf16> y = get(backend, dy);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t o = 0; o < out; ++o) {
          double want = b[o], mag = 0;
          for (std::size_t i = 0; i < in; ++i) {
            const double product = double(float(x[r * in + i])) * w_used[o * in + i];
            want += product;
            mag += std::abs(product);
          }
          CHECK(std::abs(float(y[r * out + o]) - want) <=
                u * std::abs(want) + (1 + u) * (in + 1) * e * (mag + std::abs(b[o])));
        }
      const std::vector<float> got_w = get(backend, gw), got_b = get(backend, gb);
      const std::size_t terms = rows + rows2;
      for (std::size_t o = 0; o < out; ++o) {
        double want_b = db0[o], mag_b = std::abs(db0[o]);
        for (std::size_t r = 0; r < rows; ++r) want_b += float(g1[r * out + o]);
        for (std::size_t r = 0; r < rows2; ++r) want_b += float(g2[r * out + o]);
        for (std::size_t r = 0; r < rows; ++r) mag_b += std::abs(float(g1[r * out + o]));
        for (std::size_t r = 0; r < rows2; ++r) mag_b += std::abs(float(g2[r * out + o]));
        CHECK(std::abs(got_b[o] - want_b) <= (terms + 2) * e * mag_b);
        for (std::size_t i = 0; i < in; ++i) {
          double want = dw0[o * in + i], mag = std::abs(dw0[o * in + i]);
          for (std::size_t r = 0; r < rows; ++r) {
            const double product = double(float(g1[r * out + o])) * float(x[r * in + i]);
            want += product;
            mag += std::abs(product);
          }
          for (std::size_t r = 0; r < rows2; ++r) {
            const double product = double(float(g2[r * out + o])) * float(x2[r * in + i]);
            want += product;
            mag += std::abs(product);
          }
          CHECK(std::abs(got_w[o * in + i] - want) <= (terms + 2) * e * mag);
        }
      }
    }
  }
}

TEST_CASE("MixedBf16 on CUDA: a GPT step's loss and gradients are Fp32's within bf16's bound") {
  const Batch b = batch(3, 11);
  const StepResult fp32 = run_step<Gpt2, cuda::Backend, Fp32>(b, 3);
  const StepResult bf16 = run_step<Gpt2, cuda::Backend, MixedBf16>(b, 3);
  const StepResult host16 = run_step<Gpt2, host::Backend, MixedBf16>(b, 3);
  CHECK(std::abs(bf16.loss - fp32.loss) <= (n_ops + n_gemm) * u * std::abs(fp32.loss));
  CHECK(std::abs(bf16.loss - host16.loss) <= (n_ops + n_gemm) * u * std::abs(fp32.loss));
  double worst = 0, worst_host = 0;
  REQUIRE(bf16.names == fp32.names);
  for (std::size_t i = 0; i < fp32.names.size(); ++i) {
    CAPTURE(fp32.names[i]);
    const double diff = relative_difference(bf16.gradients[i], fp32.gradients[i]);
    const double diff_host = relative_difference(bf16.gradients[i], host16.gradients[i]);
    CHECK(diff <= (2 * n_ops + n_gemm) * u);
    CHECK(diff > 0);  // bf16 really rounds: the step is not fp32's
    CHECK(diff_host <= (2 * n_ops + n_gemm) * u);
    worst = std::max(worst, diff);
    worst_host = std::max(worst_host, diff_host);
  }
  MESSAGE("loss fp32 " << fp32.loss << ", bf16 " << bf16.loss << ", host bf16 " << host16.loss
                       << "; worst gradient difference from fp32 " << worst << ", from the host's "
                       << "bf16 " << worst_host << " (bound " << (2 * n_ops + n_gemm) * u << ")");
}

TEST_CASE("MixedBf16 on CUDA with documents and ignored targets: Fp32's and the host's, in bound") {
  Batch b = batch(3, 14);
  Rng rng(15);
  std::int32_t id = 0;
  for (std::size_t i = 0; i < b.tokens.size(); ++i) {
    if (rng.next_u64() % 3 == 0) id = static_cast<std::int32_t>(rng.next_u64() % 3);
    b.documents.push_back(id);
    if (rng.next_u64() % 4 == 0) b.targets[i] = -100;
  }
  const StepResult fp32 = run_step<Gpt2, cuda::Backend, Fp32>(b, 3);
  const StepResult bf16 = run_step<Gpt2, cuda::Backend, MixedBf16>(b, 3);
  const StepResult host16 = run_step<Gpt2, host::Backend, MixedBf16>(b, 3);
  const StepResult always = run_step<Gpt2, cuda::Backend, MixedBf16>(b, 3, Remat::always);
  CHECK(std::abs(bf16.loss - fp32.loss) <= (n_ops + n_gemm) * u * std::abs(fp32.loss));
  CHECK(std::abs(bf16.loss - host16.loss) <= (n_ops + n_gemm) * u * std::abs(fp32.loss));
  CHECK(always.loss == bf16.loss);
  REQUIRE(bf16.names == fp32.names);
  for (std::size_t i = 0; i < fp32.names.size(); ++i) {
    CAPTURE(fp32.names[i]);
    CHECK(relative_difference(bf16.gradients[i], fp32.gradients[i]) <= (2 * n_ops + n_gemm) * u);
    CHECK(relative_difference(bf16.gradients[i], host16.gradients[i]) <= (2 * n_ops + n_gemm) * u);
    CHECK(always.gradients[i] == bf16.gradients[i]);
  }
}

TEST_CASE("MixedBf16 on CUDA: remat recomputes the same bits; one stage or two, within bound") {
  const Batch b = batch(3, 12);
  const StepResult never = run_step<Gpt2, cuda::Backend, MixedBf16>(b, 3);
  const StepResult always = run_step<Gpt2, cuda::Backend, MixedBf16>(b, 3, Remat::always);
  const StepResult selective = run_step<Gpt2, cuda::Backend, MixedBf16>(b, 3, Remat::selective);
  CHECK(always.loss == never.loss);
  CHECK(selective.loss == never.loss);
  REQUIRE(always.names == never.names);
  for (std::size_t i = 0; i < never.names.size(); ++i) {
    CAPTURE(never.names[i]);
    CHECK(always.gradients[i] == never.gradients[i]);
    CHECK(selective.gradients[i] == never.gradients[i]);
  }
  const StepResult one = run_step<Gpt1, cuda::Backend, MixedBf16>(b, 3);
  CHECK(std::abs(one.loss - never.loss) <= (n_ops + n_gemm) * u * std::abs(never.loss));
  for (std::size_t i = 0; i < never.names.size(); ++i)
    CHECK(relative_difference(one.gradients[i], never.gradients[i]) <= (2 * n_ops + n_gemm) * u);
}

TEST_CASE("MixedBf16 on CUDA: peak activations are predict_memory's and half of Fp32's") {
  const Batch b = batch(4, 13);
  for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
    CAPTURE(to_string(remat));
    std::size_t peaks[2][2] = {};
    auto measure = [&]<class Precision>(int which) {
      cuda::Backend backend(2);
      Trainer<Gpt2, SoftmaxCrossEntropy, cuda::Backend, OneFOneB, Precision> trainer(
          backend, {.micro_batches = 2, .remat = remat});
      const auto predicted =
          predict_memory<Gpt2, Precision>(trainer.schedule(), b.tokens.size(), remat);
      backend.reset_peak();
      trainer.forward_backward(b.tokens, b.targets);
      for (std::size_t d = 0; d < 2; ++d) {
        CAPTURE(d);
        const MemoryStats stats = backend.memory_stats(d);
        CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
        CHECK(stats.current_of(MemoryKind::parameters) == predicted[d].parameters);
        CHECK(stats.peak <= predicted[d].total_bound());
        peaks[which][d] = stats.peak_of(MemoryKind::activations);
      }
    };
    measure.operator()<Fp32>(0);
    measure.operator()<MixedBf16>(1);
    for (std::size_t d = 0; d < 2; ++d) CHECK(2 * peaks[1][d] == peaks[0][d]);
  }
}

TEST_CASE("MixedBf16 on CUDA: inference and an MLP with MSE against Fp32") {
  const Batch b = batch(3, 14);
  cuda::Backend backend(2);
  Trainer<Gpt2, SoftmaxCrossEntropy, cuda::Backend, GPipe, Fp32> fp32(backend,
                                                                      {.micro_batches = 3});
  Trainer<Gpt2, SoftmaxCrossEntropy, cuda::Backend, GPipe, MixedBf16> bf16(backend,
                                                                           {.micro_batches = 3});
  CHECK(relative_difference(bf16.predict(b.tokens), fp32.predict(b.tokens)) <=
        (n_ops + n_gemm) * u);

  // Model2 of the tests' models: Linear, ReLU, GELU, LayerNorm, a residual, MSE (the bound's
  // count as in tests/runtime/test_mixed_precision.cpp)
  using Mlp = gpipe::test::Model2;
  const std::vector<float> x = gpipe::test::random_inputs(6, Mlp::in_features, 1);
  const std::vector<float> y = gpipe::test::random_inputs(6, Mlp::out_features, 2);
  Trainer<Mlp, MSELoss, cuda::Backend, OneFOneB, Fp32> mlp32(backend, {.micro_batches = 3});
  Trainer<Mlp, MSELoss, cuda::Backend, OneFOneB, MixedBf16> mlp16(backend, {.micro_batches = 3});
  const float l32 = mlp32.forward_backward(x, y), l16 = mlp16.forward_backward(x, y);
  CHECK(std::abs(l16 - l32) <= (11 + 5) * u * std::abs(l32));
  CHECK(l16 != l32);
  for (const ParameterInfo& info : mlp32.parameter_info()) {
    CAPTURE(info.name);
    CHECK(relative_difference(mlp16.gradient(info.name), mlp32.gradient(info.name)) <=
          (2 * 11 + 5) * u);
  }
}

}  // namespace cuda_mixed_precision
