#pragma once
// The fault protocol of an MPI backend: a failing rank tells every other at once, waits give up
// when one has failed or a peer is silent past the deadline (deadline.hpp), and every step ends
// with an agreement that makes all ranks throw the same Error.

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/deadline.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// What a receive with `label` (its op, stage and micro-batch) waits for, from world rank `peer`:
/// "stage 1's activation of micro-batch 2 from rank 1". An executor's tag is odd for a gradient.
inline std::string awaited_message(const WorkLabel& label, std::size_t tag, std::size_t peer) {
  const bool gradient = tag % 2 == 1;
  std::string out;
  if (label.stage != WorkLabel::none)
    out = "stage " + std::to_string(gradient ? label.stage + 1 : label.stage - 1) + "'s ";
  out += gradient ? "gradient" : "activation";
  if (label.micro_batch != WorkLabel::none)
    out += " of micro-batch " + std::to_string(label.micro_batch);
  return out + " from rank " + std::to_string(peer);
}

/// A rank's side of the fault protocol (see the top of this file), over `layout`'s world. A rank
/// that dies takes no part: it ends the job (mpirun).
class FaultAgreement {
 public:
  /// Over `layout`'s world; a wait fails past `deadline` (both must outlive this).
  FaultAgreement(MpiLayout& layout, PeerDeadline& deadline)
      : layout_(layout), deadline_(deadline) {}
  FaultAgreement(const FaultAgreement&) = delete;
  FaultAgreement& operator=(const FaultAgreement&) = delete;

  /// How long a rank waits for a peer before it fails the step.
  std::chrono::milliseconds peer_timeout() const { return deadline_.timeout(); }
  /// Whether `peer_timeout()` has passed since `start`.
  bool timed_out(std::chrono::steady_clock::time_point start) const {
    return deadline_.passed(start);
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
  /// This rank's own work failed, even though it stopped waiting for a peer's failure before
  /// (its GPU's work did not end: a peer that waited for it may have failed first, for want of
  /// it): its failure is first-hand; tells the others, unless it did already.
  void fail_first_hand() {
    stopped_for_peer_ = false;
    announce_failure();
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
  /// Waits for `request`, a receive from world rank `peer`, polling (each poll holding `lock`,
  /// which serializes the rank's MPI calls across its threads), until it completes, another rank
  /// reports a failure, or peer_timeout() passes; the last two cancel it and throw an Error that
  /// names `what()` (what it waits for). Past the deadline this rank's failure is first-hand (the
  /// peer did not send): it tells the others at once, so that none waits for it in turn.
  template <class Lock, class What>
  MPI_Status wait_for(MPI_Request& request, std::size_t peer, Lock& lock, What&& what) {
    deadline_.require_together();
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      {
        std::lock_guard held(lock);
        int done = 0;
        MPI_Status status;
        check_mpi(MPI_Test(&request, &done, &status), "MPI_Test");
        if (done) return status;
        const bool failed = peer_failed();
        if (deadline_.peer_abandoned()) {  // a rank failed between steps: the ranks are lost
          MPI_Cancel(&request);
          MPI_Wait(&request, MPI_STATUS_IGNORE);
          stopped_for_peer_ = true;
          deadline_.require_together();
        }
        if (failed || timed_out(start)) {
          MPI_Cancel(&request);
          MPI_Wait(&request, MPI_STATUS_IGNORE);
          if (failed) {
            stopped_for_peer_ = true;
            throw Error("stopped waiting for " + what() + ": another rank failed");
          }
          announce_failure();
          throw Error("waited " + std::to_string(peer_timeout().count()) + " ms for " + what() +
                      " (Options::peer_timeout): rank " + std::to_string(peer) +
                      " did not send it: is it stuck in its work, or dead?");
        }
      }
      pause_between_polls(polls);
    }
  }

  /// Collective over the world, the agreement that ends every step: `message` is this rank's
  /// failure ("" if none), `out_of_memory` whether it was an OutOfMemory. Returns when no rank
  /// failed; otherwise every rank throws the Error of the rank that failed first-hand (the lowest
  /// such rank), carrying its message: an OutOfMemory where that rank's was one, so that a caller
  /// that tries a smaller configuration on OutOfMemory (gpipe::measure_plan_costs) does so on
  /// every rank alike. Either way the next step's messages take other tags.
  void agree(std::string message, bool out_of_memory = false) {
    if (deadline_.lost()) lost_at_the_end(message, deadline_.lost_message());
    // 2: this rank failed first-hand; 1: it stopped because another did. Members, not locals:
    // a collective past the deadline may still write into them.
    const bool failed = !message.empty();
    mine_ = {failed ? (stopped_for_peer_ ? 1 : 2) : 0, static_cast<int>(layout_.rank())};
    announced_count_[0] = announced_ ? 1 : 0;
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    check_mpi(
        MPI_Iallreduce(&mine_, &worst_, 1, MPI_2INT, MPI_MAXLOC, layout_.comm(), &requests[0]),
        "MPI_Iallreduce");
    check_mpi(MPI_Iallreduce(&announced_count_[0], &announced_count_[1], 1, MPI_INT, MPI_SUM,
                             layout_.comm(), &requests[1]),
              "MPI_Iallreduce");
    try {
      deadline_.complete(requests, "the agreement that ends the step");
    } catch (const Error& e) {
      lost_at_the_end(message, e.what());
    }
    drain_fault_messages(static_cast<std::size_t>(announced_count_[1] - announced_count_[0]));
    layout_.next_step();
    stopped_for_peer_ = announced_ = false;
    if (worst_.failed == 0) return;
    header_[0] = static_cast<int>(message.size());
    header_[1] = out_of_memory ? 1 : 0;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(header_, 2, MPI_INT, worst_.rank, layout_.comm(), &request), "MPI_Ibcast");
    deadline_.complete(request, "the agreement's message");
    message_.assign(message);
    message_.resize(static_cast<std::size_t>(header_[0]));
    check_mpi(
        MPI_Ibcast(message_.data(), header_[0], MPI_CHAR, worst_.rank, layout_.comm(), &request),
        "MPI_Ibcast");
    deadline_.complete(request, "the agreement's message");
    constexpr std::string_view prefix = "gpipe: ";
    message = message_;
    if (message.starts_with(prefix)) message.erase(0, prefix.size());
    message = "gpipe: rank " + std::to_string(worst_.rank) + " failed: " + message;
    if (header_[1] != 0) throw OutOfMemory(message);
    throw Error(message);
  }

  /// Whether `failure` is an OutOfMemory (what the agreement carries beside its message).
  static bool out_of_memory(std::exception_ptr failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const OutOfMemory&) {
      return true;
    } catch (...) {
    }
    return false;
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
  // The agreement cannot complete (a rank never reached it, `lost` says so): throws this rank's
  // own failure (`message`, "" if none) and that.
  [[noreturn]] void lost_at_the_end(std::string message, std::string lost) const {
    // a rank's failure between steps: its Error alone (this rank's failure stems from it)
    if (deadline_.abandoned()) deadline_.require_together();
    constexpr std::string_view prefix = "gpipe: ";
    if (message.starts_with(prefix)) message.erase(0, prefix.size());
    if (message.empty()) throw Error(lost);
    throw Error("gpipe: rank " + std::to_string(layout_.rank()) + " failed: " + message +
                "; then " + lost.substr(prefix.size()));
  }
  // Receives the fault messages of this step not yet consumed (`expected` in all).
  void drain_fault_messages(std::size_t expected) {
    for (; faults_received_ < expected; ++faults_received_)
      MPI_Recv(nullptr, 0, MPI_BYTE, MPI_ANY_SOURCE, layout_.fault_tag(), layout_.comm(),
               MPI_STATUS_IGNORE);
    faults_received_ = 0;
    fault_seen_ = false;
  }

  MpiLayout& layout_;
  PeerDeadline& deadline_;
  bool announced_ = false;         ///< this rank failed this step and told the others
  bool stopped_for_peer_ = false;  ///< this rank's work stopped because another rank failed
  bool fault_seen_ = false;        ///< a fault message arrived this step
  std::size_t faults_received_ = 0;
  // agree()'s collective buffers
  struct {
    int failed = 0;
    int rank = 0;
  } mine_, worst_;
  int announced_count_[2] = {0, 0};  ///< this rank's announcement, the world's
  int header_[2] = {0, 0};           ///< the failed rank's message length, and whether OutOfMemory
  std::string message_;
};

}  // namespace gpipe::detail
