#pragma once
// An MPI backend's gradient sums over the replicas during a step: their order, which every rank
// must start alike (a collective cannot be cancelled, so after a failure the sums not yet started
// are started anyway, on whatever their arrays hold), and mpi::Backend's sums on MPI.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/deadline.hpp"
#include "gpipe/backend/mpi/layout.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

/// A step's gradient sums in the order they start: expect() announces them, next() hands out
/// each as it starts, and the step's end starts those left (all_started) and clears them.
class SumOrder {
 public:
  /// The step's arrays, in the order they will start; throws `gpipe::Error` naming `backend`
  /// while the previous step's are not all started.
  void expect(std::vector<std::span<float>> values, const char* backend) {
    require(started_ == values_.size(),
            std::string(backend) + ": a step's gradient sums are still open");
    values_ = std::move(values);
    started_ = 0;
  }
  /// The next array to sum; none once all have started.
  std::optional<std::span<float>> next() {
    if (started_ == values_.size()) return std::nullopt;
    return values_[started_++];
  }
  /// Whether every expected sum has started.
  bool all_started() const { return started_ == values_.size(); }
  /// The step's sums are over.
  void clear() {
    values_.clear();
    started_ = 0;
  }

 private:
  std::vector<std::span<float>> values_;
  std::size_t started_ = 0;
};

/// mpi::Backend's gradient sums: each an MPI_Iallreduce in place over `layout`'s replicas, traced
/// (when on) from its start to when the rank saw it complete, as background work labelled
/// "all-reduce gradients" with its stage. Times are the caller's microseconds (`now_us`). Not
/// thread-safe: the backend holds its lock.
class MpiGradientSums {
 public:
  /// Over `layout`'s replicas, waiting for them until `deadline`; both must outlive this.
  MpiGradientSums(const MpiLayout& layout, PeerDeadline& deadline)
      : layout_(layout), deadline_(deadline) {}

  /// The step's arrays, in the order start_next() will start them (see SumOrder::expect).
  void expect(std::vector<std::span<float>> values) {
    order_.expect(std::move(values), "mpi::Backend");
    requests_.clear();
  }
  /// Starts the next expected sum (of `stage`'s gradients), if any is left.
  void start_next(std::size_t stage, double now_us) {
    const std::optional<std::span<float>> values = order_.next();
    if (!values) return;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values->data(), mpi_count(values->size()), MPI_FLOAT,
                             MPI_SUM, layout_.replicas_comm(), &request),
              "MPI_Iallreduce");
    requests_.push_back(request);
    in_flight_.push_back({.stage = stage, .start_us = now_us});
  }
  /// Notes the sums that have completed by `now_us` (MPI_Test also drives their progress).
  void test(double now_us) {
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      check_mpi(MPI_Test(&requests_[i], &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) completed(i, now_us);
    }
  }
  /// Between steps: starts the expected sums not started, then waits for all. Every rank of the
  /// replicas starts the same sums, so the wait ends unless a rank is stuck or dead: then it
  /// throws past the deadline, and the ranks are lost (deadline.hpp).
  template <class Now>
  void finish(Now now_us) {
    deadline_.require_together();
    while (!order_.all_started()) start_next(WorkLabel::none, now_us());
    const auto start = PeerDeadline::Clock::now();
    for (int polls = 0;; ++polls) {
      test(now_us());
      if (std::ranges::all_of(requests_, [](MPI_Request r) { return r == MPI_REQUEST_NULL; }))
        break;
      if (deadline_.passed(start)) deadline_.give_up("the gradient sums over the replicas");
      pause_between_polls(polls);
    }
    requests_.clear();
    in_flight_.clear();
    order_.clear();
  }

  /// Turns the sums' trace events on or off.
  void set_tracing(bool on) { tracing_ = on; }
  /// The traced sums since the last call.
  std::vector<TraceEvent> take_events() { return std::exchange(events_, {}); }

 private:
  // Sum `index` has completed (its request is MPI_REQUEST_NULL): its trace event.
  void completed(std::size_t index, double now_us) {
    if (!tracing_) return;
    events_.push_back({.device = layout_.device(),
                       .label = {.what = "all-reduce gradients",
                                 .stage = in_flight_[index].stage,
                                 .background = true},
                       .start_us = in_flight_[index].start_us,
                       .end_us = now_us});
  }

  struct InFlight {
    std::size_t stage = WorkLabel::none;  ///< whose gradients (none: started after a failure)
    double start_us = 0;
  };
  const MpiLayout& layout_;
  PeerDeadline& deadline_;
  SumOrder order_;
  std::vector<MPI_Request> requests_;
  std::vector<InFlight> in_flight_;  ///< [i] of requests_[i]
  bool tracing_ = false;
  std::vector<TraceEvent> events_;  ///< the traced sums since take_events
};

}  // namespace gpipe::detail
