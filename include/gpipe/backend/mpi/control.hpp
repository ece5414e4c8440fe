#pragma once
// What gpipe's MPI backends share, whatever device a rank runs (a host device, mpi::Backend; a
// GPU, mpi::CudaBackend): the world's layout (R replicas x K devices, rank r is device r % K of
// replica r / K, and the communicators of one pipeline and of one device's replicas), message
// tags that keep a failed step's messages from meeting a later step's, the fault protocol (a
// failing rank tells every other at once; every step ends with an agreement that makes all ranks
// throw the same Error), one clock origin for all ranks, and the merged trace and timing.
// MPI is called by one thread at a time (MPI_THREAD_SERIALIZED).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

inline void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("gpipe: ") + call + " failed: " + std::string(text, length));
}

// The control plane of an MPI backend (see the top of this file). Collective members say so; the
// others are local.
class MpiControl {
 public:
  /// Collective over `comm` (MPI initialized with at least MPI_THREAD_SERIALIZED): splits it
  /// into the pipelines and the replicas. Throws `gpipe::Error` when the world is not
  /// `data_parallel` x K ranks.
  MpiControl(MPI_Comm comm, std::size_t data_parallel, std::chrono::seconds peer_timeout)
      : comm_(comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    detail::require(initialized != 0,
                    "mpi::Backend(comm) and mpi::CudaBackend(comm) need MPI initialized "
                    "(MPI_Init_thread, or construct "
                    "it from argc, argv)");
    int provided = 0;
    MPI_Query_thread(&provided);
    detail::require(provided >= MPI_THREAD_SERIALIZED,
                    "gpipe's MPI backends need MPI initialized with at least MPI_THREAD_SERIALIZED "
                    "(the rank's device worker calls MPI during a step)");
    int rank = 0, size = 0;
    detail::check_mpi(MPI_Comm_rank(comm_, &rank), "MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(comm_, &size), "MPI_Comm_size");
    rank_ = static_cast<std::size_t>(rank);
    size_ = static_cast<std::size_t>(size);
    int found = 0;
    int* tag_ub = nullptr;
    detail::check_mpi(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found), "MPI_Comm_get_attr");
    max_tag_ = found != 0 && tag_ub != nullptr ? static_cast<std::size_t>(*tag_ub) : 32767;
    peer_timeout_ = peer_timeout;
    detail::require(data_parallel >= 1 && size_ % data_parallel == 0,
                    "gpipe: the MPI world has " + std::to_string(size_) +
                        " ranks, which is not data_parallel = " + std::to_string(data_parallel) +
                        " replicas x K devices");
    replicas_ = data_parallel;
    devices_ = size_ / replicas_;
    replica_ = rank_ / devices_;
    device_ = rank_ % devices_;
    // the ranks of one replica (rank = device) and the ranks of one device (rank = replica)
    MPI_Comm pipeline = MPI_COMM_NULL, replicas = MPI_COMM_NULL;
    detail::check_mpi(
        MPI_Comm_split(comm_, static_cast<int>(replica_), static_cast<int>(device_), &pipeline),
        "MPI_Comm_split");
    detail::check_mpi(
        MPI_Comm_split(comm_, static_cast<int>(device_), static_cast<int>(replica_), &replicas),
        "MPI_Comm_split");
    pipeline_ = pipeline;
    replicas_comm_ = replicas;
    detail::check_mpi(MPI_Comm_dup(pipeline_, &exchange_comm_), "MPI_Comm_dup");
  }
  ~MpiControl() {
    for (MPI_Comm* c : {&pipeline_, &replicas_comm_, &exchange_comm_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }

  MpiControl(const MpiControl&) = delete;
  MpiControl& operator=(const MpiControl&) = delete;

  std::size_t rank() const { return rank_; }
  std::size_t size() const { return size_; }
  std::size_t devices() const { return devices_; }
  std::size_t replicas() const { return replicas_; }
  std::size_t replica() const { return replica_; }
  std::size_t device() const { return device_; }
  MPI_Comm comm() const { return comm_; }
  MPI_Comm pipeline() const { return pipeline_; }
  MPI_Comm replicas_comm() const { return replicas_comm_; }
  std::chrono::seconds peer_timeout() const { return peer_timeout_; }
  double clock_offset_us() const { return clock_offset_us_; }
  bool announced() const { return announced_; }
  bool stopped_for_peer() const { return stopped_for_peer_; }
  /// This rank's work stopped because another rank failed (its Error is not first-hand).
  void stop_for_peer() { stopped_for_peer_ = true; }

  std::size_t local(std::size_t device) const {
    detail::require(device < devices_, "device " + std::to_string(device) +
                                           " does not exist; the pipeline has " +
                                           std::to_string(devices_) + " devices, a rank each");
    detail::require(device == device_, "device " + std::to_string(device) + " belongs to rank " +
                                           std::to_string(replica_ * devices_ + device) +
                                           ", not to this rank (" + std::to_string(rank_) + ")");
    return 0;
  }
  void check_peer(std::size_t peer, std::size_t tag) const {
    detail::require(peer < devices_, "device " + std::to_string(peer) +
                                         " does not exist (the pipeline has " +
                                         std::to_string(devices_) + ")");
    detail::require(tag * epochs + epochs - 1 < max_tag_,
                    "message tag " + std::to_string(tag) + " exceeds this MPI's MPI_TAG_UB = " +
                        std::to_string(max_tag_) + " (too many stages x micro-batches)");
  }
  static int count_of(std::size_t n) {
    detail::require(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                    "a message of " + std::to_string(n) + " floats exceeds MPI's int count");
    return static_cast<int>(n);
  }
  /// Collective: one origin for every rank's clock. clock_offset_us() turns this rank's
  /// microseconds since `epoch` (its device backend's) into microseconds since the origin, rank
  /// 0's epoch. When all ranks share a machine they share steady_clock (CLOCK_MONOTONIC on
  /// Linux) and the offset is exact. Across machines rank 0 asks each other rank for its clock
  /// `rounds` times (Cristian's method): the reply of the fastest round trip was read within
  /// half that round trip of its midpoint on rank 0's clock (microseconds over a network,
  /// where the exits of one barrier differ by milliseconds).
  void align_clocks(std::chrono::steady_clock::time_point epoch) {
    MPI_Comm node = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type");
    int node_size = 0, one_machine = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    const int mine = static_cast<std::size_t>(node_size) == size_ ? 1 : 0;
    detail::check_mpi(MPI_Allreduce(&mine, &one_machine, 1, MPI_INT, MPI_MIN, comm_),
                      "MPI_Allreduce");
    using Clock = std::chrono::steady_clock;
    if (one_machine != 0) {
      long long first =
          std::chrono::duration_cast<std::chrono::nanoseconds>(epoch.time_since_epoch()).count();
      const long long own = first;
      detail::check_mpi(MPI_Bcast(&first, 1, MPI_LONG_LONG, 0, comm_), "MPI_Bcast");
      clock_offset_us_ = static_cast<double>(own - first) / 1000.0;
      return;
    }
    const auto now_us = [epoch] {
      return std::chrono::duration<double, std::micro>(Clock::now() - epoch).count();
    };
    constexpr int rounds = 16;
    MPI_Comm clocks = MPI_COMM_NULL;  // no message of the caller's can meet these
    detail::check_mpi(MPI_Comm_dup(comm_, &clocks), "MPI_Comm_dup");
    if (rank_ == 0) {
      clock_offset_us_ = 0;
      for (int r = 1; r < static_cast<int>(size_); ++r) {
        double best_trip = std::numeric_limits<double>::infinity(), offset = 0;
        for (int i = 0; i < rounds; ++i) {
          double theirs = 0;
          const double sent = now_us();
          detail::check_mpi(MPI_Send(nullptr, 0, MPI_BYTE, r, 0, clocks), "MPI_Send");
          detail::check_mpi(MPI_Recv(&theirs, 1, MPI_DOUBLE, r, 0, clocks, MPI_STATUS_IGNORE),
                            "MPI_Recv");
          const double back = now_us();
          if (back - sent < best_trip) {
            best_trip = back - sent;
            offset = (sent + back) / 2 - theirs;
          }
        }
        detail::check_mpi(MPI_Send(&offset, 1, MPI_DOUBLE, r, 1, clocks), "MPI_Send");
      }
    } else {
      for (int i = 0; i < rounds; ++i) {
        detail::check_mpi(MPI_Recv(nullptr, 0, MPI_BYTE, 0, 0, clocks, MPI_STATUS_IGNORE),
                          "MPI_Recv");
        const double ours = now_us();
        detail::check_mpi(MPI_Send(&ours, 1, MPI_DOUBLE, 0, 0, clocks), "MPI_Send");
      }
      detail::check_mpi(MPI_Recv(&clock_offset_us_, 1, MPI_DOUBLE, 0, 1, clocks, MPI_STATUS_IGNORE),
                        "MPI_Recv");
    }
    MPI_Comm_free(&clocks);
  }

  /// A trace event as bytes (all_gather's unit), and back; `what` is interned in labels_.
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
  /// Collective over `comm`: every rank's bytes, concatenated in rank order.
  static std::vector<char> all_gather(const std::vector<char>& mine, MPI_Comm comm) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    const int count = count_of(mine.size());
    std::vector<int> counts(static_cast<std::size_t>(size)), offsets(counts.size());
    detail::check_mpi(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm),
                      "MPI_Allgather");
    std::size_t total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = count_of(total);
      total += static_cast<std::size_t>(counts[r]);
    }
    std::vector<char> all(total);
    detail::check_mpi(MPI_Allgatherv(mine.data(), count, MPI_CHAR, all.data(), counts.data(),
                                     offsets.data(), MPI_CHAR, comm),
                      "MPI_Allgatherv");
    return all;
  }

  /// Collective over this replica's ranks, between steps: each gets the values of `device`'s.
  void broadcast(std::size_t device, std::span<float> values) {
    detail::check_mpi(MPI_Bcast(values.data(), count_of(values.size()), MPI_FLOAT,
                                static_cast<int>(device), pipeline_),
                      "MPI_Bcast");
  }
  /// Collective over the world: whether every rank passed true.
  bool all_true(bool mine) {
    int in = mine ? 1 : 0, out = 0;
    detail::check_mpi(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    return out != 0;
  }
  /// As above, of doubles.
  void broadcast(std::size_t device, std::span<double> values) {
    detail::check_mpi(MPI_Bcast(values.data(), count_of(values.size()), MPI_DOUBLE,
                                static_cast<int>(device), pipeline_),
                      "MPI_Bcast");
  }
  /// Between steps, with `peer`'s rank of this replica, which calls it with this rank's device:
  /// sends `mine` and receives `theirs` (either may be empty; the sizes must match the peer's).
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs) {
    check_peer(peer, 0);
    MPI_Status status;
    detail::check_mpi(
        MPI_Sendrecv(mine.data(), count_of(mine.size()), MPI_FLOAT, static_cast<int>(peer), 0,
                     theirs.data(), count_of(theirs.size()), MPI_FLOAT, static_cast<int>(peer), 0,
                     exchange_comm_, &status),
        "MPI_Sendrecv");
    int received = 0;
    MPI_Get_count(&status, MPI_FLOAT, &received);
    detail::require(static_cast<std::size_t>(received) == theirs.size(),
                    "rank " + std::to_string(rank_) + " expected " + std::to_string(theirs.size()) +
                        " floats from device " + std::to_string(peer) + " in an exchange, got " +
                        std::to_string(received));
  }

  /// Collective over the replicas (the ranks of the same device in every replica), between
  /// steps: values <- their sum over the replicas, in place. values is host memory or memory of
  /// this rank's device (the same thing here).
  void allreduce_sum(std::span<float> values) {
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), MPI_FLOAT,
                                    MPI_SUM, replicas_comm_),
                      "MPI_Allreduce");
  }

  /// Replica r's share of n elements split over R replicas (ZeRO-1's optimizer shards): the
  /// elements [first, last) with first = n r / R, last = n (r + 1) / R.
  static std::pair<std::size_t, std::size_t> share(std::size_t n, std::size_t replicas,
                                                   std::size_t replica) {
    return {n * replica / replicas, n * (replica + 1) / replicas};
  }
  /// Collective over the replicas, between steps: `values` (n elements of host memory or of this
  /// rank's device) <- every replica's share of them (share(n, R, r) from replica r), in place.
  void allgather_shares(std::span<float> values) {
    std::vector<int> counts, offsets;
    shares_of(values.size(), counts, offsets);
    detail::check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(),
                                     counts.data(), offsets.data(), MPI_FLOAT, replicas_comm_),
                      "MPI_Allgatherv");
  }
  /// Collective over the replicas, between steps: the n elements of which each replica holds its
  /// share (`mine`, share(n, R, r).size() elements), whole on replica 0 and empty elsewhere.
  std::vector<float> gather_shares(std::span<const float> mine, std::size_t n) {
    std::vector<int> counts, offsets;
    shares_of(n, counts, offsets);
    detail::require(static_cast<int>(mine.size()) == counts[replica_],
                    "a replica's share of " + std::to_string(n) + " elements has " +
                        std::to_string(counts[replica_]) + ", not " + std::to_string(mine.size()));
    std::vector<float> whole(replica_ == 0 ? n : 0);
    detail::check_mpi(MPI_Gatherv(mine.data(), counts[replica_], MPI_FLOAT, whole.data(),
                                  counts.data(), offsets.data(), MPI_FLOAT, 0, replicas_comm_),
                      "MPI_Gatherv");
    return whole;
  }

  /// Collective over the world: the seconds from the earliest rank's `start` to the latest rank's
  /// `end`, each rank's time points of its steady_clock taken on the one clock of align_clocks
  /// (`epoch` is the one that was aligned).
  double span_seconds(std::chrono::steady_clock::time_point epoch,
                      std::chrono::steady_clock::time_point start,
                      std::chrono::steady_clock::time_point end) {
    const auto us = [&](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t - epoch).count() + clock_offset_us_;
    };
    const double mine[2] = {-us(start), us(end)};
    double all[2] = {0, 0};
    detail::check_mpi(MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_MAX, comm_), "MPI_Allreduce");
    return (all[1] + all[0]) / 1e6;
  }

  /// Collective over the world: every rank gets every rank's `local` events, one merged trace
  /// ordered by start time, each event's device being its rank (with one replica, the pipeline
  /// device). The events' `what` stays valid while the backend lives.
  std::vector<TraceEvent> gather_trace(std::vector<TraceEvent> local) {
    std::vector<char> mine;
    for (TraceEvent e : local) {
      e.device = rank_;
      e.start_us += clock_offset_us_;
      e.end_us += clock_offset_us_;
      put_event(mine, e);
    }
    const std::vector<char> all = all_gather(mine, comm_);
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
      t.first_start_us += clock_offset_us_;
      t.last_end_us += clock_offset_us_;
    }
    const double mine[4] = {t.busy_us, t.first_start_us, t.last_end_us, static_cast<double>(t.ops)};
    std::vector<double> all(4 * devices_);
    detail::check_mpi(MPI_Allgather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, pipeline_),
                      "MPI_Allgather");
    std::vector<ComputeTiming> out(devices_);
    for (std::size_t d = 0; d < devices_; ++d)
      out[d] = {.busy_us = all[4 * d],
                .first_start_us = all[4 * d + 1],
                .last_end_us = all[4 * d + 2],
                .ops = static_cast<std::size_t>(all[4 * d + 3])};
    return out;
  }

  /// Message tags: the executor's tag (below MPI_TAG_UB / epochs) times `epochs`, plus the step
  /// modulo epochs, so that a failed step's unreceived messages never meet a later step's
  /// receives; MPI_TAG_UB itself is the fault message's.
  static constexpr std::size_t epochs = 8;
  int step_tag(std::size_t peer, std::size_t tag) const {
    check_peer(peer, tag);
    return static_cast<int>(tag * epochs + step_ % epochs);
  }
  int fault_tag() const { return static_cast<int>(max_tag_); }

  static std::string message_of(std::exception_ptr failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      if (*e.what() != '\0') return e.what();
    } catch (...) {
    }
    return "an exception without a message";
  }
  /// The agreement that ends every step: `message` is this rank's failure ("" if none). Returns
  /// when no rank failed; otherwise every rank throws the Error of the rank that failed
  /// first-hand (the lowest such rank), carrying its message.
  void agree(std::string message) {
    // 2: this rank failed first-hand; 1: it stopped because another did
    const bool failed = !message.empty();
    struct {
      int failed;
      int rank;
    } mine{failed ? (stopped_for_peer_ ? 1 : 2) : 0, static_cast<int>(rank_)}, worst{};
    detail::check_mpi(MPI_Allreduce(&mine, &worst, 1, MPI_2INT, MPI_MAXLOC, comm_),
                      "MPI_Allreduce");
    int announced = announced_ ? 1 : 0, announcements = 0;
    detail::check_mpi(MPI_Allreduce(&announced, &announcements, 1, MPI_INT, MPI_SUM, comm_),
                      "MPI_Allreduce");
    drain_fault_messages(static_cast<std::size_t>(announcements - announced));
    ++step_;
    stopped_for_peer_ = announced_ = false;
    if (worst.failed == 0) return;
    int length = static_cast<int>(message.size());
    detail::check_mpi(MPI_Bcast(&length, 1, MPI_INT, worst.rank, comm_), "MPI_Bcast");
    message.resize(static_cast<std::size_t>(length));
    detail::check_mpi(MPI_Bcast(message.data(), length, MPI_CHAR, worst.rank, comm_), "MPI_Bcast");
    constexpr std::string_view prefix = "gpipe: ";
    if (message.starts_with(prefix)) message.erase(0, prefix.size());
    throw Error("gpipe: rank " + std::to_string(worst.rank) + " failed: " + message);
  }

  /// Tells every other rank that this one failed (a zero-byte message each; sent once a step).
  void announce_failure() {
    if (announced_) return;
    announced_ = true;
    for (std::size_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(nullptr, 0, MPI_BYTE, static_cast<int>(r), fault_tag(), comm_, &request) ==
          MPI_SUCCESS)
        MPI_Request_free(&request);  // completes by itself; nothing to keep
    }
  }
  /// Whether a fault message has arrived (consumed, and remembered until the step ends).
  bool peer_failed() {
    if (fault_seen_) return true;
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, fault_tag(), comm_, &flag, &status);
    if (flag == 0) return false;
    MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, fault_tag(), comm_, MPI_STATUS_IGNORE);
    ++faults_received_;
    fault_seen_ = true;
    return true;
  }
  /// Receives the fault messages of this step not yet consumed (`expected` in all).
  void drain_fault_messages(std::size_t expected) {
    for (; faults_received_ < expected; ++faults_received_)
      MPI_Recv(nullptr, 0, MPI_BYTE, MPI_ANY_SOURCE, fault_tag(), comm_, MPI_STATUS_IGNORE);
    faults_received_ = 0;
    fault_seen_ = false;
  }

  /// Waits for `request`, polling, until it completes, another rank reports a failure, or
  /// Options::peer_timeout passes; the last two cancel it and throw.
  MPI_Status wait_for(MPI_Request& request, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      MPI_Status status;
      detail::check_mpi(MPI_Test(&request, &done, &status), "MPI_Test");
      if (done) return status;
      const bool failed = peer_failed();
      const bool late = std::chrono::steady_clock::now() - start > peer_timeout_;
      if (failed || late) {
        MPI_Cancel(&request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        stopped_for_peer_ = true;
        throw Error(failed ? "stopped waiting for " + what + ": another rank failed"
                           : "no " + what + " within " + std::to_string(peer_timeout_.count()) +
                                 " s (Options::peer_timeout): is that rank alive?");
      }
      if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  // Every replica's share of n elements: counts and offsets for MPI's v-collectives.
  void shares_of(std::size_t n, std::vector<int>& counts, std::vector<int>& offsets) const {
    counts.resize(replicas_);
    offsets.resize(replicas_);
    for (std::size_t r = 0; r < replicas_; ++r) {
      const auto [first, last] = share(n, replicas_, r);
      offsets[r] = count_of(first);
      counts[r] = count_of(last - first);
    }
  }

  MPI_Comm comm_;
  MPI_Comm pipeline_ = MPI_COMM_NULL;       ///< this replica's ranks; rank = device
  MPI_Comm replicas_comm_ = MPI_COMM_NULL;  ///< this device's rank in every replica
  MPI_Comm exchange_comm_ = MPI_COMM_NULL;  ///< pipeline_'s ranks, for exchange() between steps
  std::size_t rank_ = 0, size_ = 0, max_tag_ = 32767;
  std::size_t replicas_ = 1, devices_ = 1, replica_ = 0, device_ = 0;
  std::chrono::seconds peer_timeout_{600};
  std::size_t step_ = 0;           ///< steps finished: selects the tags' epoch
  bool announced_ = false;         ///< this rank failed this step and told the others
  bool stopped_for_peer_ = false;  ///< this rank's work stopped because another rank failed
  bool fault_seen_ = false;        ///< a fault message arrived this step
  std::size_t faults_received_ = 0;
  double clock_offset_us_ = 0;                 ///< see align_clocks
  std::set<std::string, std::less<>> labels_;  ///< the `what` of events from other ranks
};

}  // namespace gpipe::detail
