// The hand-over between two ranks: how long an activation of a given size takes from one rank to
// the next, on whatever carries MPI between them (shared memory on one machine; TCP between
// machines, or between network namespaces with scripts/netns-mpirun). Each iteration is a round
// trip; one_way_us is half of one, MB_per_s the bytes of both ways over the time.
//   mpi_pingpong/bytes:N  MPI_Send and MPI_Recv from the program's thread: the wire alone
//   handover/bytes:N      mpi::Backend's send and receive on each rank's device worker, as a
//                         pipeline's transfers run (MPI_Isend; a polled MPI_Irecv into memory
//                         the receiver allocates)
// Both ranks run every benchmark for --round_trips iterations (not a time: the ranks must
// agree), after a few untimed round trips that open the connection; rank 0 prints the results.
// Usage: mpirun -n 2 bench_mpi_handover [--round_trips=200] [Google Benchmark flags]

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gpipe/mpi.hpp>
#include <memory>
#include <string_view>
#include <vector>

#include "support/mpi_flags.hpp"

namespace {

std::unique_ptr<gpipe::mpi::Session> session;  // finalizes MPI after main returns
std::unique_ptr<gpipe::mpi::Backend> backend;  // destroyed before the session
int rank = 0;
constexpr long warmup_round_trips = 5;

// Sets the counters of `round_trips` round trips of `bytes` each way that took `seconds`.
void report(benchmark::State& state, std::size_t bytes, benchmark::IterationCount round_trips,
            double seconds) {
  state.counters["one_way_us"] = seconds / static_cast<double>(2 * round_trips) * 1e6;
  state.counters["MB_per_s"] =
      static_cast<double>(2 * round_trips) * static_cast<double>(bytes) / seconds / 1e6;
}

// (rank 0) -> bytes -> (rank 1) -> the same bytes -> (rank 0), per iteration.
void mpi_pingpong(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> buffer(bytes, 1);
  const int peer = 1 - rank;
  const auto round_trip = [&] {
    const int n = static_cast<int>(bytes);
    if (rank == 0) {
      MPI_Send(buffer.data(), n, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
      MPI_Recv(buffer.data(), n, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buffer.data(), n, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), n, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
    }
  };
  for (long i = 0; i < warmup_round_trips; ++i) round_trip();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) round_trip();
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  report(state, bytes, state.iterations(), seconds.count());
}

// The same round trips through the backend: each iteration queues one on the rank's device worker
// (where each receive waits for its message, as a stage waits for its input) and the last one
// waits for them all, so the loop's time is that of the round trips back to back.
void handover(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeof(float);
  const std::size_t device = static_cast<std::size_t>(rank), peer = 1 - device;
  const gpipe::WorkLabel label{.what = "handover"};
  gpipe::mpi::Backend::Buffer<float> message;  // moved into each send, refilled by each receive
  if (rank == 0) {
    message = backend->allocate<float>(device, count, gpipe::MemoryKind::workspace);
    std::memset(message.data(), 0, bytes);
  }
  const auto queue_round_trip = [&] {
    if (rank == 0) backend->send(device, label, peer, 0, message);
    backend->receive(device, label, peer, 0, message, count, gpipe::MemoryKind::workspace);
    if (rank == 1) backend->send(device, label, peer, 0, message);
  };
  for (long i = 0; i < warmup_round_trips; ++i) queue_round_trip();
  backend->synchronize();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  benchmark::IterationCount queued = 0;
  for (auto _ : state) {
    queue_round_trip();
    if (++queued == state.max_iterations) backend->synchronize();
  }
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  report(state, bytes, state.iterations(), seconds.count());
}

}  // namespace

// Called by the shared benchmark main before Google Benchmark sees the flags.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  session = std::make_unique<gpipe::mpi::Session>(*argc, argv);
  const long round_trips = gpipe::bench::take_count(argc, argv, "round_trips", 200);
  if (round_trips == 0) {
    std::fprintf(stderr, "%s: --round_trips must be a positive number\n", argv[0]);
    return 1;
  }
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    std::fprintf(stderr, "%s: run it on 2 ranks (mpirun -n 2), not %d\n", argv[0], size);
    return 1;
  }
  if (rank != 0) gpipe::bench::quiet(argc, argv);
  backend = std::make_unique<gpipe::mpi::Backend>();
  for (const long bytes : {4L << 10, 256L << 10, 4L << 20}) {
    benchmark::RegisterBenchmark("mpi_pingpong", mpi_pingpong)
        ->ArgName("bytes")
        ->Arg(bytes)
        ->Iterations(round_trips)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (const long bytes : {4L << 10, 256L << 10, 4L << 20}) {
    benchmark::RegisterBenchmark("handover", handover)
        ->ArgName("bytes")
        ->Arg(bytes)
        ->Iterations(round_trips)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  return 0;
}
