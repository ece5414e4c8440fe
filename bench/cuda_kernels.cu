// The CUDA backend's kernels on large tensors (far past the L2 cache), each next to the ceilings
// measured in the same run (bench/support/cuda.cuh):
//   memory-bound kernels   GB/s moved (each input read once, each output written once) and its
//                          share of the device-to-device copy bandwidth (%copy); target >= 70%
//   Linear forward+backward TFLOP/s and x_cublas = its time over the time of the same three
//                          cuBLAS SGEMMs alone (bias add and bias gradient are the difference);
//                          target <= 1.10
//   attention fwd+bwd      TFLOP/s of causal flash attention, bf16 (tensor cores at head size
//                          64) and float; target >= 200 at T 1024, head size 64, bf16 (H200)
//
//   build/<preset>/bench/bench_cuda_kernels --benchmark_min_time=0.05
//
// (On the CUDA emulator, where the tests run it once, the sizes are those of sized()'s second
// argument.)

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "gpipe/cuda.cuh"
#include "support/cuda.cuh"

namespace {

using gpipe::bench::report_bandwidth;
using gpipe::bench::report_flops;
using gpipe::bench::sized;
using gpipe::bench::time_launches;
using gpipe::cuda::Kernels;
// The layers' own kernels (backend/cuda/layers/activation.cuh), as the layers call them.
using Relu = gpipe::LayerKernels<gpipe::ReluOp, Kernels>;
using Gelu = gpipe::LayerKernels<gpipe::GeluOp, Kernels>;
using LayerNorm = gpipe::LayerKernels<gpipe::LayerNormOp, Kernels>;
using LayerNorm16 = gpipe::LayerKernels<gpipe::LayerNormOp, gpipe::cuda::Bf16Kernels>;

constexpr int reps = 10;     // launches per timed iteration
constexpr double f32 = 4.0;  // bytes per element
constexpr double b16 = 2.0;  // bytes per bf16 element
constexpr std::int64_t big = sized(std::int64_t{1} << 26, std::int64_t{4099});  // 256 MiB

gpipe::cuda::Backend& backend() {
  static gpipe::cuda::Backend b(1);
  return b;
}

// Runs f(k) as work on device 0: k enqueues on its compute stream, and f may wait for events.
template <class F>
void on_device(F&& f) {
  backend().submit(0, {"benchmark"}, [&](Kernels& k) { f(k); });
  backend().synchronize();
}

// Device tensors of one benchmark, random in [lo, hi), freed when it ends.
class Tensors {
 public:
  float* make(std::size_t n, float lo = -1, float hi = 1) {
    buffers_.push_back(backend().allocate<float>(0, n));
    float* p = buffers_.back().data();
    on_device([&](Kernels& k) { gpipe::bench::random_fill(n, seed_++, lo, hi, p, k.stream()); });
    return p;
  }
  // n bf16 elements, random in [lo, hi) rounded (gpipe::MixedBf16's activations).
  gpipe::bf16* make_bf16(std::size_t n, float lo = -1, float hi = 1) {
    halves_.push_back(backend().allocate<gpipe::bf16>(0, n));
    gpipe::bf16* p = halves_.back().data();
    float* wide = make(n, lo, hi);
    on_device([&](Kernels& k) { k.bf16_context().convert(n, wide, p); });
    buffers_.pop_back();  // the floats, once converted
    return p;
  }
  std::int32_t* classes(std::size_t rows, std::size_t classes) {
    std::vector<std::int32_t> host(rows);
    for (std::size_t r = 0; r < rows; ++r)
      host[r] = static_cast<std::int32_t>((r * 2654435761u) % classes);
    ints_.push_back(backend().allocate<std::int32_t>(0, rows));
    std::int32_t* p = ints_.back().data();
    on_device([&](Kernels& k) { k.upload(rows, host.data(), p); });
    return p;
  }

 private:
  std::vector<gpipe::cuda::Buffer<float>> buffers_;
  std::vector<gpipe::cuda::Buffer<gpipe::bf16>> halves_;
  std::vector<gpipe::cuda::Buffer<std::int32_t>> ints_;
  std::uint32_t seed_ = 1;
};

// An elementwise op over n elements that reads `reads` tensors and writes `writes`.
template <class Launch>
void elementwise(benchmark::State& state, int reads, int writes, Launch launch) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Tensors t;
  std::vector<float*> p;
  for (int i = 0; i < 3; ++i) p.push_back(t.make(n));
  on_device([&](Kernels& k) {
    const double s =
        time_launches(state, k.stream(), reps, [&] { launch(k, n, p[0], p[1], p[2]); });
    report_bandwidth(state, (reads + writes) * f32 * static_cast<double>(n), s);
  });
}

void BM_copy(benchmark::State& state) {
  elementwise(state, 1, 1,
              [](Kernels& k, std::size_t n, float* a, float*, float* y) { k.copy(n, a, y); });
}
void BM_fill(benchmark::State& state) {
  elementwise(state, 0, 1,
              [](Kernels& k, std::size_t n, float*, float*, float* y) { k.fill(n, 0.5f, y); });
}
void BM_relu_forward(benchmark::State& state) {
  elementwise(state, 1, 1, [](Kernels& k, std::size_t n, float* x, float*, float* y) {
    Relu::forward(k, n, x, y);
  });
}
void BM_relu_backward(benchmark::State& state) {
  elementwise(state, 2, 1, [](Kernels& k, std::size_t n, float* x, float* dy, float* dx) {
    Relu::backward(k, n, x, dy, dx);
  });
}
void BM_gelu_forward(benchmark::State& state) {
  elementwise(state, 1, 1, [](Kernels& k, std::size_t n, float* x, float*, float* y) {
    Gelu::forward(k, n, x, y);
  });
}
void BM_gelu_backward(benchmark::State& state) {
  elementwise(state, 2, 1, [](Kernels& k, std::size_t n, float* x, float* dy, float* dx) {
    Gelu::backward(k, n, x, dy, dx);
  });
}
void BM_add(benchmark::State& state) {
  elementwise(state, 2, 1,
              [](Kernels& k, std::size_t n, float* a, float* b, float* y) { k.add(n, a, b, y); });
}
void BM_accumulate(benchmark::State& state) {
  elementwise(state, 2, 1,
              [](Kernels& k, std::size_t n, float* x, float*, float* y) { k.accumulate(n, x, y); });
}
void BM_mse(benchmark::State& state) {
  // y, target read; dy written (the loss is one float)
  elementwise(state, 2, 1, [](Kernels& k, std::size_t n, float* y, float* t, float* dy) {
    k.mse(n, y, t, 1e-6f, dy, t);  // loss into t[0]: harmless, t is only read elsewhere
  });
}
BENCHMARK(BM_copy)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fill)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_relu_forward)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_relu_backward)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu_forward)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu_backward)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_add)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_accumulate)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_mse)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);

// (rows, cols) matrices: bias, LayerNorm, softmax cross-entropy.
void BM_bias_add(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  Tensors t;
  float* y = t.make(rows * cols);
  float* b = t.make(cols);
  on_device([&](Kernels& k) {
    const double s = time_launches(state, k.stream(), reps, [&] { k.bias_add(rows, cols, b, y); });
    report_bandwidth(state, 2 * f32 * static_cast<double>(rows * cols), s);
  });
}
void BM_bias_grad(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  Tensors t;
  float* dy = t.make(rows * cols);
  float* db = t.make(cols);
  on_device([&](Kernels& k) {
    const double s =
        time_launches(state, k.stream(), reps, [&] { k.bias_grad(rows, cols, dy, db); });
    report_bandwidth(state, f32 * static_cast<double>(rows * cols), s);
  });
}
// Streaming = false: the launchers, which keep rows of up to 16384 floats in registers (each
// input read once); true: the streaming kernels alone (each row read a second time, from L1/L2
// where it is still there), to show what keeping rows in registers saves.
template <bool Streaming>
void layer_norm_forward(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  Tensors t;
  float* x = t.make(rows * cols, 2, 4);
  float* y = t.make(rows * cols);
  float* gamma = t.make(cols, 0.5, 1.5);
  float* beta = t.make(cols);
  float* stats = t.make(2 * rows);
  on_device([&](Kernels& k) {
    const double s = time_launches(state, k.stream(), reps, [&] {
      if constexpr (Streaming) {
        gpipe::cuda::layer_norm_forward_streaming(rows, cols, 1e-5, x, gamma, beta, y, stats,
                                                  k.stream());
      } else {
        LayerNorm::forward(k, rows, cols, 1e-5, x, gamma, beta, y, stats);
      }
    });
    report_bandwidth(state, 2 * f32 * static_cast<double>(rows * cols), s);
  });
}
template <bool Streaming>
void layer_norm_backward_input(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  Tensors t;
  float* x = t.make(rows * cols, 2, 4);
  float* dy = t.make(rows * cols);
  float* dx = t.make(rows * cols);
  float* gamma = t.make(cols, 0.5, 1.5);
  float* beta = t.make(cols);
  float* stats = t.make(2 * rows);
  on_device([&](Kernels& k) {
    LayerNorm::forward(k, rows, cols, 1e-5, x, gamma, beta, dx, stats);  // real statistics
    const double s = time_launches(state, k.stream(), reps, [&] {
      if constexpr (Streaming) {
        gpipe::cuda::layer_norm_backward_input_streaming(rows, cols, x, dy, gamma, stats, dx,
                                                         k.stream());
      } else {
        LayerNorm::backward_input(k, rows, cols, x, dy, gamma, stats, dx);
      }
    });
    report_bandwidth(state, 3 * f32 * static_cast<double>(rows * cols), s);
  });
}
void BM_layer_norm_forward(benchmark::State& state) { layer_norm_forward<false>(state); }
void BM_layer_norm_forward_streaming(benchmark::State& state) { layer_norm_forward<true>(state); }
void BM_layer_norm_backward_input(benchmark::State& state) {
  layer_norm_backward_input<false>(state);
}
void BM_layer_norm_backward_input_streaming(benchmark::State& state) {
  layer_norm_backward_input<true>(state);
}
void BM_layer_norm_backward_weight(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  Tensors t;
  float* x = t.make(rows * cols, 2, 4);
  float* dy = t.make(rows * cols);
  float* y = t.make(rows * cols);
  float* gamma = t.make(cols, 0.5, 1.5);
  float* beta = t.make(cols);
  float* stats = t.make(2 * rows);
  on_device([&](Kernels& k) {
    LayerNorm::forward(k, rows, cols, 1e-5, x, gamma, beta, y, stats);
    const double s = time_launches(state, k.stream(), reps, [&] {
      LayerNorm::backward_weight(k, rows, cols, x, dy, stats, gamma, beta);
    });
    report_bandwidth(state, 2 * f32 * static_cast<double>(rows * cols), s);
  });
}
void BM_softmax_cross_entropy(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto classes = static_cast<std::size_t>(state.range(1));
  Tensors t;
  float* logits = t.make(rows * classes, -8, 8);
  float* dlogits = t.make(rows * classes);
  float* loss = t.make(1);
  std::int32_t* targets = t.classes(rows, classes);
  on_device([&](Kernels& k) {
    const double s = time_launches(state, k.stream(), reps, [&] {
      k.softmax_cross_entropy(rows, classes, logits, targets, 1e-4f, dlogits, loss);
    });
    report_bandwidth(state, 2 * f32 * static_cast<double>(rows * classes), s);
  });
}
// gpipe::MixedBf16's LayerNorm and cross-entropy: bf16 read and written by the kernels
// themselves (bytes moved: 2 a bf16 element; the stash's 4 bytes a row and gamma, beta not
// counted). LayerNorm's three ops in one benchmark each, the backward from a real stash.
template <int Op>  // 0 forward, 1 backward_input, 2 backward_weight
void layer_norm_bf16(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  Tensors t;
  gpipe::bf16* x = t.make_bf16(rows * cols, 2, 4);
  gpipe::bf16* dy = t.make_bf16(rows * cols);
  gpipe::bf16* y = t.make_bf16(rows * cols);
  gpipe::bf16* stash = t.make_bf16(2 * rows);
  float* gamma = t.make(cols, 0.5, 1.5);
  float* beta = t.make(cols);
  on_device([&](Kernels& fp32) {
    gpipe::cuda::Bf16Kernels& k = fp32.bf16_context();
    LayerNorm16::forward(k, rows, cols, 1e-5, x, gamma, beta, y, stash);
    const double s = time_launches(state, k.stream(), reps, [&] {
      if constexpr (Op == 0) {
        LayerNorm16::forward(k, rows, cols, 1e-5, x, gamma, beta, y, stash);
      } else if constexpr (Op == 1) {
        LayerNorm16::backward_input(k, rows, cols, x, dy, gamma, stash, y);
      } else {
        LayerNorm16::backward_weight(k, rows, cols, x, dy, stash, gamma, beta);
      }
    });
    report_bandwidth(state, (Op == 1 ? 3 : 2) * b16 * static_cast<double>(rows * cols), s);
  });
}
void BM_layer_norm_forward_bf16(benchmark::State& state) { layer_norm_bf16<0>(state); }
void BM_layer_norm_backward_input_bf16(benchmark::State& state) { layer_norm_bf16<1>(state); }
void BM_layer_norm_backward_weight_bf16(benchmark::State& state) { layer_norm_bf16<2>(state); }
// In place, as the Trainer calls it (loss_in_place): the gradient over the logits.
void BM_softmax_cross_entropy_bf16(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto classes = static_cast<std::size_t>(state.range(1));
  Tensors t;
  gpipe::bf16* logits = t.make_bf16(rows * classes, -8, 8);
  float* loss = t.make(1);
  std::int32_t* targets = t.classes(rows, classes);
  on_device([&](Kernels& fp32) {
    gpipe::cuda::Bf16Kernels& k = fp32.bf16_context();
    const double s = time_launches(state, k.stream(), reps, [&] {
      k.softmax_cross_entropy(rows, classes, logits, targets, 1e-4f, logits, loss);
    });
    report_bandwidth(state, 2 * b16 * static_cast<double>(rows * classes), s);
  });
}
BENCHMARK(BM_bias_add)
    ->Args({sized(65536, 16), 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_bias_grad)
    ->Args({sized(65536, 16), 1024})
    ->Args({sized(8192, 4), 4096})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// The resident/streaming pairs' rows, 256 MiB each: a warp per row (1024 floats), blocks of
// 128 and 512 threads per row (4096, 16384).
void layer_norm_shapes(benchmark::internal::Benchmark* b) {
  b->Args({sized(65536, 16), 1024})
      ->Args({sized(16384, 4), 4096})
      ->Args({sized(4096, 2), 16384})
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_layer_norm_forward)->Apply(layer_norm_shapes)->Args({sized(262144, 64), 256});
BENCHMARK(BM_layer_norm_forward_streaming)->Apply(layer_norm_shapes);
BENCHMARK(BM_layer_norm_backward_input)->Apply(layer_norm_shapes);
BENCHMARK(BM_layer_norm_backward_input_streaming)->Apply(layer_norm_shapes);
BENCHMARK(BM_layer_norm_backward_weight)
    ->Args({sized(65536, 16), 1024})
    ->Args({sized(16384, 4), 4096})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// bf16: GPT-2 124M's rows (16 samples of 1024 tokens, width 768) and the float ones' shapes.
void layer_norm_bf16_shapes(benchmark::internal::Benchmark* b) {
  b->Args({sized(16384, 16), 768})->Apply(layer_norm_shapes);
}
BENCHMARK(BM_layer_norm_forward_bf16)->Apply(layer_norm_bf16_shapes);
BENCHMARK(BM_layer_norm_backward_input_bf16)->Apply(layer_norm_bf16_shapes);
BENCHMARK(BM_layer_norm_backward_weight_bf16)->Apply(layer_norm_bf16_shapes);
// 1024 and 32768 classes in 16-byte packs; 50257 (GPT-2's vocabulary) one float at a time.
BENCHMARK(BM_softmax_cross_entropy)
    ->Args({sized(65536, 16), 1024})
    ->Args({sized(2048, 2), 32768})
    ->Args({sized(2048, 2), 50257})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// bf16 logits: GPT-2's padded vocabulary (50304, 16-byte packs of 8) and its own (scalar loads).
BENCHMARK(BM_softmax_cross_entropy_bf16)
    ->Args({sized(2048, 2), 50304})
    ->Args({sized(2048, 2), 50257})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Optimizer updates over n parameters: SGD with momentum reads p, g, buf and writes p, buf;
// AdamW reads p, g, m, v and writes p, m, v.
void BM_sgd_update(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Tensors t;
  float* p = t.make(n);
  float* g = t.make(n);
  float* buf = t.make(n);
  on_device([&](Kernels& k) {
    const double s = time_launches(state, k.stream(), reps, [&] {
      k.sgd_update(n, p, g, buf, 1e-6, 0.9, 0.0, 0.0, false, false);
    });
    report_bandwidth(state, 5 * f32 * static_cast<double>(n), s);
  });
}
void BM_adamw_update(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Tensors t;
  float* p = t.make(n);
  float* g = t.make(n);
  float* m = t.make(n);
  float* v = t.make(n, 0, 1);
  on_device([&](Kernels& k) {
    const double s = time_launches(state, k.stream(), reps, [&] {
      k.adamw_update(n, p, g, m, v, 1e-6, 0.9, 0.999, 1e-8, 0.0, 10);
    });
    report_bandwidth(state, 7 * f32 * static_cast<double>(n), s);
  });
}
BENCHMARK(BM_sgd_update)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_adamw_update)->Arg(big)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Causal flash attention, forward then backward (cuda::flash_attention_forward and _backward,
// as the attention layer calls them) on T storage: samples of `tokens` tokens, heads of size d
// in GPT-2's packing (12 heads, 8 samples: GPT-2 124M's attention at batch 8). FLOPs counted as
// FlashAttention's benchmarks count them, so that the rates compare: 4 B H T^2 d / 2 for the
// causal forward's two products, 2.5 times that for a backward of five (these kernels compute
// seven: the rate understates the work done).
template <class T>
void BM_attention_forward_backward(benchmark::State& state) {
  constexpr std::size_t samples = sized(8, 1), heads = sized(12, 2);
  const auto tokens = static_cast<std::size_t>(state.range(0));
  const auto d = static_cast<std::size_t>(state.range(1));
  const auto g = gpipe::AttentionGeometry::packed(samples, tokens, heads, d);
  const std::size_t hd = heads * d;
  Tensors t;
  float* qkv32 = t.make(g.rows() * g.ld);
  float* dout32 = t.make(g.rows() * hd);
  auto buffer = [&](std::size_t n) { return backend().allocate<T>(0, n); };
  auto qkv = buffer(g.rows() * g.ld), o = buffer(g.rows() * hd), dout = buffer(g.rows() * hd),
       dqkv = buffer(g.rows() * g.ld);
  auto lse = backend().allocate<float>(0, g.rows() * heads),
       delta = backend().allocate<float>(0, g.rows() * heads);
  on_device([&](Kernels& k) {
    if constexpr (std::is_same_v<T, float>) {
      k.copy(g.rows() * g.ld, qkv32, qkv.data());
      k.copy(g.rows() * hd, dout32, dout.data());
    } else {
      k.bf16_context().convert(g.rows() * g.ld, qkv32, qkv.data());
      k.bf16_context().convert(g.rows() * hd, dout32, dout.data());
    }
    const double s = time_launches(state, k.stream(), 3, [&] {
      gpipe::cuda::flash_attention_forward(g, qkv.data(), o.data(), lse.data(), nullptr,
                                           k.stream());
      gpipe::cuda::flash_attention_backward(g, qkv.data(), o.data(), lse.data(), dout.data(),
                                            dqkv.data(), delta.data(), nullptr, k.stream());
    });
    const double forward = 2.0 * static_cast<double>(samples * heads * tokens * tokens * d);
    report_flops(state, 3.5 * forward, s);
  });
}
BENCHMARK_TEMPLATE(BM_attention_forward_backward, gpipe::bf16)
    ->Args({sized(1024, 80), 64})
    ->Args({sized(1024, 80), 128})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_attention_forward_backward, float)
    ->Args({sized(1024, 80), 64})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Linear L's three ops on `rows` rows through context k (activations of type T).
template <class L, class Ctx, class T>
void linear_step(Ctx& k, std::size_t rows, const T* x, T* y, const T* dy, T* dx,
                 const float* params, float* grads, const T* compute_params = nullptr) {
  L::forward(k, gpipe::ForwardArgs<T>{rows, x, y, params, nullptr, nullptr, compute_params});
  L::backward_input(k, gpipe::BackwardInputArgs<T>{rows, x, dy, dx, params, nullptr, nullptr,
                                                   nullptr, compute_params});
  L::backward_weight(k, gpipe::BackwardWeightArgs<T>{rows, x, dy, params, nullptr, nullptr, grads});
}

// Linear<In, Out> forward + backward_input + backward_weight on `rows` rows, against the same
// three GEMMs through cuBLAS alone (x_cublas = Linear time / GEMM time).
template <std::size_t In, std::size_t Out>
void BM_linear_forward_backward(benchmark::State& state) {
  using L = gpipe::Linear<In, Out>;
  const auto rows = static_cast<std::size_t>(state.range(0));
  Tensors t;
  float* x = t.make(rows * In);
  float* y = t.make(rows * Out);
  float* dy = t.make(rows * Out);
  float* dx = t.make(rows * In);
  float* params = t.make(L::num_params, -0.03f, 0.03f);
  float* grads = t.make(L::num_params);
  on_device([&](Kernels& k) {
    const float one = 1, zero = 0;
    const int r = static_cast<int>(rows), in = static_cast<int>(In), out = static_cast<int>(Out);
    // The executor's three GEMMs, in cuBLAS's column-major terms (see kernels/gemm.cuh).
    const double gemms = gpipe::bench::median_seconds(k.stream(), 10, [&] {
      GPIPE_CUBLAS_CHECK(cublasSgemm(k.blas(), CUBLAS_OP_T, CUBLAS_OP_N, out, r, in, &one, params,
                                     in, x, in, &zero, y, out));
      GPIPE_CUBLAS_CHECK(cublasSgemm(k.blas(), CUBLAS_OP_N, CUBLAS_OP_N, in, r, out, &one, params,
                                     in, dy, out, &zero, dx, in));
      GPIPE_CUBLAS_CHECK(cublasSgemm(k.blas(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, r, &one, x, in,
                                     dy, out, &one, grads, in));
    });
    const double s = time_launches(state, k.stream(), 3,
                                   [&] { linear_step<L>(k, rows, x, y, dy, dx, params, grads); });
    report_flops(state, 3 * 2.0 * static_cast<double>(rows) * In * Out, s);
    state.counters["x_cublas"] = s / gemms;
  });
}
// The same Linear on bf16 activations (gpipe::MixedBf16: cuda::Bf16Kernels, cublasGemmEx with
// float accumulation), its weights read from their bf16 copy as the executor registers it,
// against the float Linear on the same shapes (x_fp32 = bf16 time / fp32 time).
template <std::size_t In, std::size_t Out>
void BM_linear_forward_backward_bf16(benchmark::State& state) {
  using L = gpipe::Linear<In, Out>;
  const auto rows = static_cast<std::size_t>(state.range(0));
  Tensors t;
  float* x = t.make(rows * In);
  float* y = t.make(rows * Out);
  float* dy = t.make(rows * Out);
  float* dx = t.make(rows * In);
  float* params = t.make(L::num_params, -0.03f, 0.03f);
  float* grads = t.make(L::num_params);
  auto half = [&](std::size_t n) { return backend().allocate<gpipe::bf16>(0, n); };
  auto x16 = half(rows * In), y16 = half(rows * Out), dy16 = half(rows * Out),
       dx16 = half(rows * In), w16 = half(L::num_params);
  on_device([&](Kernels& k) {
    gpipe::cuda::Bf16Kernels& k16 = k.bf16_context();
    k16.convert(rows * In, x, x16.data());
    k16.convert(rows * Out, dy, dy16.data());
    k16.convert(L::num_params, params, w16.data());
    const double fp32 = gpipe::bench::median_seconds(
        k.stream(), 10, [&] { linear_step<L>(k, rows, x, y, dy, dx, params, grads); });
    const double s = time_launches(state, k.stream(), 3, [&] {
      linear_step<L>(k16, rows, x16.data(), y16.data(), dy16.data(), dx16.data(), params, grads,
                     w16.data());
    });
    report_flops(state, 3 * 2.0 * static_cast<double>(rows) * In * Out, s);
    state.counters["x_fp32"] = s / fp32;
  });
}
// Registered as BM_linear_forward_backward<In, Out>/rows, one per entry of `rows`.
template <std::size_t In, std::size_t Out>
void register_linear(std::vector<std::int64_t> rows) {
  const std::string name =
      "BM_linear_forward_backward<" + std::to_string(In) + ", " + std::to_string(Out) + ">";
  auto* b = benchmark::RegisterBenchmark(name.c_str(), BM_linear_forward_backward<In, Out>);
  for (const std::int64_t r : rows) b->Arg(r);
  b->UseManualTime()->Unit(benchmark::kMillisecond);
  const std::string bf16_name =
      "BM_linear_forward_backward_bf16<" + std::to_string(In) + ", " + std::to_string(Out) + ">";
  auto* h =
      benchmark::RegisterBenchmark(bf16_name.c_str(), BM_linear_forward_backward_bf16<In, Out>);
  for (const std::int64_t r : rows) h->Arg(r);
  h->UseManualTime()->Unit(benchmark::kMillisecond);
}
// Widths 4096 and 1024 on a GPU (64 and 32 on the emulator, whose GEMM is a plain loop).
constexpr std::size_t wide = sized<std::size_t>(4096, 64), narrow = sized<std::size_t>(1024, 32);
[[maybe_unused]] const bool linear_registered = [] {
  register_linear<wide, wide>({sized(8192, 16)});
  register_linear<narrow, wide>({sized(4096, 16), sized(512, 4)});
  register_linear<wide, narrow>({sized(4096, 16)});
  return true;
}();

}  // namespace

int main(int argc, char** argv) { return gpipe::bench::cuda_benchmark_main(argc, argv); }
