#pragma once
// The emulated NCCL: ncclCommInitAll over the emulated GPUs; ncclSend/ncclRecv pairs of one group
// meet on their streams.

#include <nccl.h>

#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "support/cuda_emulation/runtime.hpp"

#ifndef GPIPE_CUDA_NCCL
#define GPIPE_CUDA_NCCL 1  // the emulator provides NCCL
#endif

struct ncclComm {
  int rank, ranks, gpu;
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
inline ncclResult_t nccl_end_group() {
  std::vector<NcclOp> ops = std::exchange(nccl_group(), {});
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

extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int count, const int* gpus) {
  using namespace gpipe::test::cuda_emulation;
  for (int i = 0; i < count; ++i)
    if (gpus[i] < 0 || gpus[i] >= machine().gpus) return ncclInvalidArgument;
  for (int i = 0; i < count; ++i) comms[i] = new ncclComm{i, count, gpus[i]};
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
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
    default:
      return "NCCL error (emulated)";
  }
}

}  // extern "C"
