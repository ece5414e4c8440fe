#pragma once
// Who is who in the world of an MPI backend: R replicas x K devices (rank r is device r % K of
// replica r / K), the communicators of one pipeline and of one device's replicas, the ranks of one
// machine, and the tags that keep a failed step's messages from meeting a later step's.

#include <mpi.h>

#include <cstddef>
#include <string>

#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// The layout of an MPI backend's world and the communicators split from it. Collective members
/// say so; the others are local.
class MpiLayout {
 public:
  /// Collective over `comm` (MPI initialized with at least MPI_THREAD_SERIALIZED): splits it into
  /// the pipelines, the replicas and the machines. Throws `gpipe::Error` when MPI is not so
  /// initialized or the world is not `data_parallel` x K ranks.
  MpiLayout(MPI_Comm comm, std::size_t data_parallel) : comm_(comm) {
    require_serialized_mpi();
    int rank = 0, size = 0;
    check_mpi(MPI_Comm_rank(comm_, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size), "MPI_Comm_size");
    rank_ = static_cast<std::size_t>(rank);
    size_ = static_cast<std::size_t>(size);
    int found = 0;
    int* tag_ub = nullptr;
    check_mpi(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found), "MPI_Comm_get_attr");
    max_tag_ = found != 0 && tag_ub != nullptr ? static_cast<std::size_t>(*tag_ub) : 32767;
    require(data_parallel >= 1 && size_ % data_parallel == 0,
            "gpipe: the MPI world has " + std::to_string(size_) +
                " ranks, which is not data_parallel = " + std::to_string(data_parallel) +
                " replicas x K devices");
    replicas_ = data_parallel;
    devices_ = size_ / replicas_;
    replica_ = rank_ / devices_;
    device_ = rank_ % devices_;
    // the ranks of one replica (rank = device) and the ranks of one device (rank = replica)
    check_mpi(
        MPI_Comm_split(comm_, static_cast<int>(replica_), static_cast<int>(device_), &pipeline_),
        "MPI_Comm_split");
    check_mpi(MPI_Comm_split(comm_, static_cast<int>(device_), static_cast<int>(replica_),
                             &replicas_comm_),
              "MPI_Comm_split");
    find_machine();
  }
  ~MpiLayout() {
    for (MPI_Comm* c : {&pipeline_, &replicas_comm_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  MpiLayout(const MpiLayout&) = delete;
  MpiLayout& operator=(const MpiLayout&) = delete;

  std::size_t rank() const { return rank_; }          ///< in comm()
  std::size_t size() const { return size_; }          ///< comm()'s ranks: replicas() x devices()
  std::size_t devices() const { return devices_; }    ///< K, a pipeline's devices
  std::size_t replicas() const { return replicas_; }  ///< R, the pipeline's replicas
  std::size_t replica() const { return replica_; }    ///< this rank's: rank() / K
  std::size_t device() const { return device_; }      ///< this rank's: rank() % K
  MPI_Comm comm() const { return comm_; }             ///< the world, the caller's
  MPI_Comm pipeline() const { return pipeline_; }     ///< this replica's ranks; rank = device
  /// This device's rank in every replica; rank = replica.
  MPI_Comm replicas_comm() const { return replicas_comm_; }
  /// This rank's index among the ranks of its machine (MPI_COMM_TYPE_SHARED).
  std::size_t machine_rank() const { return machine_rank_; }
  /// Whether every rank runs on this rank's machine.
  bool one_machine() const { return one_machine_; }

  /// The index of `device` among this rank's devices (0); throws `gpipe::Error` unless it is this
  /// rank's.
  std::size_t local(std::size_t device) const {
    require(device < devices_, "device " + std::to_string(device) +
                                   " does not exist; the pipeline has " + std::to_string(devices_) +
                                   " devices, a rank each");
    require(device == device_, "device " + std::to_string(device) + " belongs to rank " +
                                   std::to_string(replica_ * devices_ + device) +
                                   ", not to this rank (" + std::to_string(rank_) + ")");
    return 0;
  }
  /// Throws `gpipe::Error` unless `peer` is a pipeline device and `tag` fits MPI_TAG_UB.
  void check_peer(std::size_t peer, std::size_t tag) const {
    require(peer < devices_, "device " + std::to_string(peer) +
                                 " does not exist (the pipeline has " + std::to_string(devices_) +
                                 ")");
    require(tag * epochs + epochs - 1 < max_tag_ - 1,
            "message tag " + std::to_string(tag) + " exceeds this MPI's MPI_TAG_UB = " +
                std::to_string(max_tag_) + " (too many stages x micro-batches)");
  }

  /// Message tags: the executor's tag (below MPI_TAG_UB / epochs) times `epochs`, plus the step
  /// modulo epochs, so that a failed step's unreceived messages never meet a later step's
  /// receives; MPI_TAG_UB itself is the fault message's, MPI_TAG_UB - 1 the failure between
  /// steps'.
  static constexpr std::size_t epochs = 8;
  /// The MPI tag of this step's message `tag` to or from `peer` (checked as check_peer).
  int step_tag(std::size_t peer, std::size_t tag) const {
    check_peer(peer, tag);
    return static_cast<int>(tag * epochs + step_ % epochs);
  }
  /// The tag of the zero-byte message that tells a rank another one failed.
  int fault_tag() const { return static_cast<int>(max_tag_); }
  /// The tag of the message that tells every rank another one failed between steps (its text).
  int abandon_tag() const { return static_cast<int>(max_tag_ - 1); }
  /// A step has ended on every rank (the agreement): later messages take the next epoch's tags.
  void next_step() { ++step_; }

 private:
  static void require_serialized_mpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    require(initialized != 0,
            "mpi::Backend(comm) and mpi::CudaBackend(comm) need MPI initialized "
            "(MPI_Init_thread, or construct it from argc, argv)");
    int provided = 0;
    MPI_Query_thread(&provided);
    require(provided >= MPI_THREAD_SERIALIZED,
            "gpipe's MPI backends need MPI initialized with at least MPI_THREAD_SERIALIZED "
            "(the rank's device worker calls MPI during a step)");
  }
  // Collective: machine_rank_ and one_machine_.
  void find_machine() {
    MPI_Comm machine = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &machine),
              "MPI_Comm_split_type");
    int rank = 0, size = 0;
    MPI_Comm_rank(machine, &rank);
    MPI_Comm_size(machine, &size);
    MPI_Comm_free(&machine);
    machine_rank_ = static_cast<std::size_t>(rank);
    const int mine = static_cast<std::size_t>(size) == size_ ? 1 : 0;
    int all = 0;
    check_mpi(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    one_machine_ = all != 0;
  }

  MPI_Comm comm_;
  MPI_Comm pipeline_ = MPI_COMM_NULL;
  MPI_Comm replicas_comm_ = MPI_COMM_NULL;
  std::size_t rank_ = 0, size_ = 0, max_tag_ = 32767;
  std::size_t replicas_ = 1, devices_ = 1, replica_ = 0, device_ = 0;
  std::size_t machine_rank_ = 0;
  bool one_machine_ = false;
  std::size_t step_ = 0;  ///< steps finished: selects the tags' epoch
};

}  // namespace gpipe::detail
