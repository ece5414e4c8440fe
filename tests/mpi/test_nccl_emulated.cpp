// The CUDA emulator's NCCL between processes (tests/support/cuda_emulation/nccl_net.hpp), under
// mpirun on 2 and 3 ranks (tests/CMakeLists.txt), bootstrapped as a real program does: rank 0's
// ncclGetUniqueId, MPI_Bcast, ncclCommInitRank. What the multi-process CUDA path will rely on:
// ncclSend/ncclRecv move the bytes between ranks in order; a send completes only once its receive
// has run (NCCL's rendezvous rule), so a program that sends before its peer receives waits;
// ncclAllReduce sums floats to the same bits on every rank; ncclCommAbort ends a receive that
// would never complete, and the peer then sees ncclRemoteError from ncclCommGetAsyncError.
//
// CHECK only (no REQUIRE): a rank that left a test case early would leave the others waiting.

#include "support/cuda_emulation.hpp"
// the emulator first: it defines the CUDA and NCCL functions this program calls

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "support/mpi_test_main.hpp"

namespace {

struct World {
  int rank = 0, size = 0;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

// A communicator over MPI_COMM_WORLD, on emulated GPU rank % 2 (each process has its own
// emulated machine of two GPUs).
ncclComm_t make_comm(const World& w) {
  ncclUniqueId id;
  if (w.rank == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  CHECK(cudaSetDevice(w.rank % 2) == cudaSuccess);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, w.size, id, w.rank) == ncclSuccess);
  return comm;
}

float* device_floats(const std::vector<float>& values) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, values.size() * sizeof(float)) == cudaSuccess);
  CHECK(cudaMemcpyAsync(p, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice,
                        nullptr) == cudaSuccess);
  return static_cast<float*>(p);
}
std::vector<float> host_floats(const float* p, std::size_t n) {
  std::vector<float> out(n);
  CHECK(cudaMemcpyAsync(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, nullptr) ==
        cudaSuccess);  // the null stream: at once, here
  return out;
}

// What rank r sends as its m-th message: distinct per rank, message and element.
std::vector<float> message(int r, int m, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(r * 1000 + m * 100) + 0.25f * i;
  return v;
}

TEST_CASE("send and receive around a ring keep each pair's order") {
  const World w;
  ncclComm_t comm = make_comm(w);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const int next = (w.rank + 1) % w.size, prev = (w.rank + w.size - 1) % w.size;
  constexpr std::size_t n = 1000;
  constexpr int messages = 3;
  std::vector<float*> out, in;
  for (int m = 0; m < messages; ++m) {
    out.push_back(device_floats(message(w.rank, m, n)));
    in.push_back(device_floats(std::vector<float>(n, -1.0f)));
  }
  // In one group per message, so that every rank's send and receive are both issued before any
  // send has to wait for its receive.
  for (int m = 0; m < messages; ++m) {
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(out[m], n, ncclFloat32, next, comm, stream) == ncclSuccess);
    CHECK(ncclRecv(in[m], n, ncclFloat32, prev, comm, stream) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclSuccess);
  }
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  for (int m = 0; m < messages; ++m) CHECK(host_floats(in[m], n) == message(prev, m, n));
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);
  for (float* p : out) cudaFree(p);
  for (float* p : in) cudaFree(p);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("a send completes only once its receive has run") {
  const World w;
  ncclComm_t comm = make_comm(w);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  constexpr std::size_t n = 64;
  float* buffer = device_floats(message(w.rank, 0, n));
  if (w.rank == 0) {
    CHECK(ncclSend(buffer, n, ncclFloat32, 1, comm, stream) == ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);  // rank 1 has not received yet
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (w.rank == 1) CHECK(ncclRecv(buffer, n, ncclFloat32, 0, comm, stream) == ncclSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  if (w.rank == 0) CHECK(cudaStreamQuery(stream) == cudaSuccess);
  if (w.rank == 1) CHECK(host_floats(buffer, n) == message(0, 0, n));
  cudaFree(buffer);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("all-reduce sums in rank order, the same bits on every rank") {
  const World w;
  ncclComm_t comm = make_comm(w);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  constexpr std::size_t n = 4097;
  // values whose float sum depends on the order: 1e8 + 1 - 1e8 is 0 in float, not 1
  std::vector<float> mine(n);
  for (std::size_t i = 0; i < n; ++i)
    mine[i] = w.rank == 0 ? 1e8f : w.rank == 1 ? 1.0f + 0.5f * (i % 7) : -1e8f / (w.size - 2);
  float* values = device_floats(mine);
  CHECK(ncclAllReduce(values, values, n, ncclFloat32, ncclSum, comm, stream) == ncclSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  std::vector<float> expected(n);
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < w.size; ++r)
      sum = r == 0 ? 1e8f : sum + (r == 1 ? 1.0f + 0.5f * (i % 7) : -1e8f / (w.size - 2));
    expected[i] = sum;
  }
  const std::vector<float> got = host_floats(values, n);
  CHECK(got == expected);
  std::vector<float> rank0 = got;
  MPI_Bcast(rank0.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(std::memcmp(rank0.data(), got.data(), n * sizeof(float)) == 0);
  cudaFree(values);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("abort ends a receive that would never complete; the peer sees a remote error") {
  const World w;
  ncclComm_t comm = make_comm(w);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  constexpr std::size_t n = 16;
  const std::vector<float> before(n, -1.0f);
  float* buffer = device_floats(before);
  if (w.rank == 1) {  // waits for a message rank 0 never sends
    CHECK(ncclRecv(buffer, n, ncclFloat32, 0, comm, stream) == ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);
    CHECK(ncclCommAbort(comm) == ncclSuccess);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(host_floats(buffer, n) == before);
  }
  if (w.rank == 0) {  // rank 1's abort closes its connections: a remote error here, soon
    ncclResult_t async = ncclSuccess;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (async == ncclSuccess && std::chrono::steady_clock::now() < deadline) {
      CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(async == ncclRemoteError);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (w.rank != 1) CHECK(ncclCommAbort(comm) == ncclSuccess);
  cudaFree(buffer);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const int failed = gpipe::test::run_mpi_tests(argc, argv);
  MPI_Finalize();
  return failed;
}
