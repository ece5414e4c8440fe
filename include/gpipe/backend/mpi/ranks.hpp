#pragma once
// What gpipe's two MPI backends (mpi::Backend, mpi::CudaBackend) share as a base: MPI's session,
// the control plane (backend/mpi/control.hpp) and, from it, the layout of the world, the
// collectives between steps and the failure agreement. Each backend adds its device and the
// mechanics of its messages and sums; the protocol that uses them is transport/mpi.hpp. The base
// also forwards what a rank's one device answers itself (memory, allocation, tracing) to the
// backend's `local_`, a one-device host::Backend or cuda::Backend.

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/mpi/control.hpp"
#include "gpipe/backend/mpi/session.hpp"

namespace gpipe::detail {

// The ranks of R replicas x K devices, rank r being device r % K of replica r / K. Derived: the
// backend (a friend, whose `Local local_` is the rank's device).
template <class Derived, class Local>
class MpiRanks {
 public:
  MpiRanks(const MpiRanks&) = delete;
  MpiRanks& operator=(const MpiRanks&) = delete;

  /// One device per rank: the pipeline's K devices (world size / data_parallel).
  std::size_t num_devices() const { return control_.devices(); }
  /// Ranks in the communicator: R replicas x K devices.
  std::size_t world_size() const { return control_.size(); }
  /// This process's rank in the communicator (rank 0 writes the files of a collective save).
  std::size_t rank() const { return control_.rank(); }
  /// The pipeline device this rank runs: rank() % K.
  std::size_t device() const { return control_.device(); }
  /// R, the pipeline replicas (Options::data_parallel).
  std::size_t replicas() const { return control_.replicas(); }
  /// The replica this rank belongs to: rank() / K.
  std::size_t replica() const { return control_.replica(); }
  /// Whether this rank runs `device`; the runtime issues only its own device's work. Any device
  /// number is accepted.
  bool is_local(std::size_t device) const { return device == control_.device(); }
  /// The communicator given at construction; the backend's messages within a replica and its sums
  /// over the replicas use communicators split from it.
  MPI_Comm communicator() const { return control_.comm(); }

  /// Collective over this replica's ranks, between steps: each gets the values (host memory) of
  /// `device`'s rank.
  void broadcast(std::size_t device, std::span<float> values) {
    control_.broadcast(device, values);
  }
  /// Collective over the world (every replica): whether every rank passed true.
  bool all_succeeded(bool mine) { return control_.all_true(mine); }
  /// As above, of doubles (host memory).
  void broadcast(std::size_t device, std::span<double> values) {
    control_.broadcast(device, values);
  }
  /// Collective over the replicas (the ranks of the same device in every replica), between
  /// steps: host `values` <- their sum over the replicas, in place.
  void allreduce_sum(std::span<float> values) { control_.allreduce_sum(values); }

  /// Collective over the world: the seconds from the earliest rank's `start` to the latest rank's
  /// `end` (each rank's own steady_clock time points, compared on the one clock of the ranks'
  /// traces), e.g. a training step's wall time over all ranks.
  double wall_seconds(std::chrono::steady_clock::time_point start,
                      std::chrono::steady_clock::time_point end) {
    return control_.span_seconds(local().epoch(), start, end);
  }

  /// Bytes of this rank's device, as its one-device backend counts them.
  MemoryStats memory_stats(std::size_t device) const {
    return local().memory_stats(control_.local(device));
  }
  /// Sets this rank's device's peaks to its current use.
  void reset_peak() { local().reset_peak(); }
  /// `count` uninitialized elements on this rank's `device` (stream-ordered on a GPU), counted
  /// under `kind`; throws OutOfMemory past Options::device_capacity.
  template <class T>
  typename Local::template Buffer<T> allocate(std::size_t device, std::size_t count,
                                              MemoryKind kind = MemoryKind::other) {
    return local().template allocate<T>(control_.local(device), count, kind);
  }
  /// Traces and timings count microseconds from one origin on every rank (align_clocks).
  void set_tracing(bool on) { local().set_tracing(on); }

  /// Tells every other rank at once that this one failed (once a step).
  void announce_failure() { control_.announce_failure(); }
  /// Collective, the agreement that ends every step: `failure` is this rank's ("" if none).
  /// Returns when no rank failed; otherwise every rank throws the same Error, naming the rank
  /// that failed first-hand and its message. The next step's messages carry other tags.
  void agree(std::string failure) { control_.agree(std::move(failure)); }

 protected:
  /// MPI_COMM_WORLD, initializing MPI (MPI_THREAD_SERIALIZED) unless the program did.
  MpiRanks(int& argc, char**& argv, std::size_t data_parallel, std::chrono::seconds peer_timeout)
      : session_(std::make_unique<mpi::Session>(argc, argv)),
        control_(MPI_COMM_WORLD, data_parallel, peer_timeout) {}
  /// On the caller's communicator, MPI initialized by the caller.
  MpiRanks(MPI_Comm comm, std::size_t data_parallel, std::chrono::seconds peer_timeout)
      : control_(comm, data_parallel, peer_timeout) {}
  ~MpiRanks() = default;

  Local& local() { return static_cast<Derived&>(*this).local_; }
  const Local& local() const { return static_cast<const Derived&>(*this).local_; }

  std::unique_ptr<mpi::Session> session_;  ///< set when this initialized MPI: finalized last
  MpiControl control_;                     ///< layout, tags, faults, clocks
};

}  // namespace gpipe::detail
