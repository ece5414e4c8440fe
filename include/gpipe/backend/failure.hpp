#pragma once
// The failure latch of a backend's stream work: the first failure is kept with where it happened,
// later work is skipped, and synchronize() rethrows it once. host::StreamGroup and cuda::Backend
// use it alike.

#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "gpipe/backend/common.hpp"

namespace gpipe::detail {

/// The first failure of a backend's work, and whether later work is to be skipped. fail() keeps
/// the first error with its description and trips the latch; failed() tells work to skip; take()
/// hands the failure over and opens the latch again. Thread-safe (the host backend's workers fail
/// it concurrently); failed() is a lock-free load, asked before every piece of work.
class FailureLatch {
 public:
  /// A kept failure; both members empty when there was none.
  struct Failure {
    /// What the work threw; null when nothing failed, or when the latch was only tripped.
    std::exception_ptr error;
    std::string where;  ///< `describe(label, device)` of the work that threw

    /// Throws `error` with `where` in front of its message (rethrow_from: OutOfMemory stays
    /// OutOfMemory), when there is one.
    void rethrow() const {
      if (error) rethrow_from(error, where);
    }
  };

  /// Trips the latch, keeping `error` and `where` unless an error is kept already. A null `error`
  /// (a cancel, a stream's destruction) only trips it: later work is skipped, nothing is thrown.
  void fail(std::exception_ptr error, std::string where) {
    std::lock_guard lock(mu_);
    if (!failure_.error) failure_ = {std::move(error), std::move(where)};
    failed_.store(true, std::memory_order_release);
  }
  /// Whether work is to be skipped: fail() has been called since the last take().
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// Returns the kept failure (empty if none) and clears it, so that work runs again.
  Failure take() {
    std::lock_guard lock(mu_);
    failed_.store(false, std::memory_order_release);
    return std::exchange(failure_, {});
  }

 private:
  std::mutex mu_;
  std::atomic<bool> failed_{false};  ///< written under mu_
  Failure failure_;
};

}  // namespace gpipe::detail
