#pragma once
// The base of gpipe's two MPI backends (mpi::Backend, mpi::CudaBackend): the pieces they share,
// composed, and the members that only forward to them or to the rank's one device.

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/mpi/agreement.hpp"
#include "gpipe/backend/mpi/clocks.hpp"
#include "gpipe/backend/mpi/collectives.hpp"
#include "gpipe/backend/mpi/deadline.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/backend/mpi/session.hpp"
#include "gpipe/backend/mpi/shares.hpp"

namespace gpipe::detail {

/// The ranks of R replicas x K devices, rank r being device r % K of replica r / K: MPI's session,
/// the layout, the fault agreement, the common clock, the collectives between steps and the
/// optimizer's shares. Each backend adds its device and the mechanics of its messages and sums;
/// the protocol that uses them is transport/mpi.hpp. Derived: the backend (a friend, whose
/// `Local local_` is the rank's device, a one-device host::Backend or cuda::Backend).
template <class Derived, class Local>
class MpiRanks {
 public:
  MpiRanks(const MpiRanks&) = delete;
  MpiRanks& operator=(const MpiRanks&) = delete;

  /// One device per rank: the pipeline's K devices (world size / data_parallel).
  std::size_t num_devices() const { return layout_.devices(); }
  /// Ranks in the communicator: R replicas x K devices.
  std::size_t world_size() const { return layout_.size(); }
  /// This process's rank in the communicator (rank 0 writes the files of a collective save).
  std::size_t rank() const { return layout_.rank(); }
  /// The pipeline device this rank runs: rank() % K.
  std::size_t device() const { return layout_.device(); }
  /// R, the pipeline replicas (Options::data_parallel).
  std::size_t replicas() const { return layout_.replicas(); }
  /// The replica this rank belongs to: rank() / K.
  std::size_t replica() const { return layout_.replica(); }
  /// Whether this rank runs `device`; the runtime issues only its own device's work. Any device
  /// number is accepted.
  bool is_local(std::size_t device) const { return device == layout_.device(); }
  /// The communicator given at construction; the backend's messages within a replica and its sums
  /// over the replicas use communicators split from it.
  MPI_Comm communicator() const { return layout_.comm(); }

  /// Collective over this replica's ranks, between steps: each gets the values (host memory) of
  /// `device`'s rank.
  void broadcast(std::size_t device, std::span<float> values) {
    collectives_.broadcast(device, values);
  }
  /// Collective over the world (every replica): whether every rank passed true.
  bool all_succeeded(bool mine) { return collectives_.all_true(mine); }
  /// As above, of doubles (host memory).
  void broadcast(std::size_t device, std::span<double> values) {
    collectives_.broadcast(device, values);
  }
  /// Collective over the replicas (the ranks of the same device in every replica), between
  /// steps: host `values` <- their sum over the replicas, in place.
  void allreduce_sum(std::span<float> values) { collectives_.allreduce_sum(values); }

  /// Collective over the world: the seconds from the earliest rank's `start` to the latest rank's
  /// `end` (each rank's own steady_clock time points, compared on the one clock of the ranks'
  /// traces), e.g. a training step's wall time over all ranks.
  double wall_seconds(std::chrono::steady_clock::time_point start,
                      std::chrono::steady_clock::time_point end) {
    return clocks_.span_seconds(local().epoch(), start, end);
  }

  /// Bytes of this rank's device, as its one-device backend counts them.
  MemoryStats memory_stats(std::size_t device) const {
    return local().memory_stats(layout_.local(device));
  }
  /// Sets this rank's device's peaks to its current use.
  void reset_peak() { local().reset_peak(); }
  /// `count` uninitialized elements on this rank's `device` (stream-ordered on a GPU), counted
  /// under `kind`; throws OutOfMemory past Options::device_capacity.
  template <class T>
  typename Local::template Buffer<T> allocate(std::size_t device, std::size_t count,
                                              MemoryKind kind = MemoryKind::other) {
    return local().template allocate<T>(layout_.local(device), count, kind);
  }
  /// Traces and timings count microseconds from one origin on every rank (RankClocks::align).
  void set_tracing(bool on) { local().set_tracing(on); }
  /// How far this rank's trace and timing microseconds may be off that origin: 0 where all ranks
  /// share a machine (one steady_clock) and on rank 0; across machines half the fastest of the
  /// round trips that aligned this rank's clock with rank 0's (Cristian's method), so that two
  /// ranks' times compare within the sum of their bounds.
  double clock_error_us() const { return clocks_.error_us(); }

  /// Tells every other rank at once that this one failed (once a step).
  void announce_failure() { agreement_.announce_failure(); }
  /// Between steps (no MPI call in flight), this rank failed with `failure` while doing `what`
  /// (e.g. "Trainer::step"), on this rank alone perhaps: tells every other rank at once, whose
  /// next wait for a peer (a step's message, a collective) throws `gpipe::Error` naming this rank,
  /// `what` and the failure; the ranks are lost (lost_peers()) from then on.
  void fail_between_steps(std::string_view what, std::string_view failure) {
    deadline_.abandon(what, failure);
  }
  /// Collective, the agreement that ends every step: `failure` is this rank's ("" if none),
  /// `out_of_memory` whether it was an OutOfMemory. Returns when no rank failed; otherwise every
  /// rank throws the same Error (an OutOfMemory where the failure reported was one), naming the
  /// rank that failed first-hand and its message. The next step's messages carry other tags.
  void agree(std::string failure, bool out_of_memory = false) {
    agreement_.agree(std::move(failure), out_of_memory);
  }

  /// How long this rank waits for its peers (Options::peer_timeout).
  std::chrono::milliseconds peer_timeout() const { return deadline_.timeout(); }
  /// Whether a collective wait passed peer_timeout() (a rank stuck or dead): the ranks can run
  /// nothing more together, every later step or collective throws `gpipe::Error` at once, and the
  /// backend ends the job when it goes (MPI_Abort: MPI_Finalize would wait for the lost rank).
  bool lost_peers() const { return deadline_.lost(); }

 protected:
  /// MPI_COMM_WORLD, initializing MPI (MPI_THREAD_SERIALIZED) unless the program did.
  MpiRanks(int& argc, char**& argv, std::size_t data_parallel,
           std::chrono::milliseconds peer_timeout)
      : session_(std::make_unique<mpi::Session>(argc, argv)),
        layout_(MPI_COMM_WORLD, data_parallel),
        deadline_(layout_, peer_timeout) {}
  /// On the caller's communicator, MPI initialized by the caller.
  MpiRanks(MPI_Comm comm, std::size_t data_parallel, std::chrono::milliseconds peer_timeout)
      : layout_(comm, data_parallel), deadline_(layout_, peer_timeout) {}
  /// Ends the job when the ranks lost each other (lost_peers()).
  ~MpiRanks() {
    if (deadline_.lost()) MPI_Abort(layout_.comm(), 1);
  }

  Local& local() { return static_cast<Derived&>(*this).local_; }
  const Local& local() const { return static_cast<const Derived&>(*this).local_; }

  std::unique_ptr<mpi::Session> session_;         ///< set when this initialized MPI: finalized last
  MpiLayout layout_;                              ///< who is who, communicators, tags
  PeerDeadline deadline_;                         ///< of every wait for a peer
  FaultAgreement agreement_{layout_, deadline_};  ///< the fault protocol
  RankClocks clocks_{layout_, deadline_};         ///< one clock, traces and timings
  MpiCollectives collectives_{layout_, deadline_};  ///< between steps
  OptimizerShares shares_{layout_, deadline_};      ///< ZeRO-1
};

}  // namespace gpipe::detail
