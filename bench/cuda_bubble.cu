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

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpipe/cuda.cuh"
#include "support/bubble.hpp"
#include "support/cuda.cuh"

namespace {

gpipe::bench::BubbleFlags flags{.op_us = 200, .trace_dir = ""};

// The GPU's global nanosecond timer (the same clock on every SM); the host's steady clock on the
// CUDA emulator.
__device__ __forceinline__ std::uint64_t global_timer_ns() {
#ifdef GPIPE_CUDA_EMULATION
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
#else
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

// One thread that returns `ns` nanoseconds after it started.
__global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

// Enqueues a spin of `us` microseconds on the context's compute stream.
void spin(gpipe::cuda::Kernels& k, long us) {
  GPIPE_CUDA_LAUNCH(spin_kernel, 1, 1, k.stream())(static_cast<std::uint64_t>(us) * 1000);
  GPIPE_CUDA_CHECK_LAUNCH("spin_kernel");
}

// A layer of width N that passes its input through, stashes 1024 floats per row (so that live
// activations show in the memory counters) and spins op_us / Split in each of its three ops.
template <std::size_t N, std::size_t Split>
struct FixedDuration {
  static constexpr std::size_t in_features = N, out_features = N;
  // A float of grad stash per row: without one, the first stage would skip its backward_input
  // (no one reads the model's input gradient; model/detail/chain.hpp), and here every device
  // must do the same work.
  static constexpr std::size_t num_params = 0, stash_per_row = 1024, grad_stash_per_row = 1;
  static constexpr std::array<gpipe::ParamSpec, 0> param_specs() { return {}; }
  static void init(std::span<float>, gpipe::Rng&) {}

  static void forward(gpipe::cuda::Kernels& k, const gpipe::ForwardArgs<float>& a) {
    k.copy(a.rows * N, a.x, a.y);
    spin(k, flags.op_us / static_cast<long>(Split));
  }
  static void backward_input(gpipe::cuda::Kernels& k, const gpipe::BackwardInputArgs<float>& a) {
    k.copy(a.rows * N, a.dy, a.dx);
    spin(k, flags.op_us / static_cast<long>(Split));
  }
  static void backward_weight(gpipe::cuda::Kernels& k, const gpipe::BackwardWeightArgs<float>&) {
    spin(k, flags.op_us / static_cast<long>(Split));
  }
};
static_assert(gpipe::layer_for<FixedDuration<4, 1>, gpipe::cuda::Kernels>);

template <std::size_t Split>
using Layer = FixedDuration<4, Split>;

// bench_bubble's names; no MinTime: --benchmark_min_time decides (scripts/gpu-check passes a
// short one).
[[maybe_unused]] const bool registered = [] {
  gpipe::bench::register_bubble_benchmarks<Layer>(
      [](std::size_t k) {
        return std::make_unique<gpipe::cuda::Backend>(
            k, gpipe::cuda::BackendOptions{.gpus = std::vector<int>(k, 0)});
      },
      {.flags = &flags,
       .trace_stem = "timeline_cuda_",
       .where = "the CUDA backend (4 streams of one GPU)"});
  return true;
}();

}  // namespace

int main(int argc, char** argv) {
  if (!gpipe::bench::take_bubble_flags(&argc, argv, flags)) return 1;
  benchmark::AddCustomContext("gpipe_op_us", std::to_string(flags.op_us));
  return gpipe::bench::cuda_benchmark_main(argc, argv, {.ceilings = false});
}
