#pragma once
// One clock for all the ranks of an MPI backend, and what is measured on it: a span of time over
// all ranks, the merged trace and the pipeline's timing.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/deadline.hpp"
#include "gpipe/backend/mpi/layout.hpp"

namespace gpipe::detail {

/// A rank's clock on the common origin, rank 0's epoch, and the collectives that compare or merge
/// what the ranks measured.
class RankClocks {
 public:
  using Clock = std::chrono::steady_clock;

  /// Over `layout`'s world, which must outlive this; offset_us() is 0 until align().
  /// Collectives after align() wait for the other ranks until `deadline` (which must outlive this).
  RankClocks(const MpiLayout& layout, PeerDeadline& deadline)
      : layout_(layout), deadline_(deadline) {}
  RankClocks(const RankClocks&) = delete;
  RankClocks& operator=(const RankClocks&) = delete;

  /// Turns this rank's microseconds since the aligned `epoch` into microseconds since the origin.
  double offset_us() const { return offset_us_; }
  /// How far offset_us() may be from the true offset: 0 on rank 0 and where all ranks share a
  /// machine; across machines half the fastest round trip of align().
  double error_us() const { return error_us_; }

  /// Collective: one origin for every rank's clock, this rank's `epoch` (its device backend's)
  /// being offset_us() after it. When all ranks share a machine they share steady_clock
  /// (CLOCK_MONOTONIC on Linux) and the offset is exact. Across machines rank 0 asks each other
  /// rank for its clock `rounds` times (Cristian's method): the reply of the fastest round trip
  /// was read within half that round trip of its midpoint on rank 0's clock (microseconds over a
  /// network, where the exits of one barrier differ by milliseconds).
  void align(Clock::time_point epoch) {
    if (layout_.one_machine()) {
      long long first =
          std::chrono::duration_cast<std::chrono::nanoseconds>(epoch.time_since_epoch()).count();
      const long long own = first;
      check_mpi(MPI_Bcast(&first, 1, MPI_LONG_LONG, 0, layout_.comm()), "MPI_Bcast");
      offset_us_ = static_cast<double>(own - first) / 1000.0;
      error_us_ = 0;
      return;
    }
    MPI_Comm clocks = MPI_COMM_NULL;  // no message of the caller's can meet these
    check_mpi(MPI_Comm_dup(layout_.comm(), &clocks), "MPI_Comm_dup");
    if (layout_.rank() == 0) {
      offset_us_ = 0;
      error_us_ = 0;
      for (int r = 1; r < static_cast<int>(layout_.size()); ++r) ask_clock(epoch, r, clocks);
    } else {
      tell_clock(epoch, clocks);
    }
    MPI_Comm_free(&clocks);
  }

  /// Collective over the world: the seconds from the earliest rank's `start` to the latest rank's
  /// `end`, each rank's time points of its steady_clock taken on the one clock (`epoch` is the one
  /// that was aligned).
  double span_seconds(Clock::time_point epoch, Clock::time_point start, Clock::time_point end) {
    const auto us = [&](Clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t - epoch).count() + offset_us_;
    };
    deadline_.require_together();
    span_[0] = -us(start);
    span_[1] = us(end);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(span_, span_ + 2, 2, MPI_DOUBLE, MPI_MAX, layout_.comm(), &request),
              "MPI_Iallreduce");
    deadline_.complete(request, "the step's wall time");
    return (span_[3] + span_[2]) / 1e6;
  }

  /// Collective over the world: every rank gets every rank's `local` events, one merged trace
  /// ordered by start time, each event's device being its rank (with one replica, the pipeline
  /// device). The events' `what` stays valid while this lives.
  std::vector<TraceEvent> gather_trace(std::vector<TraceEvent> local) {
    std::vector<char> mine;
    for (TraceEvent e : local) {
      e.device = layout_.rank();
      e.start_us += offset_us_;
      e.end_us += offset_us_;
      put_event(mine, e);
    }
    deadline_.require_together();
    const std::vector<char> all = all_gather(mine, layout_.comm());
    std::vector<TraceEvent> events;
    for (std::size_t at = 0; at < all.size();) events.push_back(get_event(all, at));
    std::sort(events.begin(), events.end(),
              [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
    return events;
  }
  /// Collective over this replica's ranks: every rank gets each of its devices' timing `t`, so that
  /// a Trainer's last_step() covers the whole pipeline on every rank.
  std::vector<ComputeTiming> gather_timing(ComputeTiming t) {
    if (t.ops > 0) {
      t.first_start_us += offset_us_;
      t.last_end_us += offset_us_;
    }
    const std::size_t k = layout_.devices();
    deadline_.require_together();
    timing_.assign(4 * k + 4, 0.0);  // a member: a collective past the deadline may write it
    const double mine[4] = {t.busy_us, t.first_start_us, t.last_end_us, static_cast<double>(t.ops)};
    std::copy(mine, mine + 4, timing_.begin());
    double* all = timing_.data() + 4;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(timing_.data(), 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, layout_.pipeline(),
                             &request),
              "MPI_Iallgather");
    deadline_.complete(request, "the step's timing");
    std::vector<ComputeTiming> out(k);
    for (std::size_t d = 0; d < k; ++d)
      out[d] = {.busy_us = all[4 * d],
                .first_start_us = all[4 * d + 1],
                .last_end_us = all[4 * d + 2],
                .ops = static_cast<std::size_t>(all[4 * d + 3])};
    return out;
  }

 private:
  static constexpr int rounds = 16;

  static double us_since(Clock::time_point epoch) {
    return std::chrono::duration<double, std::micro>(Clock::now() - epoch).count();
  }
  // On rank 0: rank r's offset from the fastest of `rounds` round trips, sent back to it with
  // half that round trip, its error bound.
  static void ask_clock(Clock::time_point epoch, int r, MPI_Comm clocks) {
    double best_trip = std::numeric_limits<double>::infinity(), offset = 0;
    for (int i = 0; i < rounds; ++i) {
      double theirs = 0;
      const double sent = us_since(epoch);
      check_mpi(MPI_Send(nullptr, 0, MPI_BYTE, r, 0, clocks), "MPI_Send");
      check_mpi(MPI_Recv(&theirs, 1, MPI_DOUBLE, r, 0, clocks, MPI_STATUS_IGNORE), "MPI_Recv");
      const double back = us_since(epoch);
      if (back - sent < best_trip) {
        best_trip = back - sent;
        offset = (sent + back) / 2 - theirs;
      }
    }
    const double result[2] = {offset, best_trip / 2};
    check_mpi(MPI_Send(result, 2, MPI_DOUBLE, r, 1, clocks), "MPI_Send");
  }
  // On the other ranks: answers rank 0's rounds, then receives the offset and its error.
  void tell_clock(Clock::time_point epoch, MPI_Comm clocks) {
    for (int i = 0; i < rounds; ++i) {
      check_mpi(MPI_Recv(nullptr, 0, MPI_BYTE, 0, 0, clocks, MPI_STATUS_IGNORE), "MPI_Recv");
      const double ours = us_since(epoch);
      check_mpi(MPI_Send(&ours, 1, MPI_DOUBLE, 0, 0, clocks), "MPI_Send");
    }
    double result[2] = {0, 0};  // the offset and its error
    check_mpi(MPI_Recv(result, 2, MPI_DOUBLE, 0, 1, clocks, MPI_STATUS_IGNORE), "MPI_Recv");
    offset_us_ = result[0];
    error_us_ = result[1];
  }

  // A trace event as bytes (all_gather's unit), and back; `what` is interned in labels_.
  static void put_event(std::vector<char>& out, const TraceEvent& e) {
    const std::uint64_t fields[4] = {e.device, e.label.stage, e.label.micro_batch,
                                     (e.label.internal ? 1u : 0u) | (e.label.compute ? 2u : 0u) |
                                         (e.label.background ? 4u : 0u)};
    const double times[2] = {e.start_us, e.end_us};
    const std::uint64_t length = e.label.what.size();
    const auto append = [&out](const void* p, std::size_t n) {
      const char* c = static_cast<const char*>(p);
      out.insert(out.end(), c, c + n);
    };
    append(fields, sizeof fields);
    append(times, sizeof times);
    append(&length, sizeof length);
    append(e.label.what.data(), e.label.what.size());
  }
  TraceEvent get_event(const std::vector<char>& in, std::size_t& at) {
    std::uint64_t fields[4];
    double times[2];
    std::uint64_t length = 0;
    const auto take = [&](void* p, std::size_t n) {
      std::memcpy(p, in.data() + at, n);
      at += n;
    };
    take(fields, sizeof fields);
    take(times, sizeof times);
    take(&length, sizeof length);
    const std::string what(in.data() + at, length);
    at += length;
    const std::string_view interned = *labels_.insert(what).first;
    return {.device = fields[0],
            .label = {.what = interned,
                      .stage = fields[1],
                      .micro_batch = fields[2],
                      .internal = (fields[3] & 1u) != 0,
                      .compute = (fields[3] & 2u) != 0,
                      .background = (fields[3] & 4u) != 0},
            .start_us = times[0],
            .end_us = times[1]};
  }
  // Collective over `comm`: every rank's bytes, concatenated in rank order.
  std::vector<char> all_gather(const std::vector<char>& mine, MPI_Comm comm) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    const int count = mpi_count(mine.size());
    std::vector<int> counts(static_cast<std::size_t>(size)), offsets(counts.size());
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm, &request),
              "MPI_Iallgather");
    deadline_.complete(request, "a trace's gather");
    std::size_t total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = mpi_count(total);
      total += static_cast<std::size_t>(counts[r]);
    }
    std::vector<char> all(total);
    check_mpi(MPI_Iallgatherv(mine.data(), count, MPI_CHAR, all.data(), counts.data(),
                              offsets.data(), MPI_CHAR, comm, &request),
              "MPI_Iallgatherv");
    deadline_.complete(request, "a trace's gather");
    return all;
  }

  const MpiLayout& layout_;
  PeerDeadline& deadline_;
  double span_[4] = {0, 0, 0, 0};  ///< span_seconds()'s, and timing_ gather_timing()'s: members,
  std::vector<double> timing_;     ///< as a collective past the deadline may still write them
  double offset_us_ = 0;           ///< see align
  double error_us_ = 0;            ///< see error_us
  std::set<std::string, std::less<>> labels_;  ///< the `what` of events from other ranks
};

}  // namespace gpipe::detail
