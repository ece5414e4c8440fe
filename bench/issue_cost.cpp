// What the executor costs per op on the host backend: a pipeline whose ops do (almost) nothing,
// so that a step's wall time is the executor alone (queues, events, hand-overs, slot buffers,
// bookkeeping), the cost that bench_bubble's overhead_us_per_op adds to ops of real length.
//
// Each stage is one layer of width 4 whose forward and backward_input copy 4 floats per row and
// whose backward_weight does nothing; a micro-batch is one row. For K devices and M
// micro-batches:
//   us_per_op       wall time of a step / the op slots on its critical path (the simulated
//                   makespan with every F, B and W costing 1): what each op of the critical path
//                   costs when the ops themselves cost nothing. For K = 1, wall / (3 M).
//   us_per_issued   wall time of a step / every op issued on every device (compute ops, sends
//                   and recvs): the executor's throughput, the bound for short ops on many
//                   devices.
//
// BM_HandOver<policy>/wait_us:w, the latency of one hand-over under each host::WaitPolicy: two
// devices take turns, each holding its thread for w microseconds (so that the other has waited
// that long when the event comes; w = 50 stays within the poll that precedes sleeping, w = 500
// does not) and then handing over through an event:
//   handover_us     the median time from one turn's end to the next turn's start on the other
//                   device (the event's record, the waiter's wake-up, its queue)
//   handover_p90_us the 90th percentile of the same
// Usage: bench_issue_cost [Google Benchmark flags] (BENCHMARKS.md: --benchmark_min_time=0.2)

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <gpipe/gpipe.hpp>
#include <gpipe/schedule/simulator.hpp>
#include <span>
#include <string>
#include <vector>

#include "support/bubble.hpp"
#include "support/fixed_duration.hpp"

namespace {

// A layer of width N whose ops cost next to nothing; a float of grad stash per row, so that the
// first stage runs its backward_input too (as bench_bubble's layer, for the same reason).
template <std::size_t N>
struct Empty {
  static constexpr std::size_t in_features = N, out_features = N;
  static constexpr std::size_t num_params = 0, stash_per_row = 0, grad_stash_per_row = 1;
  static constexpr std::array<gpipe::ParamSpec, 0> param_specs() { return {}; }
  static void init(std::span<float>, gpipe::Rng&) {}

  template <class Ctx>
  static void forward(Ctx& k, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& k, const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    k.copy(a.rows * N, a.dy, a.dx);
  }
  template <class Ctx>
  static void backward_weight(Ctx&, const gpipe::BackwardWeightArgs<typename Ctx::value_type>&) {}
};
static_assert(gpipe::layer<Empty<4>>);

template <class Schedule, std::size_t K>
void BM_IssueCost(benchmark::State& state) {
  constexpr std::size_t V = Schedule::chunks_per_device;
  using Model = gpipe::bench::fixed_pipeline_t<Empty<4>, K * V>;
  const auto m = static_cast<std::size_t>(state.range(1));
  gpipe::host::Backend backend(K);
  gpipe::Trainer<Model, gpipe::MSELoss, gpipe::host::Backend, Schedule> trainer(
      backend, {.micro_batches = m});
  const std::vector<float> x(m * 4, 1.0f), y(m * 4, 0.0f);
  trainer.forward_backward(x, y);  // warm-up: thread start-up, first allocations
  double wall = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    wall +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  const double steps = static_cast<double>(state.iterations());
  const gpipe::Schedule& schedule = trainer.schedule();
  double issued = 0;
  for (const auto& ops : schedule.ops) issued += static_cast<double>(ops.size());
  state.counters["us_per_op"] = wall / steps / gpipe::simulate(schedule).makespan;
  state.counters["us_per_issued"] = wall / steps / issued;
  state.SetLabel(std::string(Schedule::name));
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void BM_HandOver(benchmark::State& state, gpipe::host::WaitPolicy policy) {
  const long wait_us = state.range(0);
  constexpr std::size_t turns = 64;
  gpipe::host::Backend backend(2, {.wait = policy});
  std::array<double, turns> start{}, end{};  // of each turn, each written by its device's thread
  std::vector<double> latencies;
  for (auto _ : state) {
    std::vector<gpipe::host::Event> handed(turns);
    for (std::size_t i = 0; i < turns; ++i) {
      const std::size_t device = i % 2;
      if (i > 0) backend.wait(device, handed[i - 1]);
      backend.submit(device, {"turn"}, [&start, &end, i, wait_us](gpipe::host::Backend::Kernels&) {
        start[i] = now_us();
        gpipe::bench::hold(wait_us);
        end[i] = now_us();
      });
      backend.record(device, handed[i]);
    }
    backend.synchronize();
    for (std::size_t i = 1; i < turns; ++i) latencies.push_back(start[i] - end[i - 1]);
  }
  std::sort(latencies.begin(), latencies.end());
  state.counters["handover_us"] = latencies[latencies.size() / 2];
  state.counters["handover_p90_us"] = latencies[latencies.size() * 9 / 10];
  state.SetLabel(backend.spins() ? "spins" : "blocks");
}

template <class Schedule, std::size_t... K>
void register_schedule(const char* name) {
  (benchmark::RegisterBenchmark(name, BM_IssueCost<Schedule, K>)
       ->ArgNames({"K", "M"})
       ->ArgsProduct({{static_cast<long>(K)}, {8, 64}})
       ->Unit(benchmark::kMicrosecond)
       ->UseRealTime(),
   ...);
}

[[maybe_unused]] const bool registered = [] {
  register_schedule<gpipe::GPipe, 1, 2, 4>("BM_IssueCost<GPipe>");
  register_schedule<gpipe::OneFOneB, 2, 4>("BM_IssueCost<OneFOneB>");
  register_schedule<gpipe::Interleaved<2>, 2, 4>("BM_IssueCost<Interleaved<2>>");
  register_schedule<gpipe::ZeroBubbleH1, 2, 4>("BM_IssueCost<ZeroBubbleH1>");
  for (const auto& [name, policy] :
       {std::pair{"BM_HandOver<spin>", gpipe::host::WaitPolicy::spin},
        std::pair{"BM_HandOver<block>", gpipe::host::WaitPolicy::block}})
    benchmark::RegisterBenchmark(name, BM_HandOver, policy)
        ->ArgName("wait_us")
        ->Args({50})
        ->Args({500})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  return true;
}();

}  // namespace
