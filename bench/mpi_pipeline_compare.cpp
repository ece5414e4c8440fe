// gpipe's side of the comparison with torch.distributed.pipelining (bench/pytorch_pipeline_step.py
// is PyTorch's side; bench/compare_pipelining.py runs both, alternating, and prints the table).
// A training step of a small GPT on 2 MPI ranks (a rank per stage), and the same step in one
// process (host::Backend) as the references a pipeline on 2 ranks is held against.
//   model   V = 8192, T = 128, D = 384, H = 6, 6 pre-norm blocks, final LayerNorm, untied LM head
//           with bias; batch 8 samples (1024 tokens). The vocabulary is small so that the cut can
//           balance the two stages: with bench_gpt_step's V = 50304 the head alone outweighs the
//           six blocks, which caps any 2-stage pipeline of this model below 1.6x.
//   cut     [embedding, 4 blocks] [2 blocks, LayerNorm, head] (the PyTorch script cuts the same)
//   step    zero_grad (untimed), forward_backward, AdamW (lr 6e-4, betas 0.9 / 0.95, weight decay
//           0.1 on every tensor: torch.optim.AdamW(foreach=False) with those arguments)
//   batch   the same (tokens, targets) every step: gpipe::Rng(2) and (3) draws modulo V, which the
//           PyTorch script draws the same way
// Rows, by world size: on 2 ranks GPipe and 1F1B at M = 4 and 8, ZB-H1 at M = 8; on 1 rank (one
// process, a device thread per stage, no MPI traffic) K = 1 M = 1, then K = 2 with the same three
// schedules.
// Each row: two steps whose losses it reports (first_loss before any update, second_loss after
// one), gpipe::measure_op_costs over 2 traced forward_backward calls, one more step, then --steps
// timed steps.
// Usage: mpirun -n 2 bench_mpi_pipeline_compare [--weights=FILE] [--steps=5]
//                   [--progress=automatic|thread|at_messages] [benchmark flags]
//        bench_mpi_pipeline_compare [...]      (one process: the references)
//   --weights: a safetensors file of the model's parameters under gpipe's names (the PyTorch
//   script's --write-weights writes one); without it, gpipe's initialization from seed 1.
// Counters (times: medians over the timed steps, in ms):
//   step_ms        Trainer::last_step_seconds: earliest rank's first forward_backward to the
//                  latest rank's end of step()
//   compute_ms     last_step().makespan_us: first op start to last op end, over the ranks
//   optimizer_ms   step()'s own time, on the slower rank
//   sim_ms         gpipe::simulate(trainer.schedule(), measured per-device F, B, W costs)
//   predicted_ms   sim_ms + optimizer_ms; vs_predicted = step_ms / predicted_ms (what exceeds 1
//                  is the engine's: hand-overs, the loss, waits; the trace shows where)
//   compute_vs_sim compute_ms / sim_ms; bubble (measured) and sim_bubble
//   f<d>_ms, b<d>_ms, w<d>_ms  device d's measured forward, backward_input, backward_weight
//   first_loss, second_loss

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <gpipe/gpipe.hpp>
#include <gpipe/mpi.hpp>
#include <gpipe/runtime/measure_costs.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "support/mpi_flags.hpp"

namespace {

constexpr std::size_t V = 8192, T = 128, D = 384, H = 6, samples = 8;
using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Norm = gpipe::LayerNorm<D>;
using Head = gpipe::Linear<D, V>;
using Gpt1 =
    gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, Block, Block, Block, Norm, Head>>;
using Gpt2 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, Block>,
                             gpipe::Stage<Block, Block, Norm, Head>>;

std::unique_ptr<gpipe::mpi::Session> session;  // finalizes MPI after main returns
long steps = 5;
std::string weights;
gpipe::mpi::Progress progress = gpipe::mpi::Progress::automatic;

std::vector<std::int32_t> random_tokens(std::uint64_t seed) {
  gpipe::Rng rng(seed);
  std::vector<std::int32_t> out(samples * T);
  for (auto& t : out) t = static_cast<std::int32_t>(rng.next_u64() % V);
  return out;
}

gpipe::optim::AdamW adamw() {
  return gpipe::optim::AdamW({.lr = 6e-4, .beta2 = 0.95, .weight_decay = 0.1});
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The largest of every rank's `value` (MPI_COMM_WORLD; one process: the value).
double max_over_ranks(double value) {
  double out = value;
  MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

template <class Model, class Schedule, class Backend>
void run_steps(benchmark::State& state, Backend& backend) {
  using Trainer = gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, Backend, Schedule>;
  Trainer trainer(backend, {.micro_batches = static_cast<std::size_t>(state.range(0)), .seed = 1});
  if (!weights.empty()) trainer.load(weights);
  const std::vector<std::int32_t> x = random_tokens(2), y = random_tokens(3);
  float losses[2] = {0, 0};
  for (float& loss : losses) {  // the losses the PyTorch script prints; also the warm-up
    trainer.zero_grad();
    loss = trainer.forward_backward(x, y);
    trainer.step(adamw());
  }
  const std::vector<gpipe::OpCosts> costs = gpipe::measure_op_costs(trainer, x, y, 2);
  const gpipe::SimulationResult sim = gpipe::simulate(trainer.schedule(), costs);
  // last_step_seconds counts from the first forward_backward after the last step(): without a
  // step here, measure_op_costs's forward_backward calls would be part of the first timed step
  trainer.zero_grad();
  trainer.forward_backward(x, y);
  trainer.step(adamw());

  std::vector<double> step_s, compute_s, optimizer_s, bubble;
  for (auto _ : state) {
    trainer.zero_grad();
    benchmark::DoNotOptimize(trainer.forward_backward(x, y));
    const auto start = std::chrono::steady_clock::now();
    trainer.step(adamw());
    const double optimizer =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    step_s.push_back(trainer.last_step_seconds());  // collective: no barriers around the step
    optimizer_s.push_back(max_over_ranks(optimizer));
    compute_s.push_back(trainer.last_step().makespan_us * 1e-6);
    bubble.push_back(trainer.last_step().bubble_fraction);
  }
  const double sim_ms = sim.makespan * 1e-3;  // OpCosts are in microseconds
  const double step_ms = 1e3 * median(step_s), optimizer_ms = 1e3 * median(optimizer_s);
  auto& c = state.counters;
  c["step_ms"] = step_ms;
  c["compute_ms"] = 1e3 * median(compute_s);
  c["optimizer_ms"] = optimizer_ms;
  c["sim_ms"] = sim_ms;
  c["predicted_ms"] = sim_ms + optimizer_ms;
  c["vs_predicted"] = step_ms / (sim_ms + optimizer_ms);
  c["compute_vs_sim"] = 1e3 * median(compute_s) / sim_ms;
  c["bubble"] = median(bubble);
  c["sim_bubble"] = sim.bubble_fraction;
  for (std::size_t d = 0; d < costs.size(); ++d) {
    const std::string n = std::to_string(d);
    c["f" + n + "_ms"] = costs[d].forward * 1e-3;
    c["b" + n + "_ms"] = costs[d].backward_input * 1e-3;
    c["w" + n + "_ms"] = costs[d].backward_weight * 1e-3;
  }
  c["first_loss"] = losses[0];
  c["second_loss"] = losses[1];
}

template <class Schedule>
void BM_TwoRanks(benchmark::State& state) {
  gpipe::mpi::Backend backend(MPI_COMM_WORLD, {.progress = progress});
  state.counters["progress_thread"] = backend.progress_thread() ? 1 : 0;
  run_steps<Gpt2, Schedule>(state, backend);
}

template <class Model, class Schedule>
void BM_OneProcess(benchmark::State& state) {
  gpipe::host::Backend backend(Model::num_stages, {.threads_per_device = 1});
  run_steps<Model, Schedule>(state, backend);
}

// Takes --steps=N, --weights=FILE and --progress=automatic|thread|at_messages out of argv;
// false for a bad --steps or --progress.
bool take_flags(int* argc, char** argv) {
  steps = gpipe::bench::take_count(argc, argv, "steps", steps);
  int out = 1;
  bool good = true;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--weights=")) {
      weights = std::string(arg.substr(10));
    } else if (arg.starts_with("--progress=")) {
      const std::string_view p = arg.substr(11);
      progress = p == "thread"        ? gpipe::mpi::Progress::thread
                 : p == "at_messages" ? gpipe::mpi::Progress::at_messages
                                      : gpipe::mpi::Progress::automatic;
      good = good && (p == "thread" || p == "at_messages" || p == "automatic");
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return steps > 0 && good;
}

void add(const char* name, void (*bench)(benchmark::State&), std::int64_t m) {
  benchmark::RegisterBenchmark(name, bench)
      ->ArgName("M")
      ->Arg(m)
      ->Iterations(steps)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags: MPI, this
// program's flags, and the rows of this world size (every rank runs each for --steps
// iterations: the ranks must agree on the count).
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  session = std::make_unique<gpipe::mpi::Session>(*argc, argv);
  if (!take_flags(argc, argv)) {
    std::fprintf(stderr,
                 "%s: --steps must be a positive number, --progress automatic, thread or "
                 "at_messages\n",
                 argv[0]);
    return 1;
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != 0) gpipe::bench::quiet(argc, argv);
  if (size == 2) {
    add("BM_TwoRanks<GPipe>", BM_TwoRanks<gpipe::GPipe>, 4);
    add("BM_TwoRanks<1F1B>", BM_TwoRanks<gpipe::OneFOneB>, 4);
    add("BM_TwoRanks<GPipe>", BM_TwoRanks<gpipe::GPipe>, 8);
    add("BM_TwoRanks<1F1B>", BM_TwoRanks<gpipe::OneFOneB>, 8);
    add("BM_TwoRanks<ZB-H1>", BM_TwoRanks<gpipe::ZeroBubbleH1>, 8);
  } else if (size == 1) {
    add("BM_OneProcess<K:1>", BM_OneProcess<Gpt1, gpipe::OneFOneB>, 1);
    add("BM_OneProcess<K:2,GPipe>", BM_OneProcess<Gpt2, gpipe::GPipe>, 4);
    add("BM_OneProcess<K:2,1F1B>", BM_OneProcess<Gpt2, gpipe::OneFOneB>, 4);
    add("BM_OneProcess<K:2,ZB-H1>", BM_OneProcess<Gpt2, gpipe::ZeroBubbleH1>, 8);
  } else {
    std::fprintf(stderr, "%s: run it on 2 ranks (mpirun -n 2) or in one process, not %d\n", argv[0],
                 size);
    return 1;
  }
  return 0;
}
