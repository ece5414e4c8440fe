// The MPI backend under mpirun (tests/CMakeLists.txt runs it on 2, 3 and 4 ranks). What every
// MPI backend gives is written once in support/mpi_conformance.hpp; here against host::Backend:
// with one rank per device, every schedule gives bit for bit the loss, the gradients of each rank's
// own stages, the predictions and the parameters after an optimizer step that the same Trainer
// gives in one process on the host backend with as many devices; save writes the one-process file
// byte for byte; a stage of another rank is a clear error. With data-parallel replicas (R x K
// ranks) two steps without zero_grad, their losses and every rank's gradients match the one
// process run on the whole batch (to float rounding: the sums run in another order). A throw on
// rank 1 at micro-batch 2 ends the step on every rank with one Error naming rank, stage,
// micro-batch and the original message, and the next step runs normally; so does a failure
// while a rank issues its step (its loss buffer out of memory), bad input on one rank alone
// (its targets, then predict's input), and a throw in one replica of two (the replicas' gradient
// sums stay in step). A trainer whose parameters (or their bf16 copy) do not fit on one rank
// throws OutOfMemory on every rank as it is built, and the ranks stay together. One merged trace of
// every rank runs on one clock (a message's receiver starts after its sender ended) and shows each
// rank's gradient sum over the replicas after its stage's last W; every rank's last_step() is the
// whole pipeline's. ZeRO-1 (shard_optimizer) gives the unsharded parameters bit for bit with half
// the optimizer state per rank and the same checkpoint files. Packed documents and ignored targets
// give the one-process step, with replicas too. gpipe::plan for two stages per rank gives every
// rank one plan, also where measuring runs out of memory, and its trainer the one-process steps. A
// rank whose threads_per_device exceed its cores says so on stderr. With GPIPE_MPI_KILL_RANK=1 in
// the environment, rank 1 kills itself in the middle of a step instead: CTest expects mpirun to end
// the job with a failure, soon (tests/CMakeLists.txt). A rank that stops sending, for a while or
// for good (GPIPE_MPI_STUCK_RANK=1): support/mpi_deadlines.hpp.
//
// Each rank runs the one-process reference itself (same seed, same data), so nothing but the
// checked values crosses between ranks. CHECK only (no REQUIRE): a rank that left a test case
// early would leave the others waiting in a collective.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "gpipe/mpi.hpp"
#include "gpipe/runtime/plan.hpp"
#include "support/faulty_layer.hpp"
#include "support/locate_non_finite.hpp"
#include "support/models.hpp"
#include "support/mpi_conformance.hpp"
#include "support/mpi_deadlines.hpp"
#include "support/relative_error.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;
using namespace gpipe::test::mpi_conformance;

}  // namespace

TEST_CASE("a tie between the first and the last rank's stages: one tensor, both gradients") {
  mpi::Backend backend;
  check_ties_across_ranks<mpi::Backend, host::Backend>(backend);
}

TEST_CASE("a tie across ranks with data-parallel replicas: one process's gradients and step") {
  check_tie_with_replicas<mpi::Backend, host::Backend>();
}

TEST_CASE("a checkpoint saved by the ranks loads into one process and back, bit for bit") {
  mpi::Backend backend;
  check_checkpoints_on_ranks<mpi::Backend, host::Backend>(backend);
}

TEST_CASE("a checkpoint save that fails on rank 1 alone fails on every rank; the previous stays") {
  mpi::Backend backend;
  if (backend.num_devices() == 2) check_save_failing_on_one_rank<Model2>(backend);
  if (backend.num_devices() == 3) check_save_failing_on_one_rank<Model3>(backend);
  if (backend.num_devices() == 4) check_save_failing_on_one_rank<Model4>(backend);
}

TEST_CASE("a throw on rank 1 ends the step on every rank with its error; the next step runs") {
  mpi::Backend backend;
  if (backend.num_devices() != 3) return;  // FaultyModel has three stages
  check_fault_ends_the_step_everywhere<GPipe, mpi::Backend, host::Backend>(backend);
  check_fault_ends_the_step_everywhere<OneFOneB, mpi::Backend, host::Backend>(backend);
}

TEST_CASE("locate_non_finite: every rank names the same stage, tensor and micro-batch") {
  {
    mpi::Backend backend;
    if (backend.num_devices() != 3) return;  // NanModel has three stages
  }
  check_locate_non_finite<GPipe, Fp32, mpi::Backend>([] { return mpi::Backend(); });
  check_locate_non_finite<OneFOneB, MixedBf16, mpi::Backend>([] { return mpi::Backend(); });
}

TEST_CASE("a failure while one rank issues its part of a step ends the step on every rank") {
  const std::vector<float> x = random_inputs(faulty_batch, 4, 1);
  const std::vector<std::int32_t> y = random_classes(faulty_batch, 3, 2);
  using Faulty = Trainer<FaultyModel, SoftmaxCrossEntropy, mpi::Backend, OneFOneB>;
  // What the last stage's rank holds once the trainer is built: its parameters and gradients.
  std::size_t built = 0;
  {
    mpi::Backend backend;
    if (backend.num_devices() != 3) return;  // FaultyModel has three stages
    Faulty trainer(backend, {.micro_batches = faulty_micro_batches, .seed = 1});
    built = backend.memory_stats(backend.device()).current;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Rank 2 has room for one float more: the step's loss buffer (a float per micro-batch, taken
  // by the thread that issues the step, before any work runs) does not fit.
  mpi::Backend backend(MPI_COMM_WORLD, {.device_capacity = rank == 2 ? built + sizeof(float) : 0});
  Faulty trainer(backend, {.micro_batches = faulty_micro_batches, .seed = 1});
  const std::string message = error_of([&] { (void)trainer.forward_backward(x, y); });
  CAPTURE(rank);
  CAPTURE(message);
  CHECK(message.starts_with("gpipe: rank 2 failed: "));
  CHECK(message.find("exceeds the capacity") != std::string::npos);
}

// Building a trainer where the last rank's device cannot hold its stages' parameters and
// gradients (Fp32), or their bf16 copy (MixedBf16): OutOfMemory on every rank, none left waiting,
// and the ranks still go on together. (Trainer types that the conformance cases compile anyway.)
template <class Model, class Kind, class Precision>
void check_trainer_out_of_memory_on_one_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int last = static_cast<int>(Model::num_stages) - 1;
  std::size_t built = 0;  // what the last rank holds once an Fp32 trainer is built
  {
    mpi::Backend backend;
    Trainer<Model, SoftmaxCrossEntropy, mpi::Backend, Kind> trainer(backend, {.micro_batches = 2});
    built = backend.memory_stats(backend.device()).current;
  }
  const std::size_t cap =
      std::is_same_v<Precision, Fp32> ? built - sizeof(float) : built + sizeof(float);
  mpi::Backend backend(MPI_COMM_WORLD, {.device_capacity = rank == last ? cap : 0});
  bool out_of_memory = false;
  std::string message;
  try {
    Trainer<Model, SoftmaxCrossEntropy, mpi::Backend, Kind, Precision> trainer(
        backend, {.micro_batches = 2});
  } catch (const OutOfMemory& e) {
    out_of_memory = true;
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  }
  CAPTURE(rank);
  CAPTURE(message);
  CHECK(out_of_memory);
  if (rank == last)
    CHECK(message.find("exceeds the capacity") != std::string::npos);
  else
    CHECK(message ==
          "gpipe: another process ran out of memory: it could not allocate its stages' "
          "parameters and gradients (its error says how much)");
  CHECK(!backend.lost_peers());
  CHECK(backend.all_succeeded(true));
}

TEST_CASE("a trainer that does not fit on one rank: OutOfMemory on every rank, none waiting") {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 2) check_trainer_out_of_memory_on_one_rank<Model2, OneFOneB, Fp32>();
  if (size == 2) check_trainer_out_of_memory_on_one_rank<Model2, OneFOneB, MixedBf16>();
  if (size == 3) check_trainer_out_of_memory_on_one_rank<Model3, OneFOneB, Fp32>();
  if (size == 4) check_trainer_out_of_memory_on_one_rank<Model4, GPipe, MixedBf16>();
}

TEST_CASE("a training step's wall time over all ranks, from the trainer") {
  mpi::Backend backend;
  check_step_wall_times(backend);
}

TEST_CASE("bad input on one rank alone ends the step on every rank with its error") {
  mpi::Backend backend;
  check_inputs_refused_on_one_rank<mpi::Backend, host::Backend>(backend);
}

TEST_CASE("bad input on one rank of one replica: the replicas' gradient sums stay in step") {
  check_input_refused_in_one_replica<mpi::Backend, host::Backend>();
}

TEST_CASE("one trace and one step timing for all ranks, on one clock") {
  mpi::Backend backend;
  const std::size_t K = backend.num_devices();
  if (K != 2 && K != 4) return;
  const std::vector<float> x = random_inputs(rows, Model4::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(rows, Model4::out_features, 11);
  const auto check = [&]<class Model>(Model*) {
    constexpr std::size_t M = 4;
    Trainer<Model, SoftmaxCrossEntropy, mpi::Backend, OneFOneB> trainer(
        backend, {.micro_batches = M, .seed = seed});
    backend.set_tracing(true);
    (void)trainer.forward_backward(x, y);
    backend.set_tracing(false);
    const std::vector<TraceEvent> events = backend.take_trace();
    // every rank has every rank's forwards and backwards
    std::vector<std::vector<const TraceEvent*>> forward(K, std::vector<const TraceEvent*>(M));
    std::vector<std::vector<const TraceEvent*>> backward(K, std::vector<const TraceEvent*>(M));
    for (const TraceEvent& e : events) {
      if (e.label.what == "forward") forward.at(e.device).at(e.label.micro_batch) = &e;
      if (e.label.what == "backward_input") backward.at(e.device).at(e.label.micro_batch) = &e;
      if (e.label.compute) CHECK(e.label.stage == e.device);
    }
    // One clock: a stage's op of a micro-batch starts after the op it waits for on another
    // rank ended (its message was sent after that), within the two ranks' clock errors (0 on one
    // machine; over TCP between network namespaces, half a round trip each).
    std::vector<double> error(K);
    const double mine_error = backend.clock_error_us();
    MPI_Allgather(&mine_error, 1, MPI_DOUBLE, error.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
    CHECK(error[0] == 0);
    for (std::size_t d = 0; d < K; ++d) {
      CAPTURE(error[d]);
      CHECK(error[d] >= 0);
      CHECK(error[d] < 5000);  // a round trip of 10 ms: the alignment failed
    }
    for (std::size_t d = 0; d < K; ++d) {
      for (std::size_t mb = 0; mb < M; ++mb) {
        CAPTURE(d);
        CAPTURE(mb);
        CHECK(forward[d][mb] != nullptr);
        CHECK(backward[d][mb] != nullptr);
        if (forward[d][mb] == nullptr || backward[d][mb] == nullptr) continue;
        if (d > 0 && forward[d - 1][mb] == nullptr) continue;
        if (d + 1 < K && backward[d + 1][mb] == nullptr) continue;
        if (d > 0)
          CHECK(forward[d][mb]->start_us >= forward[d - 1][mb]->end_us - error[d] - error[d - 1]);
        if (d + 1 < K)
          CHECK(backward[d][mb]->start_us >= backward[d + 1][mb]->end_us - error[d] - error[d + 1]);
      }
    }
    // every rank reports the whole pipeline's step, the same on all
    const auto& step = trainer.last_step();
    CHECK(step.devices.size() == K);
    double mine[2] = {step.makespan_us, step.busy_us}, first[2] = {mine[0], mine[1]};
    MPI_Bcast(first, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    CHECK(mine[0] == first[0]);
    CHECK(mine[1] == first[1]);
    for (const ComputeTiming& t : step.devices) CHECK(t.ops == 3 * M);
    CHECK(step.bubble_fraction > 0);
    CHECK(step.bubble_fraction < 1);
  };
  if (K == 2) check(static_cast<Model2*>(nullptr));
  if (K == 4) check(static_cast<Model4*>(nullptr));
}

TEST_CASE("every schedule over MPI gives the one-process step bit for bit") {
  mpi::Backend backend;
  check_every_schedule<mpi::Backend, host::Backend>(backend);
}

// gpipe::plan for 4 stages on 2 ranks (two stages per rank). Measuring under a cap that a
// micro-batch count exceeds on every rank: each rank's step runs out of memory, and since the
// agreement keeps it an OutOfMemory on every rank, every rank leaves that count out alike (a
// plain Error would end the planner). Then: every rank gets the same plan, and the trainer built
// from it gives the one-process trainer's steps bit for bit.
TEST_CASE("the two-chunk planner over MPI: one plan on every rank, the one-process steps") {
  mpi::Backend backend;
  if (backend.num_devices() != 2) return;
  using Loss = SoftmaxCrossEntropy;
  constexpr std::size_t batch = 64;
  const std::vector<float> x = random_inputs(batch, Model4::in_features, 33);
  const std::vector<std::int32_t> y = random_classes(batch, Model4::out_features, 34);
  CAPTURE(backend.rank());
  // this rank's peak under Remat::always at M 1 and M 8, with the measuring trainer's schedule
  const auto peak_at = [&](std::size_t m) {
    Trainer<Model4, Loss, mpi::Backend, Interleaved<2>> trainer(
        backend, {.micro_batches = m, .remat = Remat::always});
    backend.reset_peak();
    (void)trainer.forward_backward(x, y);
    return backend.memory_stats(backend.device()).peak;
  };
  const std::size_t whole = peak_at(1), eighth = peak_at(8);
  CHECK(eighth < whole);
  mpi::Backend capped(MPI_COMM_WORLD, {.device_capacity = (whole + eighth) / 2});
  const std::vector<PlanCosts> costs =
      measure_plan_costs<Model4, Loss>(capped, x, y, {.micro_batches = {1, 8}, .measure_steps = 1});
  CHECK(costs.size() == 1);  // M 1 ran out of memory on every rank, even recomputing
  if (costs.size() == 1) CHECK(costs[0].micro_batches == 8);

  const Plan plan =
      gpipe::plan<Model4, Loss>(backend, x, y, {.micro_batches = {2, 4}, .measure_steps = 1});
  CHECK(plan.chunks_per_device() == 2);
  // the same plan on every rank: rank 0's description, sent to all
  const std::string mine = plan.describe();
  std::string first = mine;
  int length = static_cast<int>(first.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  first.resize(static_cast<std::size_t>(length));
  MPI_Bcast(first.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  CHECK(mine == first);

  using Planned = Trainer<Model4, Loss, mpi::Backend, PlannedSchedule<2>>;
  using OneProcess = Trainer<Model4, Loss, host::Backend, PlannedSchedule<2>>;
  Planned::Options options = plan;
  OneProcess::Options one_process_options = plan;
  options.seed = one_process_options.seed = seed;
  Planned trainer(backend, options);
  CHECK(trainer.schedule() == plan.schedule);
  host::Backend one_process(2);
  OneProcess reference(one_process, one_process_options);
  const optim::SGD sgd({.lr = 0.1});
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    CHECK(trainer.forward_backward(x, y) == reference.forward_backward(x, y));
    for (const ParameterInfo& info : trainer.parameter_info())
      if (backend.is_local(trainer.device_of_stage(info.stage))) {
        CAPTURE(info.name);
        CHECK(trainer.gradient(info.name) == reference.gradient(info.name));
      }
    trainer.step(sgd);
    reference.step(sgd);
    trainer.zero_grad();
    reference.zero_grad();
  }
  for (const ParameterInfo& info : trainer.parameter_info())
    if (backend.is_local(trainer.device_of_stage(info.stage))) {
      CAPTURE(info.name);
      CHECK(trainer.parameter(info.name) == reference.parameter(info.name));
    }
}

TEST_CASE("a rank's device with a team of threads runs every schedule, and says so") {
  // The split itself is the host backend's, tested there (tests/backend/host, tests/runtime).
  mpi::Backend backend(MPI_COMM_WORLD, {.threads_per_device = 2});
  CHECK(backend.threads_per_device() == 2);
  // the rank's own cores (its affinity mask, which mpirun may narrow), not the machine's
  CHECK(backend.devices_share_cores(1) == (host::usable_cores() < 2));
  check_every_schedule<mpi::Backend, host::Backend>(backend);
}

TEST_CASE(
    "a rank whose threads outnumber its cores says so on stderr, once; one that fits does not") {
  // what the backend writes to stderr while it is built, read back from a temporary file
  const auto stderr_of = [](std::size_t threads) {
    std::fflush(stderr);
    const int saved = dup(2);
    std::FILE* file = std::tmpfile();
    dup2(fileno(file), 2);
    { mpi::Backend backend(MPI_COMM_WORLD, {.threads_per_device = threads}); }
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::rewind(file);
    std::string text;
    for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) text += static_cast<char>(c);
    std::fclose(file);
    return text;
  };
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::size_t cores = host::usable_cores();
  const std::string too_many = stderr_of(cores + 1);
  CAPTURE(too_many);
  CHECK(too_many.starts_with("gpipe: rank " + std::to_string(rank) +
                             ": threads_per_device = " + std::to_string(cores + 1) +
                             ", but this rank may run on " + std::to_string(cores) + " core(s)"));
  CHECK(too_many.find("--bind-to none, or --map-by slot:PE=" + std::to_string(cores + 1)) !=
        std::string::npos);
  CHECK(std::count(too_many.begin(), too_many.end(), '\n') == 1);
  CHECK(stderr_of(1).empty());
}

TEST_CASE("packed documents and ignored targets over MPI give the one-process step") {
  mpi::Backend backend;
  check_packed_documents<mpi::Backend, host::Backend>(backend);
}

TEST_CASE("data-parallel replicas of a pipeline give the one-process step on the whole batch") {
  check_replicas<mpi::Backend, host::Backend>();
}

TEST_CASE("a failed data-parallel step leaves the gradient sums in step: the next one is right") {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) return;  // 2 replicas x 2 devices
  using Model = Pipeline<Stage<Linear<4, 8>, ReLU>,
                         Stage<Linear<8, 8>, FaultyIdentity<8>, ReLU, Linear<8, 3>>>;
  // Shares of 6 and 5 rows, micro-batches of 2, 2, 2 and 2, 2, 1: only replica 1 fails, so
  // replica 0 may finish its part and start its gradient sums, which replica 1 must then join.
  constexpr std::size_t batch = 11;
  const std::vector<float> x = random_inputs(batch, 4, 1);
  const std::vector<std::int32_t> y = random_classes(batch, 3, 2);
  mpi::Backend backend(MPI_COMM_WORLD, {.data_parallel = 2});
  for (Fault fault : {Fault::forward, Fault::backward_input}) {
    CAPTURE(backend.rank());
    CAPTURE(static_cast<int>(fault));
    Trainer<Model, SoftmaxCrossEntropy, mpi::Backend, OneFOneB> trainer(
        backend, {.micro_batches = faulty_micro_batches, .seed = 1});
    host::Backend one_process(2);
    Trainer<Model, SoftmaxCrossEntropy, host::Backend, OneFOneB> reference(
        one_process, {.micro_batches = faulty_micro_batches, .seed = 1});
    // a first, good step, so that gradients are set aside during the failed one
    (void)trainer.forward_backward(x, y);
    injected_fault = fault;
    const std::string message = error_of([&] { (void)trainer.forward_backward(x, y); });
    injected_fault = Fault::none;
    CAPTURE(message);
    CHECK(message.starts_with("gpipe: rank 3 failed: stage 1 (device 1), micro-batch 2, "));
    // Gradients after a failed step are unspecified; from zero, two steps equal one process's.
    trainer.zero_grad();
    check_two_steps(backend, trainer, reference, x, y);
  }
}

TEST_CASE("the merged trace shows each rank's gradient sum over the replicas, after its last W") {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) return;  // 2 replicas x 2 devices
  mpi::Backend backend(MPI_COMM_WORLD, {.data_parallel = 2});
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 27);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 28);
  Trainer<Model2, SoftmaxCrossEntropy, mpi::Backend, OneFOneB> trainer(
      backend, {.micro_batches = 4, .seed = seed});
  (void)trainer.forward_backward(x, y);  // untraced: nothing of it is kept
  backend.set_tracing(true);
  (void)trainer.forward_backward(x, y);
  backend.set_tracing(false);
  const std::vector<TraceEvent> events = backend.take_trace();
  for (std::size_t rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const TraceEvent* last_w = nullptr;
    std::vector<const TraceEvent*> sums;
    for (const TraceEvent& e : events) {
      if (e.device != rank) continue;
      if (e.label.what == "backward_weight" && (last_w == nullptr || e.end_us > last_w->end_us))
        last_w = &e;
      if (e.label.background) sums.push_back(&e);
    }
    CHECK(last_w != nullptr);
    CHECK(sums.size() == 1);  // one stage per rank: one sum, traced once
    if (last_w == nullptr || sums.size() != 1) continue;
    CHECK(sums[0]->label.what == "all-reduce gradients");
    CHECK(sums[0]->label.stage == rank % 2);
    CHECK(!sums[0]->label.compute);
    CHECK(sums[0]->start_us >= last_w->end_us);  // started once its stage's last W was done
    CHECK(sums[0]->end_us >= sums[0]->start_us);
  }
}

TEST_CASE(
    "ZeRO-1: a sharded optimizer gives the unsharded steps bit for bit with 1/R of its state") {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) return;  // 2 replicas x 2 devices
  mpi::Backend sharded(MPI_COMM_WORLD, {.data_parallel = 2, .shard_optimizer = true});
  mpi::Backend whole(MPI_COMM_WORLD, {.data_parallel = 2});
  CHECK(sharded.shards_optimizer());
  CHECK(!whole.shards_optimizer());
  CHECK(!mpi::Backend(MPI_COMM_WORLD, {.shard_optimizer = true}).shards_optimizer());  // R = 1
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 29);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 30);
  using Trainer2 = Trainer<Model2, SoftmaxCrossEntropy, mpi::Backend, OneFOneB>;
  Trainer2 a(sharded, {.micro_batches = 2, .seed = seed});
  Trainer2 b(whole, {.micro_batches = 2, .seed = seed});
  const auto step = [&](Trainer2& trainer, const auto& optimizer) {
    trainer.zero_grad();
    (void)trainer.forward_backward(x, y);
    trainer.step(optimizer);
  };
  const auto same = [&] {
    for (const ParameterInfo& info : a.parameter_info()) {
      if (!sharded.is_local(a.device_of_stage(info.stage))) continue;
      CAPTURE(info.name);
      CHECK(a.parameter(info.name) == b.parameter(info.name));
    }
  };
  CAPTURE(sharded.rank());
  // AdamW with decay of matrices only (a share cuts tensors: each part keeps its group)
  const optim::AdamW adamw({.lr = 1e-2, .weight_decay = 0.1, .decay = optim::Decay::matrices});
  for (int i = 0; i < 3; ++i) {
    step(a, adamw);
    step(b, adamw);
  }
  same();
  // the state of this replica's share of its stage only: 2 planes of about n / 2
  std::size_t n = 0;
  for (const ParameterInfo& info : a.parameter_info())
    if (sharded.is_local(a.device_of_stage(info.stage))) n += info.size;
  const auto [first, last] = detail::replica_share(n, 2, sharded.replica());
  const auto state_bytes = [](const mpi::Backend& backend) {
    return backend.memory_stats(backend.device()).current_of(MemoryKind::optimizer_state);
  };
  CHECK(state_bytes(whole) == 2 * n * sizeof(float));
  CHECK(state_bytes(sharded) == 2 * (last - first) * sizeof(float));
  CHECK(last - first <= n / 2 + 1);
  // a checkpoint of the sharded state is the unsharded one's, file for file; each loads into
  // the other trainer, which continues as the other did
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "gpipe_mpi_zero1";
  const std::filesystem::path dir_a = dir / "a", dir_b = dir / "b";
  if (sharded.rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  a.save_checkpoint(dir_a);
  b.save_checkpoint(dir_b);
  MPI_Barrier(MPI_COMM_WORLD);
  for (const char* file : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"}) {
    CAPTURE(file);
    CHECK(!file_bytes(dir_a / file).empty());
    CHECK(file_bytes(dir_a / file) == file_bytes(dir_b / file));
  }
  a.load_checkpoint(dir_b);
  b.load_checkpoint(dir_a);
  step(a, adamw);
  step(b, adamw);
  same();
  // another optimizer restarts the state, sharded too
  const optim::SGD sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
  for (int i = 0; i < 2; ++i) {
    step(a, sgd);
    step(b, sgd);
  }
  same();
  CHECK(state_bytes(sharded) == (last - first) * sizeof(float));
  MPI_Barrier(MPI_COMM_WORLD);
  if (sharded.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("the backend from argc and argv: the world, and a replica count that does not fit") {
  int argc = 1;
  char name[] = "test_mpi_pipeline";
  char* args[] = {name, nullptr};
  char** argv = args;
  mpi::Backend backend(argc, argv);  // MPI is up already: it is left to main's Session
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CHECK(backend.world_size() == static_cast<std::size_t>(size));
  CHECK(backend.num_devices() == static_cast<std::size_t>(size));
  CHECK(backend.rank() == static_cast<std::size_t>(rank));
  CHECK_THROWS_WITH_AS(mpi::Backend(argc, argv, {.data_parallel = backend.world_size() + 1}),
                       doctest::Contains("which is not data_parallel"), Error);
  const std::size_t other = (backend.rank() + 1) % backend.num_devices();
  CHECK_THROWS_WITH_AS((void)backend.allocate<float>(other, 4),
                       doctest::Contains("belongs to rank"), Error);
}

TEST_CASE("a model whose device count differs from the world size is a clear error") {
  mpi::Backend backend;
  using Five = Pipeline<Stage<L0>, Stage<L1>, Stage<L2>, Stage<L3>, Stage<L4>>;
  CHECK_THROWS_WITH_AS((Trainer<Five, SoftmaxCrossEntropy, mpi::Backend>(backend, {})),
                       doctest::Contains("backend has only"), Error);
}

// A Llama (TokenEmbedding, LlamaBlocks, RMSNorm, a bias-free head) on 2 or 4 ranks: the loss and
// each rank's gradients are one process's bit for bit, in Fp32 and MixedBf16, and the file saved
// under Hugging Face's names is one process's byte for byte.
template <class Model, class Precision>
void check_llama_on_ranks(mpi::Backend& backend) {
  constexpr std::size_t V = Model::vocab_size, T = Model::tokens_per_sample;
  const std::vector<std::int32_t> tokens = random_classes(3 * T, V, 5);
  const std::vector<std::int32_t> targets = random_classes(3 * T, V, 6);
  for (Remat remat : {Remat::never, Remat::always}) {
    CAPTURE(to_string(remat));
    CAPTURE(backend.rank());
    host::Backend one_process(Model::num_stages);
    Trainer<Model, SoftmaxCrossEntropy, host::Backend, OneFOneB, Precision> reference(
        one_process, {.micro_batches = 3, .remat = remat, .seed = seed});
    Trainer<Model, SoftmaxCrossEntropy, mpi::Backend, OneFOneB, Precision> trainer(
        backend, {.micro_batches = 3, .remat = remat, .seed = seed});
    CHECK(trainer.forward_backward(tokens, targets) == reference.forward_backward(tokens, targets));
    for (const ParameterInfo& info : trainer.parameter_info())
      if (backend.is_local(trainer.device_of_stage(info.stage))) {
        CAPTURE(info.name);
        CHECK(trainer.gradient(info.name) == reference.gradient(info.name));
      }
    const std::string name = "llama_" + std::to_string(Model::num_stages) + ".safetensors";
    trainer.save(name, hf_llama_names<Model>());
    if (backend.rank() == 0) {
      reference.save("reference_" + name, hf_llama_names<Model>());
      CHECK(file_bytes(name) == file_bytes("reference_" + name));
    }
    MPI_Barrier(backend.communicator());
  }
}

TEST_CASE("a Llama over MPI gives the one-process step bit for bit, Fp32 and MixedBf16") {
  constexpr std::size_t V = 11, T = 8, D = 16, H = 4, KVH = 2, F = 24;
  using Emb = TokenEmbedding<V, T, D>;
  using Block = LlamaBlock<D, H, KVH, F>;
  using Tail = Stage<RMSNorm<D>, Linear<D, V, false>>;
  using Llama2 = Pipeline<Stage<Emb, Block>, Stage<Block, RMSNorm<D>, Linear<D, V, false>>>;
  using Llama4 = Pipeline<Stage<Emb>, Stage<Block>, Stage<Block>, Tail>;
  mpi::Backend backend;
  if (backend.num_devices() == 2) {
    check_llama_on_ranks<Llama2, Fp32>(backend);
    check_llama_on_ranks<Llama2, MixedBf16>(backend);
  }
  if (backend.num_devices() == 4) {
    check_llama_on_ranks<Llama4, Fp32>(backend);
    check_llama_on_ranks<Llama4, MixedBf16>(backend);
  }
}

TEST_CASE(
    "a rank that stops sending mid-step past peer_timeout: every rank ends the step with an "
    "Error naming what waited and the silent rank, and the next step runs") {
  mpi_deadlines::check_stalled_rank<mpi::Backend, host::Backend, OneFOneB>();
  CHECK_THROWS_AS(mpi::Backend(MPI_COMM_WORLD, {.peer_timeout = std::chrono::milliseconds(0)}),
                  Error);
}

TEST_CASE("a progress thread per rank (Progress::thread) gives the one-process steps bit for bit") {
  mpi::Backend backend(MPI_COMM_WORLD, {.progress = mpi::Progress::thread});
  CHECK(backend.progress_thread());
  if (backend.num_devices() != 2) return;
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 31);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 32);
  Trainer<Model2, SoftmaxCrossEntropy, mpi::Backend, GPipe> trainer(
      backend, {.micro_batches = 4, .seed = seed});
  host::Backend one_process(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend, GPipe> reference(
      one_process, {.micro_batches = 4, .seed = seed});
  check_two_steps(backend, trainer, reference, x, y);
}

int main(int argc, char** argv) {
  mpi::Session session(argc, argv);
  if (run_killed_rank_step<mpi::Backend>()) return 0;  // see the top of this file
  if (mpi_deadlines::run_stuck_rank_step<mpi::Backend>()) return 0;
  if (mpi_deadlines::run_throw_between_steps<mpi::Backend>()) return 0;
  return run_mpi_tests(argc, argv);
}
