#pragma once
// The deadline of every wait of an MPI rank for its peers (Options::peer_timeout): a message, a
// gradient sum, a collective between steps, the agreement that ends a step. A wait for a message
// can be cancelled and the step fails; a collective cannot: once one passes the deadline the
// ranks can run nothing more together ("lost"), every later collective throws at once, and the
// backend ends the job when it goes (MPI_Finalize would wait for the lost rank forever). A rank
// whose work fails between steps (abandon) leaves the ranks lost as well: it skipped collectives
// the others may be in already; it tells them at once, and their waits end when they see it.

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
      if (peer_abandoned()) require_together();
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

  /// Between steps, this rank's work failed with `failure` while doing `what` (e.g.
  /// "Trainer::step"): it may have skipped collectives that the other ranks run, so the ranks are
  /// lost; tells every other rank at once (a message with the failure's text), unless they were
  /// lost already. Its own later collectives throw at once.
  void abandon(std::string_view what, std::string_view failure) {
    if (lost()) return;
    constexpr std::string_view prefix = "gpipe: ";
    if (failure.starts_with(prefix)) failure.remove_prefix(prefix.size());
    told_ = "in " + std::string(what) + ": " + std::string(failure);
    for (std::size_t r = 0; r < layout_.size(); ++r) {
      if (r == layout_.rank()) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(told_.data(), static_cast<int>(told_.size()), MPI_CHAR, static_cast<int>(r),
                    layout_.abandon_tag(), layout_.comm(), &request) == MPI_SUCCESS)
        MPI_Request_free(&request);  // told_ stays until the backend goes
    }
    lose_to(layout_.rank(), told_);
  }
  /// Whether another rank failed between steps (abandon), or the ranks were lost before: a
  /// poll; the first such message makes the ranks lost, naming that rank and its failure.
  bool peer_abandoned() {
    if (lost()) return true;
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, layout_.abandon_tag(), layout_.comm(), &flag, &status);
    if (flag == 0) return false;
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string text(static_cast<std::size_t>(length), '\0');
    MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, layout_.abandon_tag(),
             layout_.comm(), MPI_STATUS_IGNORE);
    lose_to(static_cast<std::size_t>(status.MPI_SOURCE), text);
    return true;
  }

  /// Whether the ranks are lost to a rank's failure between steps (abandon, peer_abandoned).
  bool abandoned() const { return !abandoned_.empty(); }
  /// Whether a collective passed the deadline, or a rank failed between steps: the ranks can
  /// run nothing more together.
  bool lost() const { return !lost_.empty(); }
  /// Throws `gpipe::Error` when lost().
  void require_together() const {
    if (!abandoned_.empty()) throw Error(abandoned_);
    if (lost())
      throw Error("gpipe: rank " + std::to_string(layout_.rank()) + " lost its peers in " + lost_ +
                  " (a wait past Options::peer_timeout)" + lost_suffix());
  }

 private:
  static std::string lost_suffix() {
    return ": a rank is stuck in its work, or dead, and the ranks can run nothing more together: "
           "the backend ends the job when it goes; restart it (from a checkpoint)";
  }

  // The ranks are lost to rank `rank`'s failure between steps (`text`: what it did, its message).
  void lose_to(std::size_t rank, const std::string& text) {
    lost_ = "rank " + std::to_string(rank) + "'s failure between steps";
    abandoned_ = "gpipe: rank " + std::to_string(rank) + " failed between steps, " + text +
                 ": the ranks can run nothing more together: the backend ends the job when it "
                 "goes; restart it (from a checkpoint)";
    lost_message_ = abandoned_;
  }

  const MpiLayout& layout_;
  std::chrono::milliseconds timeout_;
  std::string told_;          ///< abandon()'s message to the others, kept while its sends may run
  std::string abandoned_;     ///< the Error of a failure between steps; empty while none
  std::string lost_;          ///< the collective that passed the deadline; empty while none did
  std::string lost_message_;  ///< give_up's Error
};

}  // namespace gpipe::detail
