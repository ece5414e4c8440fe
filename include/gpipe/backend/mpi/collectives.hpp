#pragma once
// What an MPI backend's ranks exchange between steps, with the worker idle: broadcasts within a
// replica, sums over the replicas, a vote over the world and the exchange of a tie across ranks.

#include <mpi.h>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/deadline.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// The between-steps collectives of `layout`'s ranks (see the top of this file); each says over
/// which ranks it is collective, and each waits for the others until `deadline` (deadline.hpp).
/// Host memory (or a host device's, the same thing).
class MpiCollectives {
 public:
  /// Collective over this replica's ranks: a communicator of exchange()'s own. `layout` and
  /// `deadline` must outlive this.
  MpiCollectives(const MpiLayout& layout, PeerDeadline& deadline)
      : layout_(layout), deadline_(deadline) {
    check_mpi(MPI_Comm_dup(layout_.pipeline(), &exchange_comm_), "MPI_Comm_dup");
  }
  ~MpiCollectives() {
    if (exchange_comm_ != MPI_COMM_NULL) MPI_Comm_free(&exchange_comm_);
  }
  MpiCollectives(const MpiCollectives&) = delete;
  MpiCollectives& operator=(const MpiCollectives&) = delete;

  /// Collective over this replica's ranks: each gets the values (float or double) of `device`'s.
  template <class T>
  void broadcast(std::size_t device, std::span<T> values) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
    deadline_.require_together();
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(values.data(), mpi_count(values.size()),
                         std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE,
                         static_cast<int>(device), layout_.pipeline(), &request),
              "MPI_Ibcast");
    deadline_.complete(request, "a broadcast from device " + std::to_string(device));
  }
  /// Collective over the world: whether every rank passed true.
  bool all_true(bool mine) {
    deadline_.require_together();
    vote_[0] = mine ? 1 : 0;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(&vote_[0], &vote_[1], 1, MPI_INT, MPI_MIN, layout_.comm(), &request),
              "MPI_Iallreduce");
    deadline_.complete(request, "a vote of every rank");
    return vote_[1] != 0;
  }
  /// Collective over the replicas (the ranks of the same device in every replica): values <- their
  /// sum over the replicas, in place.
  void allreduce_sum(std::span<float> values) {
    deadline_.require_together();
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values.data(), mpi_count(values.size()), MPI_FLOAT,
                             MPI_SUM, layout_.replicas_comm(), &request),
              "MPI_Iallreduce");
    deadline_.complete(request, "a sum over the replicas");
  }
  /// With `peer`'s rank of this replica, which calls it with this rank's device: sends `mine` and
  /// receives `theirs` (either may be empty; the sizes must match the peer's).
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs) {
    layout_.check_peer(peer, 0);
    deadline_.require_together();
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    check_mpi(MPI_Irecv(theirs.data(), mpi_count(theirs.size()), MPI_FLOAT, static_cast<int>(peer),
                        0, exchange_comm_, &requests[0]),
              "MPI_Irecv");
    check_mpi(MPI_Isend(mine.data(), mpi_count(mine.size()), MPI_FLOAT, static_cast<int>(peer), 0,
                        exchange_comm_, &requests[1]),
              "MPI_Isend");
    MPI_Status statuses[2];
    deadline_.complete(requests, "an exchange with device " + std::to_string(peer), statuses);
    int received = 0;
    MPI_Get_count(&statuses[0], MPI_FLOAT, &received);
    require(static_cast<std::size_t>(received) == theirs.size(),
            "rank " + std::to_string(layout_.rank()) + " expected " +
                std::to_string(theirs.size()) + " floats from device " + std::to_string(peer) +
                " in an exchange, got " + std::to_string(received));
  }

 private:
  const MpiLayout& layout_;
  PeerDeadline& deadline_;
  int vote_[2] = {0, 0};  ///< all_true()'s, a member: a collective past the deadline may write it
  MPI_Comm exchange_comm_ = MPI_COMM_NULL;  ///< the pipeline's ranks, for exchange() alone
};

}  // namespace gpipe::detail
