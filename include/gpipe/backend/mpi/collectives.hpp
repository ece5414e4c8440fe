#pragma once
// What an MPI backend's ranks exchange between steps, with the worker idle: broadcasts within a
// replica, sums over the replicas, a vote over the world and the exchange of a tie across ranks.

#include <mpi.h>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// The between-steps collectives of `layout`'s ranks (see the top of this file); each says over
/// which ranks it is collective. Host memory (or a host device's, the same thing).
class MpiCollectives {
 public:
  /// Collective over this replica's ranks: a communicator of exchange()'s own. `layout` must
  /// outlive this.
  explicit MpiCollectives(const MpiLayout& layout) : layout_(layout) {
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
    check_mpi(MPI_Bcast(values.data(), mpi_count(values.size()),
                        std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE, static_cast<int>(device),
                        layout_.pipeline()),
              "MPI_Bcast");
  }
  /// Collective over the world: whether every rank passed true.
  bool all_true(bool mine) {
    int in = mine ? 1 : 0, out = 0;
    check_mpi(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, layout_.comm()), "MPI_Allreduce");
    return out != 0;
  }
  /// Collective over the replicas (the ranks of the same device in every replica): values <- their
  /// sum over the replicas, in place.
  void allreduce_sum(std::span<float> values) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), mpi_count(values.size()), MPI_FLOAT,
                            MPI_SUM, layout_.replicas_comm()),
              "MPI_Allreduce");
  }
  /// With `peer`'s rank of this replica, which calls it with this rank's device: sends `mine` and
  /// receives `theirs` (either may be empty; the sizes must match the peer's).
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs) {
    layout_.check_peer(peer, 0);
    MPI_Status status;
    check_mpi(MPI_Sendrecv(mine.data(), mpi_count(mine.size()), MPI_FLOAT, static_cast<int>(peer),
                           0, theirs.data(), mpi_count(theirs.size()), MPI_FLOAT,
                           static_cast<int>(peer), 0, exchange_comm_, &status),
              "MPI_Sendrecv");
    int received = 0;
    MPI_Get_count(&status, MPI_FLOAT, &received);
    require(static_cast<std::size_t>(received) == theirs.size(),
            "rank " + std::to_string(layout_.rank()) + " expected " +
                std::to_string(theirs.size()) + " floats from device " + std::to_string(peer) +
                " in an exchange, got " + std::to_string(received));
  }

 private:
  const MpiLayout& layout_;
  MPI_Comm exchange_comm_ = MPI_COMM_NULL;  ///< the pipeline's ranks, for exchange() alone
};

}  // namespace gpipe::detail
