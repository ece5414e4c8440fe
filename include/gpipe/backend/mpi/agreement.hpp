#pragma once
// The fault protocol of an MPI backend: a failing rank tells every other at once, waits give up
// when one has failed or a peer is silent too long, and every step ends with an agreement that
// makes all ranks throw the same Error.

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// Between the polls of a wait: spins for the first 100, then sleeps 50 us each.
inline void pause_between_polls(int polls) {
  if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

/// A rank's side of the fault protocol (see the top of this file), over `layout`'s world. A rank
/// that dies takes no part: it ends the job (mpirun).
class FaultAgreement {
 public:
  /// Over `layout`'s world (which must outlive this); a wait fails after `peer_timeout`.
  FaultAgreement(MpiLayout& layout, std::chrono::seconds peer_timeout)
      : layout_(layout), peer_timeout_(peer_timeout) {}
  FaultAgreement(const FaultAgreement&) = delete;
  FaultAgreement& operator=(const FaultAgreement&) = delete;

  /// How long a rank waits for a peer before it fails the step.
  std::chrono::seconds peer_timeout() const { return peer_timeout_; }
  /// Whether `peer_timeout()` has passed since `start`.
  bool timed_out(std::chrono::steady_clock::time_point start) const {
    return std::chrono::steady_clock::now() - start > peer_timeout_;
  }
  /// Whether this rank failed this step and told the others.
  bool announced() const { return announced_; }
  /// Whether this rank's work stopped because another rank failed (its Error is not first-hand).
  bool stopped_for_peer() const { return stopped_for_peer_; }
  /// This rank's work stopped because another rank failed.
  void stop_for_peer() { stopped_for_peer_ = true; }

  /// Runs `work`; if it throws a failure of this rank's own (not one that stopped for a peer),
  /// tells every other rank at once, so that a rank waiting for this one stops waiting; rethrows.
  template <class Work>
  void telling_failure(Work&& work) {
    try {
      std::forward<Work>(work)();
    } catch (...) {
      if (!stopped_for_peer_) announce_failure();
      throw;
    }
  }
  /// Tells every other rank that this one failed (a zero-byte message each; sent once a step).
  void announce_failure() {
    if (announced_) return;
    announced_ = true;
    for (std::size_t r = 0; r < layout_.size(); ++r) {
      if (r == layout_.rank()) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(nullptr, 0, MPI_BYTE, static_cast<int>(r), layout_.fault_tag(), layout_.comm(),
                    &request) == MPI_SUCCESS)
        MPI_Request_free(&request);  // completes by itself; nothing to keep
    }
  }
  /// Whether a fault message has arrived (consumed, and remembered until the step ends).
  bool peer_failed() {
    if (fault_seen_) return true;
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, layout_.fault_tag(), layout_.comm(), &flag, &status);
    if (flag == 0) return false;
    MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, layout_.fault_tag(), layout_.comm(),
             MPI_STATUS_IGNORE);
    ++faults_received_;
    fault_seen_ = true;
    return true;
  }
  /// Waits for `request`, polling, until it completes, another rank reports a failure, or
  /// peer_timeout() passes; the last two cancel it and throw an Error that names `what`.
  MPI_Status wait_for(MPI_Request& request, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      MPI_Status status;
      check_mpi(MPI_Test(&request, &done, &status), "MPI_Test");
      if (done) return status;
      const bool failed = peer_failed();
      if (failed || timed_out(start)) {
        MPI_Cancel(&request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        stopped_for_peer_ = true;
        throw Error(failed ? "stopped waiting for " + what + ": another rank failed"
                           : "no " + what + " within " + std::to_string(peer_timeout_.count()) +
                                 " s (Options::peer_timeout): is that rank alive?");
      }
      pause_between_polls(polls);
    }
  }

  /// Collective over the world, the agreement that ends every step: `message` is this rank's
  /// failure ("" if none). Returns when no rank failed; otherwise every rank throws the Error of
  /// the rank that failed first-hand (the lowest such rank), carrying its message. Either way the
  /// next step's messages take other tags.
  void agree(std::string message) {
    // 2: this rank failed first-hand; 1: it stopped because another did
    const bool failed = !message.empty();
    struct {
      int failed;
      int rank;
    } mine{failed ? (stopped_for_peer_ ? 1 : 2) : 0, static_cast<int>(layout_.rank())}, worst{};
    check_mpi(MPI_Allreduce(&mine, &worst, 1, MPI_2INT, MPI_MAXLOC, layout_.comm()),
              "MPI_Allreduce");
    int announced = announced_ ? 1 : 0, announcements = 0;
    check_mpi(MPI_Allreduce(&announced, &announcements, 1, MPI_INT, MPI_SUM, layout_.comm()),
              "MPI_Allreduce");
    drain_fault_messages(static_cast<std::size_t>(announcements - announced));
    layout_.next_step();
    stopped_for_peer_ = announced_ = false;
    if (worst.failed == 0) return;
    int length = static_cast<int>(message.size());
    check_mpi(MPI_Bcast(&length, 1, MPI_INT, worst.rank, layout_.comm()), "MPI_Bcast");
    message.resize(static_cast<std::size_t>(length));
    check_mpi(MPI_Bcast(message.data(), length, MPI_CHAR, worst.rank, layout_.comm()), "MPI_Bcast");
    constexpr std::string_view prefix = "gpipe: ";
    if (message.starts_with(prefix)) message.erase(0, prefix.size());
    throw Error("gpipe: rank " + std::to_string(worst.rank) + " failed: " + message);
  }

  /// The message of `failure`, the one the agreement carries.
  static std::string message_of(std::exception_ptr failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      if (*e.what() != '\0') return e.what();
    } catch (...) {
    }
    return "an exception without a message";
  }

 private:
  // Receives the fault messages of this step not yet consumed (`expected` in all).
  void drain_fault_messages(std::size_t expected) {
    for (; faults_received_ < expected; ++faults_received_)
      MPI_Recv(nullptr, 0, MPI_BYTE, MPI_ANY_SOURCE, layout_.fault_tag(), layout_.comm(),
               MPI_STATUS_IGNORE);
    faults_received_ = 0;
    fault_seen_ = false;
  }

  MpiLayout& layout_;
  std::chrono::seconds peer_timeout_;
  bool announced_ = false;         ///< this rank failed this step and told the others
  bool stopped_for_peer_ = false;  ///< this rank's work stopped because another rank failed
  bool fault_seen_ = false;        ///< a fault message arrived this step
  std::size_t faults_received_ = 0;
};

}  // namespace gpipe::detail
