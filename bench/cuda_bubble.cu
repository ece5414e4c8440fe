// Bubble overhead versus micro-batch count, per schedule, on the CUDA backend: bench_bubble's
// measurement (bench/bubble.cpp) with the stages on K virtual devices of GPU 0, each with its own
// compute stream, so that the stages run side by side on one GPU.
//
// Each stage is one user-defined layer whose forward, backward_input and backward_weight launch
// one spin kernel (a single thread that busy-waits a fixed time on the GPU's %globaltimer, so K
// of them at once take K of the GPU's SMs and nothing else) on the device's compute stream, plus
// the tiny copy x -> y (forward) or dy -> dx (backward_input). Every device does 3 op_us of work
// per micro-batch under every schedule (an interleaved chunk's ops spin op_us / V). For K
// devices and M micro-batches, the counters of bench_bubble:
//   bubble_measured      1 - busy / (K makespan) from the trainer's per-step timing (the CUDA
//                        backend times every compute op with a pair of events on its stream)
//   bubble_simulated     the schedule simulator's bubble for equal op costs
//   bubble_theory        (K-1)/(M+K-1) for GPipe and 1F1B, ((K-1)/V)/(M+(K-1)/V) for
//                        interleaved (M >= K); 0 where no closed form applies
//   overhead_us_per_op   (host wall time of the step - the simulated makespan with the op
//                        durations measured in the same step) / (op slots on the critical path):
//                        what issuing, event hand-overs between streams, the step's final
//                        synchronize and the timing read-back add to each op of the critical path
//   peak_activations_KiB the most activation bytes any device held (4 KiB per micro-batch and
//                        stage, from its forward to its backward_weight)
// The names (BM_Bubble<Schedule>/K:k/M:m) are bench_bubble's, so scripts/plot-bench reads the JSON.
//
// Usage: bench_cuda_bubble [--op_us=200] [--trace_dir=DIR] [Google Benchmark flags]
//   --trace_dir writes DIR/timeline_cuda_<schedule>_k4_m8.svg and .json: one traced K = 4, M = 8
//   step. Without a GPU it says so and exits 0.
//
//   build/<preset>/bench/bench_cuda_bubble --benchmark_min_time=0.05

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/cuda.cuh"
#include "gpipe/io/chrome_trace.hpp"
#include "gpipe/io/svg_timeline.hpp"
#include "support/bubble.hpp"
#include "support/cuda.cuh"

namespace {

long op_us = 200;       // duration of every F, B and W of a whole stage
std::string trace_dir;  // where to write K = 4, M = 8 timelines ("" = nowhere)

// The GPU's global nanosecond timer (the same clock on every SM).
__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread that returns `ns` nanoseconds after it started.
__global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

// Enqueues a spin of `us` microseconds on the context's compute stream.
void spin(gpipe::cuda::Kernels& k, long us) {
  spin_kernel<<<1, 1, 0, k.stream()>>>(static_cast<std::uint64_t>(us) * 1000);
  GPIPE_CUDA_CHECK_LAUNCH("spin_kernel");
}

// A layer of width N that passes its input through, stashes 1024 floats per row (so that live
// activations show in the memory counters) and spins op_us / Split in each of its three ops.
template <std::size_t N, std::size_t Split>
struct FixedDuration {
  static constexpr std::size_t in_features = N, out_features = N;
  static constexpr std::size_t num_params = 0, stash_per_row = 1024, grad_stash_per_row = 0;
  static constexpr std::array<gpipe::ParamSpec, 0> param_specs() { return {}; }
  static void init(std::span<float>, gpipe::Rng&) {}

  static void forward(gpipe::cuda::Kernels& k, const gpipe::ForwardArgs<float>& a) {
    k.copy(a.rows * N, a.x, a.y);
    spin(k, op_us / static_cast<long>(Split));
  }
  static void backward_input(gpipe::cuda::Kernels& k, const gpipe::BackwardInputArgs<float>& a) {
    k.copy(a.rows * N, a.dy, a.dx);
    spin(k, op_us / static_cast<long>(Split));
  }
  static void backward_weight(gpipe::cuda::Kernels& k, const gpipe::BackwardWeightArgs<float>&) {
    spin(k, op_us / static_cast<long>(Split));
  }
};
static_assert(gpipe::layer_for<FixedDuration<4, 1>, gpipe::cuda::Kernels>);

template <class Schedule, std::size_t K>
void BM_Bubble(benchmark::State& state) {
  constexpr std::size_t V = Schedule::chunks_per_device;
  using Model = gpipe::bench::fixed_pipeline_t<FixedDuration<4, V>, K * V>;
  const auto m = static_cast<std::size_t>(state.range(1));
  gpipe::cuda::Backend backend(K, {.gpus = std::vector<int>(K, 0)});
  gpipe::Trainer<Model, gpipe::MSELoss, gpipe::cuda::Backend, Schedule> trainer(
      backend, {.micro_batches = m});
  const std::vector<float> x(m * 4, 1.0f), y(m * 4, 0.0f);
  trainer.forward_backward(x, y);  // warm-up: module loading, the memory pools, staging buffers
  const std::string name(Schedule::name);
  gpipe::bench::measure_bubble(
      state, trainer, backend, K, m,
      trace_dir.empty() ? "" : trace_dir + "/timeline_cuda_" + name + "_k4_m8",
      name + ", K = 4, M = 8, measured on the CUDA backend (4 streams of one GPU)");
}

// No MinTime here: --benchmark_min_time decides (scripts/gpu-check passes a short one).
template <class Schedule, std::size_t... K>
void register_schedule(const std::string& name) {
  (benchmark::RegisterBenchmark(name.c_str(), BM_Bubble<Schedule, K>)
       ->ArgNames({"K", "M"})
       ->ArgsProduct({{static_cast<long>(K)}, {1, 2, 4, 8, 16, 32, 64}})
       ->Unit(benchmark::kMillisecond)
       ->UseRealTime(),
   ...);
}

[[maybe_unused]] const bool registered = [] {
  register_schedule<gpipe::GPipe, 1, 2, 4, 8>("BM_Bubble<GPipe>");
  register_schedule<gpipe::OneFOneB, 1, 2, 4, 8>("BM_Bubble<OneFOneB>");
  register_schedule<gpipe::Interleaved<2>, 1, 2, 4, 8>("BM_Bubble<Interleaved<2>>");
  register_schedule<gpipe::ZeroBubbleH1, 1, 2, 4, 8>("BM_Bubble<ZeroBubbleH1>");
  return true;
}();

// Takes --op_us=N and --trace_dir=DIR out of the command line (Google Benchmark rejects flags it
// does not know); false on a bad --op_us.
bool preparse(int* argc, char** argv) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--op_us=", 8) == 0) {
      op_us = std::atol(argv[i] + 8);
    } else if (std::strncmp(argv[i], "--trace_dir=", 12) == 0) {
      trace_dir = argv[i] + 12;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  if (op_us <= 0) {
    std::fprintf(stderr, "bench_cuda_bubble: --op_us must be a positive number of microseconds\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!preparse(&argc, argv)) return 1;
  if (!trace_dir.empty()) std::filesystem::create_directories(trace_dir);
  benchmark::AddCustomContext("gpipe_op_us", std::to_string(op_us));
  return gpipe::bench::cuda_benchmark_main(argc, argv, {.ceilings = false});
}
