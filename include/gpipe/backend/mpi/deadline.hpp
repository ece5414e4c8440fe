#pragma once
// The deadline of every wait of an MPI rank for its peers (Options::peer_timeout): a message, a
// gradient sum, a collective between steps, the agreement that ends a step. A wait for a message
// can be cancelled and the step fails; a collective cannot: once one passes the deadline the
// ranks can run nothing more together ("lost"), every later collective throws at once, and the
// backend ends the job when it goes (MPI_Finalize would wait for the lost rank forever).

#include <mpi.h>

#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// Between the polls of a wait: spins for the first 100, then sleeps 50 us each.
inline void pause_between_polls(int polls) {
  if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

/// A rank's deadline for its peers (see the top of this file).
class PeerDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  /// Over `layout`'s world (which must outlive this); throws `gpipe::Error` unless `timeout` is
  /// positive.
  PeerDeadline(const MpiLayout& layout, std::chrono::milliseconds timeout)
      : layout_(layout), timeout_(timeout) {
    require(timeout.count() > 0, [&] {
      return "the MPI backend's Options::peer_timeout must be positive, got " +
             std::to_string(timeout.count()) + " ms";
    });
  }
  PeerDeadline(const PeerDeadline&) = delete;
  PeerDeadline& operator=(const PeerDeadline&) = delete;

  /// How long a rank waits for its peers (Options::peer_timeout).
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Whether timeout() has passed since `start`.
  bool passed(Clock::time_point start) const { return Clock::now() - start > timeout_; }

  /// Waits for the collective `requests` (all of them; MPI_REQUEST_NULL counts as complete),
  /// polling, for at most timeout(); then the ranks are lost and it throws `gpipe::Error` naming
  /// `what` (the collective). Throws at once when they were lost before. `statuses`: one per
  /// request, or MPI_STATUSES_IGNORE.
  void complete(std::span<MPI_Request> requests, std::string_view what,
                MPI_Status* statuses = MPI_STATUSES_IGNORE) {
    require_together();
    const Clock::time_point start = Clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, statuses),
                "MPI_Testall");
      if (done != 0) return;
      if (passed(start)) give_up(what);
      pause_between_polls(polls);
    }
  }
  /// As above, one request.
  void complete(MPI_Request& request, std::string_view what) {
    complete(std::span<MPI_Request>(&request, 1), what);
  }

  /// A collective `what` passed the deadline: the ranks are lost; throws `gpipe::Error` naming it
  /// (lost_message()).
  [[noreturn]] void give_up(std::string_view what) {
    lost_ = std::string(what);
    lost_message_ = "gpipe: rank " + std::to_string(layout_.rank()) + " waited " +
                    std::to_string(timeout_.count()) + " ms for every rank's part of " + lost_ +
                    " (Options::peer_timeout)" + lost_suffix();
    throw Error(lost_message_);
  }
  /// The Error's message of the collective that passed the deadline; empty while none did.
  const std::string& lost_message() const { return lost_message_; }

  /// Whether a collective passed the deadline: the ranks can run nothing more together.
  bool lost() const { return !lost_.empty(); }
  /// Throws `gpipe::Error` when lost().
  void require_together() const {
    if (lost())
      throw Error("gpipe: rank " + std::to_string(layout_.rank()) + " lost its peers in " + lost_ +
                  " (a wait past Options::peer_timeout)" + lost_suffix());
  }

 private:
  static std::string lost_suffix() {
    return ": a rank is stuck in its work, or dead, and the ranks can run nothing more together: "
           "the backend ends the job when it goes; restart it (from a checkpoint)";
  }

  const MpiLayout& layout_;
  std::chrono::milliseconds timeout_;
  std::string lost_;          ///< the collective that passed the deadline; empty while none did
  std::string lost_message_;  ///< give_up's Error
};

}  // namespace gpipe::detail
