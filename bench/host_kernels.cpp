// The host backend's kernels on the shapes of bench_mlp_step's model (width 1024, batch 256 split
// into M micro-batches of 256/M rows), one kernel context per thread as each device worker has.
//   BM_Gemm/<op>/rows:R/layers:L/threads:T  the three GEMMs of a Linear(1024, 1024):
//                                  forward          y (R, 1024) = x (R, 1024) W^T
//                                  backward_input   dx (R, 1024) = dy (R, 1024) W
//                                  backward_weight  dW (1024, 1024) += dy^T x   (k = R)
//                                  GFLOP/s per thread; with threads:2 both cores run the same
//                                  GEMM at once, as the two devices of a K = 2 pipeline do.
//                                  Calls cycle over L layers' weights (and weight gradients):
//                                  L = 1 keeps one 4 MB weight in cache; L = 2 is a K = 2
//                                  device's share of the MLP (8 MB of weights, 8 MB of
//                                  gradients per thread), which two threads do not keep in a
//                                  32 MB L3, so each 32-row call streams its weight (and W its
//                                  gradient) from memory, as in the pipeline.
//   BM_Gemm/<op>/bf16/...          the same GEMMs on gpipe::MixedBf16's context
//                                  (host::Kernels<bf16>): bf16 activations, the weight's bf16
//                                  copy made once (as once per step), float weight gradients;
//                                  the label names what ran it (oneDNN's kernel, or "fp32 of
//                                  the widened bf16" where oneDNN has only its reference one)
//   BM_Gemm/forward_cast_per_use/bf16/...  the forward with the float weight rounded to bf16 at
//                                  every call instead: what casting per use would cost
//   BM_LinearForward/<how>/rows:R  Linear(1024, 1024)'s forward with its bias, GFLOP/s: fused (one
//                                  oneDNN matmul, linear_forward) or gemm_then_bias
//   BM_Elementwise/<kernel>/n:N    GB/s counted as the bytes the kernel must read and write,
//                                  N = rows x 1024 floats (R = 256 and 32; 32 rows fit in L2);
//                                  to_bf16 / from_bf16 (float <-> bf16 bits) count 6 bytes each.
//   BM_TeamRun/threads:T           a device's hand-over to its team's helpers (host::Team::run with
//                                  T empty parts; time per run and runs/s): the cost that sets how
//                                  much work a kernel block needs before host::gemm_split and
//                                  Kernels::in_blocks split (threads_per_device > 1)
//   BM_AttentionCore/<fp32|bf16>/T:T  the attention core of GPT-2's shapes (D = 768, H = 12) on
//                                  2048 token rows (2048 / T samples), forward and backward on
//                                  one thread; GFLOP/s counted as the causal products' useful
//                                  work, 6 T^2 d a head and sample (2 products forward, 4
//                                  backward, half of each (T, T) masked), whatever the kernel
//                                  computes; stash_bytes_per_row what the core keeps per token
// What it shows: how the GEMM rate falls with the micro-batch's rows and when both cores work,
// which bounds what a K = 2 pipeline can gain over K = 1 (bench_mlp_step).

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <gpipe/backend/host/kernels/bf16.hpp>
#include <gpipe/gpipe.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr std::size_t width = 1024;

enum class GemmOp { forward, backward_input, backward_weight };

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  gpipe::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-1, 1);
  return v;
}

// A: float, or gpipe::bf16 (activations on host::Kernels<bf16>: the weights passed as their bf16
// copy, as ForwardArgs::compute_params; cast_per_use: as float, so every call rounds its weight).
template <class A = float>
void BM_Gemm(benchmark::State& state, GemmOp op, bool cast_per_use = false) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto layers = static_cast<std::size_t>(state.range(1));
  gpipe::host::Kernels<A> k(static_cast<std::size_t>(state.thread_index()));
  auto as = [](const std::vector<float>& v) {
    std::vector<A> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<A>(v[i]);
    return out;
  };
  const auto act = as(random_floats(rows * width, 1)), grad = as(random_floats(rows * width, 2));
  std::vector<std::vector<float>> weights, dweights;
  std::vector<std::vector<A>> cast;  // bf16: each weight's copy, made once
  for (std::size_t l = 0; l < layers; ++l) {
    weights.push_back(random_floats(width * width, 3 + l));
    dweights.emplace_back(width * width, 0.0f);
    cast.push_back(as(weights.back()));
  }
  std::vector<A> out(rows * width);
  std::size_t call = 0;
  for (auto _ : state) {
    const std::size_t l = call++ % layers;
    auto run = [&](const auto* weight) {
      switch (op) {
        case GemmOp::forward:
          k.gemm(false, true, rows, width, width, 1, act.data(), weight, 0, out.data());
          break;
        case GemmOp::backward_input:
          k.gemm(false, false, rows, width, width, 1, grad.data(), weight, 0, out.data());
          break;
        case GemmOp::backward_weight:
          k.gemm(true, false, width, width, rows, 1, grad.data(), act.data(), 1,
                 dweights[l].data());
          break;
      }
    };
    if (std::is_same_v<A, float> || cast_per_use)
      run(weights[l].data());
    else
      run(cast[l].data());
    benchmark::ClobberMemory();
  }
  if constexpr (!std::is_same_v<A, float>) {  // what runs it: oneDNN's kernel, or the fp32 path
    const bool weight_gradient = op == GemmOp::backward_weight;
    state.SetLabel(weight_gradient ? k.gemm_implementation(true, false, width, width, rows, true, 1)
                                   : k.gemm_implementation(false, op == GemmOp::forward, rows,
                                                           width, width, false));
  }
  const double flops = 2.0 * static_cast<double>(rows * width * width);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
}

// Linear's forward, y = x W^T + b: one fused matmul (linear_forward) against a GEMM followed by
// a bias pass, the two ways the host backend could run it.
void BM_LinearForward(benchmark::State& state, bool fused) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  gpipe::host::Kernels<float> k;
  const auto x = random_floats(rows * width, 1), w = random_floats(width * width, 3),
             b = random_floats(width, 6);
  std::vector<float> y(rows * width);
  for (auto _ : state) {
    if (fused) {
      k.linear_forward(rows, width, width, x.data(), w.data(), b.data(), y.data());
    } else {
      k.gemm(false, true, rows, width, width, 1, x.data(), w.data(), 0, y.data());
      k.bias_add(rows, width, b.data(), y.data());
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2e-9 * static_cast<double>(rows * width * width * state.iterations()),
                         benchmark::Counter::kIsRate);
}

enum class Elementwise {
  relu_forward,
  relu_backward,
  bias_add,
  bias_grad,
  add,
  copy,
  to_bf16,
  from_bf16
};

void BM_Elementwise(benchmark::State& state, Elementwise kernel) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::size_t rows = n / width;
  gpipe::host::Kernels<float> k;
  using Relu = gpipe::LayerKernels<gpipe::ReluOp, gpipe::host::Kernels<float>>;
  const auto x = random_floats(n, 4), dy = random_floats(n, 5), bias = random_floats(width, 6);
  std::vector<float> y(n), db(width, 0.0f);
  std::vector<std::uint16_t> half(n);
  gpipe::host::to_bf16(n, x.data(), half.data());
  double floats_moved = 0;  // per call
  for (auto _ : state) {
    switch (kernel) {
      case Elementwise::relu_forward:
        Relu::forward(k, n, x.data(), y.data()), floats_moved = 2.0 * n;
        break;
      case Elementwise::relu_backward:
        Relu::backward(k, n, x.data(), dy.data(), y.data()), floats_moved = 3.0 * n;
        break;
      case Elementwise::bias_add:
        k.bias_add(rows, width, bias.data(), y.data()), floats_moved = 2.0 * n;
        break;
      case Elementwise::bias_grad:
        k.bias_grad(rows, width, dy.data(), db.data()), floats_moved = 1.0 * n;
        break;
      case Elementwise::add:
        k.add(n, x.data(), dy.data(), y.data()), floats_moved = 3.0 * n;
        break;
      case Elementwise::copy:
        k.copy(n, x.data(), y.data()), floats_moved = 2.0 * n;
        break;
      case Elementwise::to_bf16:  // 4 bytes in, 2 out
        gpipe::host::to_bf16(n, x.data(), half.data()), floats_moved = 1.5 * n;
        break;
      case Elementwise::from_bf16:  // 2 bytes in, 4 out
        gpipe::host::from_bf16(n, half.data(), y.data()), floats_moved = 1.5 * n;
        break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(
      floats_moved * sizeof(float) * 1e-9 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

// The attention core's forward and backward_input on 2048 rows of T tokens a sample.
template <class A, std::size_t T>
void BM_AttentionCore(benchmark::State& state) {
  constexpr std::size_t D = 768, H = 12, rows = 2048;
  using Core = gpipe::detail::CausalAttentionCore<D, H, T>;
  gpipe::host::Kernels<float> fp32;
  auto& k = [&]() -> auto& {
    if constexpr (std::is_same_v<A, float>)
      return fp32;
    else
      return fp32.bf16_context();
  }
  ();
  std::vector<A> qkv, dout, o(rows * D), dqkv(rows * 3 * D), stash(rows * Core::stash_per_row),
      workspace(rows * gpipe::workspace_per_row_v<Core>);
  for (float x : random_floats(rows * 3 * D, 1)) qkv.push_back(A(x));
  for (float x : random_floats(rows * D, 2)) dout.push_back(A(x));
  for (auto _ : state) {
    Core::forward(k, {rows, qkv.data(), o.data(), nullptr, stash.data(), workspace.data()});
    Core::backward_input(k, {.rows = rows,
                             .x = qkv.data(),
                             .dy = dout.data(),
                             .dx = dqkv.data(),
                             .params = nullptr,
                             .stash = stash.data(),
                             .grad_stash = nullptr,
                             .workspace = workspace.data(),
                             .y = o.data()});
    benchmark::DoNotOptimize(dqkv.data());
  }
  const double flops = 6.0 * T * T * (D / H) * H * (rows / T);
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["stash_bytes_per_row"] = static_cast<double>(Core::stash_per_row * sizeof(A));
}

// One Team::run of `threads` empty parts, round trip: wake the helpers, wait for all.
void BM_TeamRun(benchmark::State& state) {
  gpipe::host::Team team(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state)
    team.run(team.size(), [](std::size_t part) { benchmark::DoNotOptimize(part); });
  state.counters["runs/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void register_all() {
  const std::pair<const char*, GemmOp> gemms[] = {{"forward", GemmOp::forward},
                                                  {"backward_input", GemmOp::backward_input},
                                                  {"backward_weight", GemmOp::backward_weight}};
  for (const auto& [name, op] : gemms)
    benchmark::RegisterBenchmark((std::string("BM_Gemm/") + name).c_str(), BM_Gemm<float>, op,
                                 false)
        ->ArgNames({"rows", "layers"})
        ->ArgsProduct({{256, 128, 64, 32}, {1, 2}})
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime();
  for (const auto& [name, op] : gemms)
    benchmark::RegisterBenchmark((std::string("BM_Gemm/") + name + "/bf16").c_str(),
                                 BM_Gemm<gpipe::bf16>, op, false)
        ->ArgNames({"rows", "layers"})
        ->ArgsProduct({{256, 32}, {1}})
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime();
  benchmark::RegisterBenchmark("BM_Gemm/forward_cast_per_use/bf16", BM_Gemm<gpipe::bf16>,
                               GemmOp::forward, true)
      ->ArgNames({"rows", "layers"})
      ->ArgsProduct({{256, 32}, {1}})
      ->UseRealTime();
  for (bool fused : {true, false})
    benchmark::RegisterBenchmark(
        fused ? "BM_LinearForward/fused" : "BM_LinearForward/gemm_then_bias", BM_LinearForward,
        fused)
        ->ArgName("rows")
        ->Arg(256)
        ->Arg(128)
        ->Arg(64)
        ->Arg(32)
        ->UseRealTime();
  const std::pair<const char*, Elementwise> kernels[] = {
      {"relu_forward", Elementwise::relu_forward},
      {"relu_backward", Elementwise::relu_backward},
      {"bias_add", Elementwise::bias_add},
      {"bias_grad", Elementwise::bias_grad},
      {"add", Elementwise::add},
      {"copy", Elementwise::copy},
      {"to_bf16", Elementwise::to_bf16},
      {"from_bf16", Elementwise::from_bf16}};
  for (const auto& [name, kernel] : kernels)
    benchmark::RegisterBenchmark((std::string("BM_Elementwise/") + name).c_str(), BM_Elementwise,
                                 kernel)
        ->ArgName("n")
        ->Arg(256 * width)
        ->Arg(32 * width);
  benchmark::RegisterBenchmark("BM_AttentionCore/fp32/T:256", BM_AttentionCore<float, 256>)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_AttentionCore/fp32/T:1024", BM_AttentionCore<float, 1024>)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_AttentionCore/bf16/T:256", BM_AttentionCore<gpipe::bf16, 256>)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_AttentionCore/bf16/T:1024", BM_AttentionCore<gpipe::bf16, 1024>)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_TeamRun", BM_TeamRun)
      ->ArgName("threads")
      ->Arg(2)
      ->Arg(3)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

[[maybe_unused]] const bool registered = (register_all(), true);

}  // namespace
