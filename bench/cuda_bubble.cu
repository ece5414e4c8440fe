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

// S stages of one FixedDuration layer each.
template <std::size_t S, std::size_t Split, class Seq = std::make_index_sequence<S>>
struct Fixed;
template <std::size_t S, std::size_t Split, std::size_t... I>
struct Fixed<S, Split, std::index_sequence<I...>> {
  template <std::size_t>
  using stage = gpipe::Stage<FixedDuration<4, Split>>;
  using type = gpipe::Pipeline<stage<I>...>;
};

double theory(std::string_view schedule, double k, double m, double v) {
  if (schedule == "gpipe" || schedule == "1f1b") return (k - 1) / (m + k - 1);
  if (schedule.starts_with("interleaved") && m >= k) return ((k - 1) / v) / (m + (k - 1) / v);
  return 0;
}

template <class Schedule, std::size_t K>
void BM_Bubble(benchmark::State& state) {
  constexpr std::size_t V = Schedule::chunks_per_device;
  using Model = typename Fixed<K * V, V>::type;
  using Trainer = gpipe::Trainer<Model, gpipe::MSELoss, gpipe::cuda::Backend, Schedule>;
  const auto m = static_cast<std::size_t>(state.range(1));
  gpipe::cuda::Backend backend(K, {.gpus = std::vector<int>(K, 0)});
  Trainer trainer(backend, {.micro_batches = m});
  const std::vector<float> x(m * 4, 1.0f), y(m * 4, 0.0f);
  const double ops_per_device = 3.0 * static_cast<double>(m * V);

  trainer.forward_backward(x, y);  // warm-up: module loading, the memory pools, staging buffers
  double bubble = 0, overhead = 0;
  backend.reset_peak();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    const double wall =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    const auto& step = trainer.last_step();
    const double mean_op = step.busy_us / (ops_per_device * static_cast<double>(K));
    const double ideal = gpipe::simulate(trainer.schedule(), {mean_op, mean_op, mean_op}).makespan;
    bubble += step.bubble_fraction;
    overhead += (wall - ideal) / (ideal / mean_op);
  }
  std::size_t peak = 0;
  for (std::size_t d = 0; d < K; ++d)
    peak = std::max(peak, backend.memory_stats(d).peak_of(gpipe::MemoryKind::activations));

  const auto n = static_cast<double>(state.iterations());
  state.counters["bubble_measured"] = bubble / n;
  state.counters["bubble_simulated"] = gpipe::simulate(trainer.schedule()).bubble_fraction;
  state.counters["bubble_theory"] =
      theory(Schedule::name, static_cast<double>(K), static_cast<double>(m), V);
  state.counters["overhead_us_per_op"] = overhead / n;
  state.counters["peak_activations_KiB"] = static_cast<double>(peak) / 1024;
  state.SetLabel(std::string(Schedule::name));

  if (!trace_dir.empty() && K == 4 && m == 8) {
    backend.set_tracing(true);
    trainer.forward_backward(x, y);
    backend.set_tracing(false);
    const auto events = backend.take_trace();
    const std::string base = trace_dir + "/timeline_cuda_" + std::string(Schedule::name) + "_k4_m8";
    gpipe::io::write_svg_timeline(
        base + ".svg", events,
        {.title = std::string(Schedule::name) +
                  ", K = 4, M = 8, measured on the CUDA backend (4 streams of one GPU)",
         .num_devices = K});
    gpipe::io::write_chrome_trace(base + ".json", events,
                                  {.title = std::string(Schedule::name) + " K=4 M=8 CUDA"});
  }
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
