#pragma once
// mpi::CudaBackend's sends and receives: queued as they are issued, a run of them with no other
// work between is posted as one NCCL group on the rank's communication stream, after an event of
// the compute stream; the compute stream waits for a group that receives, and a sent buffer is
// freed once its group has completed. Nothing here waits for the GPU: the backend waits for its
// streams (bounded, mpi::CudaBackend::wait_for_streams) before it frees the groups, and a group
// still running then (behind a kernel that does not end) keeps its buffers and stream for good.

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/backend/cuda/backend.cuh"
#include "gpipe/backend/mpi/agreement.hpp"
#include "gpipe/backend/mpi/nccl.cuh"
#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::detail {

/// Makes `waiting` wait for the work issued so far on `first`.
inline void stream_waits_for(cudaStream_t waiting, cudaStream_t first) {
  cudaEvent_t ready = nullptr;
  GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  GPIPE_CUDA_CHECK(cudaEventRecord(ready, first));
  GPIPE_CUDA_CHECK(cudaStreamWaitEvent(waiting, ready, 0));
  (void)cudaEventDestroy(ready);
}

/// A send or a receive of float or bf16 elements to or from a pipeline device's rank.
struct NcclTransfer {
  bool send = false;
  std::size_t peer = 0, tag = 0, count = 0;
  WorkLabel label = {};  ///< the send or receive op
  ncclDataType_t type = ncclFloat32;
  void* data = nullptr;
  cuda::Buffer<float> buffer = {};  ///< a send's data, kept until its group completes
  cuda::Buffer<bf16> buffer_bf16 = {};

  /// A send of src's elements, which it takes over.
  template <class T>
  static NcclTransfer sending(std::size_t peer, std::size_t tag, cuda::Buffer<T>& src) {
    NcclTransfer t{.send = true, .peer = peer, .tag = tag, .count = src.size()};
    t.type = nccl_type<T>();
    t.data = src.data();
    if constexpr (std::is_same_v<T, float>)
      t.buffer = std::move(src);
    else
      t.buffer_bf16 = std::move(src);
    return t;
  }
  /// A receive of dst's elements into it.
  template <class T>
  static NcclTransfer receiving(std::size_t peer, std::size_t tag, cuda::Buffer<T>& dst) {
    NcclTransfer t{.send = false, .peer = peer, .tag = tag, .count = dst.size()};
    t.type = nccl_type<T>();
    t.data = dst.data();
    return t;
  }
  /// The message's size in bytes.
  std::size_t bytes() const { return count * (type == ncclFloat32 ? sizeof(float) : sizeof(bf16)); }

  template <class T>
  static ncclDataType_t nccl_type() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                  "gpipe: mpi::CudaBackend's messages are float or bf16");
    return std::is_same_v<T, float> ? ncclFloat32 : ncclBfloat16;
  }
};

/// The queue of a rank's transfers and the groups posted from it (see the top of this file), on
/// a communication stream of its own. Not thread-safe: the backend's one thread calls it.
class NcclGroups {
 public:
  /// On CUDA device `gpu`, over `nccl`'s communicators (which must outlive this).
  NcclGroups(NcclCommunicators& nccl, int gpu) : nccl_(nccl) {
    GPIPE_CUDA_CHECK(cudaSetDevice(gpu));
    GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclGroups() {
    drop();
    // a stream still in work is left to it (destroying it may wait for that work)
    if (stream_ != nullptr && cudaStreamQuery(stream_) != cudaErrorNotReady)
      (void)cudaStreamDestroy(stream_);
  }
  NcclGroups(const NcclGroups&) = delete;
  NcclGroups& operator=(const NcclGroups&) = delete;

  /// The communication stream.
  cudaStream_t stream() const { return stream_; }
  /// Queues `t` for the next post().
  void queue(NcclTransfer t) { queue_.push_back(std::move(t)); }
  /// Posts the queued transfers as one NCCL group on the communication stream, after what
  /// `compute` has issued; `compute` waits for the group if it receives. After an abort the
  /// queued transfers are dropped (the step fails anyway).
  void post(cudaStream_t compute) {
    if (queue_.empty()) return;
    std::vector<NcclTransfer> group = std::exchange(queue_, {});
    if (nccl_.of_tag(0) == nullptr) {
      if (nccl_.aborted()) return;
      throw Error("gpipe: mpi::CudaBackend has no NCCL communicator between its devices");
    }
    stream_waits_for(stream_, compute);
    const bool receives = post_group(group);
    Posted posted;
    GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&posted.done, cudaEventDisableTiming));
    GPIPE_CUDA_CHECK(cudaEventRecord(posted.done, stream_));
    if (receives) GPIPE_CUDA_CHECK(cudaStreamWaitEvent(compute, posted.done, 0));
    for (NcclTransfer& t : group) {
      NcclTransfer what;  // without its data
      what.send = t.send;
      what.peer = t.peer;
      what.tag = t.tag;
      what.label = t.label;
      posted.transfers.push_back(std::move(what));
      if (t.send) posted.sends.push_back(std::move(t));
    }
    pending_.push_back(std::move(posted));
    release_completed();
  }
  /// Frees the buffers of the groups that have completed.
  void release_completed() {
    std::erase_if(pending_, [](const Posted& p) { return cudaEventQuery(p.done) == cudaSuccess; });
  }
  /// What the first posted group not yet complete waits for, its pipeline devices' world ranks
  /// being `first_rank` + device: "stage 1's activation of micro-batch 2 from rank 1
  /// (recv_activation of stage 2, micro-batch 2)", its transfers joined by "; "; "" when none
  /// waits.
  std::string awaited(std::size_t first_rank) const {
    for (const Posted& p : pending_) {
      if (cudaEventQuery(p.done) == cudaSuccess) continue;
      std::string out;
      for (const NcclTransfer& t : p.transfers) {
        if (!out.empty()) out += "; ";
        const std::size_t rank = first_rank + t.peer;
        out += t.send ? "rank " + std::to_string(rank) + " to receive " +
                            std::string(t.tag % 2 == 1 ? "a gradient" : "an activation")
                      : awaited_message(t.label, t.tag, rank);
        if (!t.label.what.empty())
          out += " (" + std::string(t.label.what) + " of stage " + std::to_string(t.label.stage) +
                 ", micro-batch " + std::to_string(t.label.micro_batch) + ")";
      }
      return out;
    }
    return "";
  }
  /// Forgets every posted group: frees the buffers of those that have completed, and leaves
  /// those of a group still running to it (never freed: its sends may still read them). For
  /// after the streams were waited for.
  void release_all() { pending_.clear(); }
  /// Drops the queued transfers and forgets the posted ones (as release_all).
  void drop() {
    queue_.clear();
    pending_.clear();
  }

 private:
  // A posted group's sends, their buffers freed once it completes.
  struct Posted {
    std::vector<NcclTransfer> sends;
    std::vector<NcclTransfer> transfers;  ///< the group's sends and receives, without data
    cudaEvent_t done = nullptr;           ///< recorded after the group on the communication stream
    Posted() = default;
    Posted(Posted&& other) noexcept
        : sends(std::move(other.sends)),
          transfers(std::move(other.transfers)),
          done(std::exchange(other.done, nullptr)) {}
    Posted& operator=(Posted&& other) noexcept {
      if (this != &other) {
        release();
        sends = std::move(other.sends);
        transfers = std::move(other.transfers);
        done = std::exchange(other.done, nullptr);
      }
      return *this;
    }
    ~Posted() { release(); }
    // Frees the buffers once the group has completed; does not wait for it (the backend waited
    // for its streams, at most Options::peer_timeout): a group still running then waits behind
    // work that does not end, and its buffers are left to it, never freed. The event goes either
    // way (CUDA frees a pending event once it completes).
    void release() noexcept {
      if (done != nullptr) {
        if (cudaEventQuery(done) == cudaErrorNotReady)
          (void)new std::vector<NcclTransfer>(std::move(sends));  // leaked on purpose
        (void)cudaEventDestroy(done);
        done = nullptr;
      }
      sends.clear();
    }
  };

  // ncclGroupStart, a send or receive each, ncclGroupEnd; whether any receives.
  bool post_group(const std::vector<NcclTransfer>& group) {
    GPIPE_NCCL_CHECK(ncclGroupStart());
    bool receives = false;
    for (const NcclTransfer& t : group) {
      const int peer = static_cast<int>(t.peer);
      ncclComm_t comm = nccl_.of_tag(t.tag);
      const ncclResult_t posted = t.send ? ncclSend(t.data, t.count, t.type, peer, comm, stream_)
                                         : ncclRecv(t.data, t.count, t.type, peer, comm, stream_);
      if (posted != ncclSuccess) {
        (void)ncclGroupEnd();
        GPIPE_NCCL_CHECK(posted);  // names the send or receive by its line
      }
      receives = receives || !t.send;
    }
    GPIPE_NCCL_CHECK(ncclGroupEnd());
    return receives;
  }

  NcclCommunicators& nccl_;
  cudaStream_t stream_ = nullptr;
  std::vector<NcclTransfer> queue_;  ///< transfers issued since the last post
  std::vector<Posted> pending_;      ///< posted groups with sends, not known to be complete
};

}  // namespace gpipe::detail
