#pragma once
// The emulated NCCL: ncclCommInitAll over the emulated GPUs of this process, whose
// ncclSend/ncclRecv pairs of one group meet on their streams; and communicators between processes
// (ncclGetUniqueId, ncclCommInitRank: ncclSend, ncclRecv, ncclAllReduce with ncclSum on floats,
// ncclCommAbort, ncclCommGetAsyncError), whose ranks talk over sockets (nccl_net.hpp).

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/cuda_emulation/nccl_net.hpp"
#include "support/cuda_emulation/runtime.hpp"

#ifndef GPIPE_CUDA_NCCL
#define GPIPE_CUDA_NCCL 1  // the emulator provides NCCL
#endif

struct ncclComm {
  int rank, ranks, gpu;
  // Set for a communicator between processes (ncclCommInitRank); its operations hold it too.
  std::shared_ptr<gpipe::test::cuda_emulation::RankNet> net = nullptr;
};

namespace gpipe::test::cuda_emulation {

// NCCL: the operations of the group being built on this thread.
struct NcclOp {
  bool send;
  void* buffer;
  std::size_t bytes;
  int peer;
  ncclComm_t comm;
  cudaStream_t stream;
};
inline int& nccl_depth() {
  static thread_local int depth = 0;
  return depth;
}
inline std::vector<NcclOp>& nccl_group() {
  static thread_local std::vector<NcclOp> ops;
  return ops;
}
inline std::size_t nccl_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}
// The group's operations on communicators between processes, as one host function per stream:
// its sends are written first, then its receives take their messages as they arrive, then the
// sends wait for their receivers (so a group may hold both halves of an exchange with a peer,
// and none of its operations waits behind another, as in NCCL).
inline void nccl_run_between_processes(const std::vector<NcclOp>& ops) {
  std::vector<cudaStream_t> streams;
  for (const NcclOp& op : ops)
    if (std::find(streams.begin(), streams.end(), op.stream) == streams.end())
      streams.push_back(op.stream);
  for (cudaStream_t stream : streams) {
    struct Part {
      NcclOp op;
      std::shared_ptr<RankNet> net;
    };
    std::vector<Part> parts;
    for (const NcclOp& op : ops)
      if (op.stream == stream) parts.push_back({op, op.comm->net});
    // bookkeeping: it runs on a failed stream too, so that the peer is not left waiting
    stream->submit(
        [parts] {
          std::vector<bool> posted(parts.size(), false);
          for (std::size_t i = 0; i < parts.size(); ++i)
            if (parts[i].op.send)
              posted[i] = parts[i].net->post(parts[i].op.peer, RankNet::data_message,
                                             parts[i].op.buffer, parts[i].op.bytes);
          // the receives progress as their messages arrive, not in the group's order
          std::vector<bool> pending(parts.size(), false);
          std::size_t left = 0;
          for (std::size_t i = 0; i < parts.size(); ++i)
            if (!parts[i].op.send) pending[i] = true, ++left;
          while (left > 0) {
            bool progressed = false;
            for (std::size_t i = 0; i < parts.size(); ++i) {
              if (!pending[i]) continue;
              const Part& p = parts[i];
              if (p.net->try_receive(p.op.peer, RankNet::data_message, p.op.buffer, p.op.bytes,
                                     /*wait=*/left == 1) == RankNet::Progress::not_yet)
                continue;
              pending[i] = false, --left, progressed = true;
            }
            if (!progressed && left > 1) std::this_thread::sleep_for(std::chrono::microseconds(20));
          }
          for (std::size_t i = 0; i < parts.size(); ++i)
            if (posted[i]) parts[i].net->wait_ack(parts[i].op.peer);
        },
        /*bookkeeping=*/true);
  }
}
inline ncclResult_t nccl_end_group() {
  std::vector<NcclOp> all = std::exchange(nccl_group(), {}), ops, between_processes;
  for (const NcclOp& op : all) (op.comm->net ? between_processes : ops).push_back(op);
  nccl_run_between_processes(between_processes);
  std::vector<bool> matched(ops.size(), false);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].send) continue;
    std::size_t j = 0;
    for (; j < ops.size(); ++j)
      if (!ops[j].send && !matched[j] && ops[j].comm->rank == ops[i].peer &&
          ops[j].peer == ops[i].comm->rank && ops[j].bytes == ops[i].bytes)
        break;
    if (j == ops.size()) {
      std::fprintf(stderr, "nccl emulator: a send without its receive in the group\n");
      return ncclInvalidUsage;
    }
    matched[i] = matched[j] = true;
    struct Meeting {
      std::mutex m;
      std::condition_variable cv;
      bool sender_there = false, copied = false;
    };
    auto meeting = std::make_shared<Meeting>();
    const NcclOp send = ops[i], receive = ops[j];
    send.stream->submit(
        [meeting] {
          std::unique_lock lock(meeting->m);
          meeting->sender_there = true;
          meeting->cv.notify_all();
          meeting->cv.wait(lock, [&] { return meeting->copied; });
        },
        /*bookkeeping=*/true);
    receive.stream->submit(
        [meeting, send, receive] {
          std::unique_lock lock(meeting->m);
          meeting->cv.wait(lock, [&] { return meeting->sender_there; });
          std::memcpy(receive.buffer, send.buffer, send.bytes);
          meeting->copied = true;
          meeting->cv.notify_all();
        },
        /*bookkeeping=*/true);
  }
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (!matched[i]) {
      std::fprintf(stderr, "nccl emulator: a receive without its send in the group\n");
      return ncclInvalidUsage;
    }
  return ncclSuccess;
}
inline ncclResult_t nccl_add(NcclOp op, ncclDataType_t type, std::size_t count) {
  if (op.comm == nullptr || op.stream == nullptr || op.peer < 0 || op.peer >= op.comm->ranks)
    return ncclInvalidArgument;
  if (op.stream->gpu != op.comm->gpu) {
    std::fprintf(stderr, "nccl emulator: stream of GPU %d with the communicator of GPU %d\n",
                 op.stream->gpu, op.comm->gpu);
    return ncclInvalidArgument;
  }
  op.bytes = count * nccl_size(type);
  nccl_group().push_back(op);
  return nccl_depth() == 0 ? nccl_end_group() : ncclSuccess;
}

}  // namespace gpipe::test::cuda_emulation

// The NCCL functions that the backend calls.

#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int count, const int* gpus) {
  using namespace gpipe::test::cuda_emulation;
  for (int i = 0; i < count; ++i)
    if (gpus[i] < 0 || gpus[i] >= machine().gpus) return ncclInvalidArgument;
  for (int i = 0; i < count; ++i) comms[i] = new ncclComm{i, count, gpus[i]};
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<unsigned> calls{0};
  std::random_device entropy;
  const unsigned long long bits =
      (static_cast<unsigned long long>(entropy()) << 32) ^ entropy() ^
      static_cast<unsigned long long>(::getpid()) ^
      static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (static_cast<unsigned long long>(calls++) << 48);
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "%016llx", bits);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int ranks, ncclUniqueId id, int rank) {
  using namespace gpipe::test::cuda_emulation;
  if (comm == nullptr || ranks < 1 || rank < 0 || rank >= ranks) return ncclInvalidArgument;
  const std::string token(id.internal, strnlen(id.internal, sizeof id.internal));
  if (token.empty()) return ncclInvalidArgument;
  auto net = std::make_shared<RankNet>(token, rank, ranks);
  if (!net->ok()) return ncclSystemError;
  *comm = new ncclComm{rank, ranks, current_gpu(), std::move(net)};
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm != nullptr && comm->net) comm->net->shut(/*goodbye=*/true);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm != nullptr && comm->net) comm->net->shut(/*goodbye=*/false);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* result) {
  if (comm == nullptr || result == nullptr) return ncclInvalidArgument;
  *result = comm->net && comm->net->failed() ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->ranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}
// Sum of floats over a communicator between processes, on `stream`.
ncclResult_t ncclAllReduce(const void* send, void* receive, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  if (comm == nullptr || stream == nullptr) return ncclInvalidArgument;
  if (!comm->net || type != ncclFloat32 || op != ncclSum) {
    std::fprintf(stderr,
                 "nccl emulator: ncclAllReduce is emulated for ncclSum of ncclFloat32 on a "
                 "communicator of ncclCommInitRank only\n");
    return ncclInvalidUsage;
  }
  if (stream->gpu != comm->gpu) {
    std::fprintf(stderr, "nccl emulator: stream of GPU %d with the communicator of GPU %d\n",
                 stream->gpu, comm->gpu);
    return ncclInvalidArgument;
  }
  stream->submit(
      [net = comm->net, send, receive, count] {
        net->allreduce_sum(static_cast<const float*>(send), static_cast<float*>(receive), count);
      },
      /*bookkeeping=*/true);
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  ++gpipe::test::cuda_emulation::nccl_depth();
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  using namespace gpipe::test::cuda_emulation;
  if (nccl_depth() == 0) return ncclInvalidUsage;
  return --nccl_depth() == 0 ? nccl_end_group() : ncclSuccess;
}
ncclResult_t ncclSend(const void* buffer, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return gpipe::test::cuda_emulation::nccl_add(
      {true, const_cast<void*>(buffer), 0, peer, comm, stream}, type, count);
}
ncclResult_t ncclRecv(void* buffer, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return gpipe::test::cuda_emulation::nccl_add({false, buffer, 0, peer, comm, stream}, type, count);
}
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclSystemError:
      return "unhandled system error (emulated: the ranks could not connect)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    default:
      return "NCCL error (emulated)";
  }
}

}  // extern "C"
#endif  // GPIPE_CUDA_EMULATION_LINKED
