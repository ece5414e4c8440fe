#pragma once
// The check that stands in for tags where messages have none (NCCL matches a pair's messages on a
// communicator in the order they are posted): every step, what each rank sent to each peer in
// each direction (tags and sizes, hashed) must be what that peer received.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/backend/mpi/deadline.hpp"
#include "gpipe/backend/mpi/layout.hpp"

namespace gpipe::detail {

/// Running hashes of a step's messages, per peer and direction (the tag's parity), and their
/// comparison over `layout`'s pipeline.
class MessageHashes {
 public:
  /// Over `layout`'s pipeline, waiting for it until `deadline`; both must outlive this.
  MessageHashes(const MpiLayout& layout, PeerDeadline& deadline)
      : layout_(layout),
        deadline_(deadline),
        sent_(2 * layout.devices(), 0),
        received_(2 * layout.devices(), 0),
        sent_to_me_(2 * layout.devices(), 0) {}

  /// This rank posted a send of `bytes` with `tag` to `peer`.
  void sent(std::size_t peer, std::size_t tag, std::size_t bytes) { fold(sent_, peer, tag, bytes); }
  /// This rank posted a receive of `bytes` with `tag` from `peer`.
  void received(std::size_t peer, std::size_t tag, std::size_t bytes) {
    fold(received_, peer, tag, bytes);
  }

  /// Collective over this replica's ranks: "" when every rank received from each peer exactly
  /// what that peer sent to it, in order, since the last check; else the first mismatch this rank
  /// sees. Starts the next step's hashes. Throws `gpipe::Error` past the deadline.
  std::string check() {
    const std::size_t k = layout_.devices();
    deadline_.require_together();
    MPI_Request request = MPI_REQUEST_NULL;
    const int status = MPI_Ialltoall(sent_.data(), 2, MPI_UINT64_T, sent_to_me_.data(), 2,
                                     MPI_UINT64_T, layout_.pipeline(), &request);
    std::string out;
    if (status != MPI_SUCCESS)
      out = "gpipe: MPI_Ialltoall failed while checking NCCL messages";
    else
      deadline_.complete(request, "the check of the step's NCCL messages");
    for (std::size_t i = 0; i < 2 * k && out.empty(); ++i)
      if (sent_to_me_[i] != received_[i])
        out = "gpipe: the NCCL " + std::string(i % 2 == 1 ? "gradients" : "activations") +
              " from device " + std::to_string(i / 2) + " to device " +
              std::to_string(layout_.device()) +
              " were posted in another order (or with other sizes) by the receiver than by the "
              "sender: NCCL has no tags, so the schedule must post each pair's messages in the "
              "same order on both sides";
    sent_.assign(2 * k, 0);
    received_.assign(2 * k, 0);
    return out;
  }

 private:
  static void fold(std::vector<std::uint64_t>& hashes, std::size_t peer, std::size_t tag,
                   std::size_t bytes) {
    std::uint64_t& h = hashes[2 * peer + (tag & 1u)];
    for (const std::uint64_t v :
         {static_cast<std::uint64_t>(tag), static_cast<std::uint64_t>(bytes)})
      h = (h ^ v) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  }

  const MpiLayout& layout_;
  PeerDeadline& deadline_;
  std::vector<std::uint64_t> sent_, received_;  ///< [2 peer + direction]
  std::vector<std::uint64_t>
      sent_to_me_;  ///< check()'s: a collective past the deadline may write it
};

}  // namespace gpipe::detail
