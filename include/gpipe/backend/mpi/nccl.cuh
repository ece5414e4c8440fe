#pragma once
// The NCCL communicators of mpi::CudaBackend, bootstrapped over MPI (rank 0 of each calls
// ncclGetUniqueId, MPI_Bcast hands the id out, every rank calls ncclCommInitRank): two per
// replica's pipeline, one for activations (even tags) and one for gradients (odd tags), and one
// per device's replicas for the gradient sums. Aborted when a peer fails, made anew after.

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gpipe/backend/cuda/backend.cuh"
#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

#if !GPIPE_CUDA_NCCL
#error \
    "gpipe::mpi::CudaBackend needs NCCL (GPIPE_CUDA_NCCL=1: link gpipe::cuda where NCCL is found)"
#endif

namespace gpipe::detail {

/// A rank's NCCL communicators on its GPU, over `layout`'s pipeline and replicas (see the top of
/// this file). Collective members say so; the others are local.
class NcclCommunicators {
 public:
  /// Collective: checks that no two ranks that share a communicator share GPU `gpu`, then makes
  /// the communicators. `layout` must outlive this.
  NcclCommunicators(const MpiLayout& layout, int gpu) : layout_(layout), gpu_(gpu) {
    check_a_gpu_per_rank();
    make();
  }
  ~NcclCommunicators() { destroy(); }
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  /// The pipeline's communicator of a message with `tag`: activations (even), gradients (odd);
  /// nullptr with one device, or once aborted.
  ncclComm_t of_tag(std::size_t tag) const { return (tag & 1u) != 0 ? gradients_ : activations_; }
  /// On `stream`, one NCCL group with `peer`'s rank on the gradients' communicator: sends `mine`
  /// and receives `theirs` (GPU memory; either may be empty, the sizes must match the peer's).
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs,
                cudaStream_t stream) {
    if (gradients_ == nullptr)
      throw Error("gpipe: mpi::CudaBackend has no NCCL communicator between its devices");
    const int to = static_cast<int>(peer);
    ncclResult_t posted = ncclGroupStart();
    if (posted == ncclSuccess && !mine.empty())
      posted = ncclSend(mine.data(), mine.size(), ncclFloat32, to, gradients_, stream);
    if (posted == ncclSuccess && !theirs.empty())
      posted = ncclRecv(theirs.data(), theirs.size(), ncclFloat32, to, gradients_, stream);
    const ncclResult_t ended = ncclGroupEnd();
    GPIPE_NCCL_CHECK(posted);
    GPIPE_NCCL_CHECK(ended);
  }
  /// The replicas' communicator; nullptr with one replica, or once aborted.
  ncclComm_t replicas() const { return replicas_; }
  /// Whether abort() ran since the communicators were made.
  bool aborted() const { return aborted_; }

  /// Collective: the pipeline's (one per direction) and (with replicas) the replicas'
  /// communicators, after a failed step the new ones.
  void make() {
    if (layout_.devices() > 1) {
      activations_ = nccl_over(layout_.pipeline());
      gradients_ = nccl_over(layout_.pipeline());
    }
    if (layout_.replicas() > 1) replicas_ = nccl_over(layout_.replicas_comm());
    aborted_ = false;
  }
  /// Ends every NCCL operation of this rank that still waits (ncclCommAbort).
  void abort() {
    for (ncclComm_t* c : all()) {
      if (*c != nullptr) (void)ncclCommAbort(*c);
      *c = nullptr;
    }
    aborted_ = true;
  }
  /// Frees the communicators, nothing waiting on them any more (ncclCommDestroy).
  void destroy() {
    for (ncclComm_t* c : all()) {
      if (*c != nullptr) (void)ncclCommDestroy(*c);
      *c = nullptr;
    }
  }
  /// Whether NCCL reports a failed peer on one of them.
  bool failed() {
    for (ncclComm_t* c : all()) {
      ncclResult_t result = ncclSuccess;
      if (*c != nullptr && ncclCommGetAsyncError(*c, &result) == ncclSuccess &&
          result != ncclSuccess && result != ncclInProgress)
        return true;
    }
    return false;
  }

 private:
  std::array<ncclComm_t*, 3> all() { return {&activations_, &gradients_, &replicas_}; }

  /// Collective: NCCL refuses two ranks of one communicator on one GPU (ncclCommInitRank fails
  /// with "Duplicate GPU detected"). Says so before NCCL is asked, on every rank alike, naming the
  /// two ranks, the GPU and its machine: each rank's GPU (its UUID, one per physical device
  /// whatever CUDA_VISIBLE_DEVICES says) is compared with those of the ranks it will share a
  /// communicator with (its replica's pipeline, its device's replicas).
  void check_a_gpu_per_rank() const {
    const Identity own = identity();
    std::vector<MPI_Comm> shared;
    if (layout_.devices() > 1) shared.push_back(layout_.pipeline());
    if (layout_.replicas() > 1) shared.push_back(layout_.replicas_comm());
    for (MPI_Comm comm : shared) {
      int size = 0;
      MPI_Comm_size(comm, &size);
      std::vector<Identity> all(static_cast<std::size_t>(size));
      check_mpi(MPI_Allgather(&own, sizeof own, MPI_BYTE, all.data(), sizeof own, MPI_BYTE, comm),
                "MPI_Allgather");
      for (std::size_t i = 0; i < all.size(); ++i)
        for (std::size_t j = i + 1; j < all.size(); ++j)
          if (std::memcmp(all[i].uuid, all[j].uuid, sizeof own.uuid) == 0)
            throw Error("gpipe: mpi::CudaBackend: ranks " + std::to_string(all[i].rank) + " and " +
                        std::to_string(all[j].rank) + " both run on GPU " +
                        std::to_string(all[i].gpu) + " of " + all[i].host +
                        ", and NCCL needs a GPU of its own for each rank that shares a "
                        "communicator: start at most as many ranks per machine as it has GPUs, "
                        "or give each rank its own Options::gpu");
    }
  }
  struct Identity {
    char uuid[16];
    int rank;
    int gpu;
    char host[MPI_MAX_PROCESSOR_NAME];
  };
  Identity identity() const {
    Identity own{};
    cudaDeviceProp properties{};
    GPIPE_CUDA_CHECK(cudaGetDeviceProperties(&properties, gpu_));
    static_assert(sizeof properties.uuid.bytes == sizeof own.uuid);
    std::memcpy(own.uuid, properties.uuid.bytes, sizeof own.uuid);
    own.rank = static_cast<int>(layout_.rank());
    own.gpu = gpu_;
    int length = 0;
    check_mpi(MPI_Get_processor_name(own.host, &length), "MPI_Get_processor_name");
    return own;
  }
  /// Collective over `comm`: an NCCL communicator of the same ranks.
  ncclComm_t nccl_over(MPI_Comm comm) const {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    ncclUniqueId id{};
    if (rank == 0) GPIPE_NCCL_CHECK(ncclGetUniqueId(&id));
    check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm), "MPI_Bcast");
    GPIPE_CUDA_CHECK(cudaSetDevice(gpu_));
    ncclComm_t nccl = nullptr;
    GPIPE_NCCL_CHECK(ncclCommInitRank(&nccl, size, id, rank));
    return nccl;
  }

  const MpiLayout& layout_;
  int gpu_;
  ncclComm_t activations_ = nullptr;  ///< this replica's ranks (rank = device): activations
  ncclComm_t gradients_ = nullptr;    ///< the same ranks: gradients
  ncclComm_t replicas_ = nullptr;     ///< this device's rank in every replica
  bool aborted_ = false;
};

}  // namespace gpipe::detail
