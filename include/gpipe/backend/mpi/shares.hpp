#pragma once
// ZeRO-1 over an MPI backend's replicas: which share of a stage's parameters each replica's
// optimizer keeps, and the collectives that put the shares together again.

#include <mpi.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/deadline.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// Replica r's share of n elements split over R replicas (ZeRO-1's optimizer shards): the
/// elements [first, last) with first = n r / R, last = n (r + 1) / R.
constexpr std::pair<std::size_t, std::size_t> replica_share(std::size_t n, std::size_t replicas,
                                                            std::size_t replica) {
  return {n * replica / replicas, n * (replica + 1) / replicas};
}

/// The collectives over `layout`'s replicas that join their shares (replica_share), between
/// steps.
class OptimizerShares {
 public:
  /// Over `layout`'s replicas, waiting for them until `deadline`; both must outlive this.
  OptimizerShares(const MpiLayout& layout, PeerDeadline& deadline)
      : layout_(layout), deadline_(deadline) {}

  /// Collective over the replicas: `values` (n elements of host memory or of this rank's device)
  /// <- every replica's share of them (replica_share(n, R, r) from replica r), in place.
  void allgather(std::span<float> values) {
    const Shares s = shares_of(values.size());
    deadline_.require_together();
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), s.counts.data(),
                              s.offsets.data(), MPI_FLOAT, layout_.replicas_comm(), &request),
              "MPI_Iallgatherv");
    deadline_.complete(request, "the optimizer shares' gather");
  }
  /// Collective over the replicas: the n elements of which each replica holds its share (`mine`,
  /// replica_share(n, R, r)'s size), whole on replica 0 and empty elsewhere.
  std::vector<float> gather(std::span<const float> mine, std::size_t n) {
    const Shares s = shares_of(n);
    const std::size_t r = layout_.replica();
    require(static_cast<int>(mine.size()) == s.counts[r],
            "a replica's share of " + std::to_string(n) + " elements has " +
                std::to_string(s.counts[r]) + ", not " + std::to_string(mine.size()));
    std::vector<float> whole(r == 0 ? n : 0);
    deadline_.require_together();
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Igatherv(mine.data(), s.counts[r], MPI_FLOAT, whole.data(), s.counts.data(),
                           s.offsets.data(), MPI_FLOAT, 0, layout_.replicas_comm(), &request),
              "MPI_Igatherv");
    deadline_.complete(request, "the optimizer shares' gather");
    return whole;
  }

 private:
  struct Shares {
    std::vector<int> counts, offsets;  ///< [r]: replica r's, for MPI's v-collectives
  };
  Shares shares_of(std::size_t n) const {
    const std::size_t replicas = layout_.replicas();
    Shares s{std::vector<int>(replicas), std::vector<int>(replicas)};
    for (std::size_t r = 0; r < replicas; ++r) {
      const auto [first, last] = replica_share(n, replicas, r);
      s.offsets[r] = mpi_count(first);
      s.counts[r] = mpi_count(last - first);
    }
    return s;
  }

  const MpiLayout& layout_;
  PeerDeadline& deadline_;
};

}  // namespace gpipe::detail
