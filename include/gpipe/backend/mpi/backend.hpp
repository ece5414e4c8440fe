#pragma once
// gpipe::mpi::Backend: one host device per MPI rank. With R = Options::data_parallel replicas
// of a K-device pipeline (world size R K), rank r is device r % K of replica r / K, so stage s
// runs on the ranks with r % K == s % K; the Trainer, the schedules and the model types are the
// ones of one process. Replica i takes its share of the mini-batch, and each stage's gradients
// are summed over the replicas during the step (below). Each rank issues only its own device's
// ops; activations and gradients cross between ranks as MPI point-to-point messages:
//   send     MPI_Isend from the sender's output buffer, on its device's worker; the buffer stays
//            with the pending send and is freed on the sender once the send completes (checked
//            at every later transfer and at synchronize), so a send never blocks its device
//   receive  MPI_Irecv into memory the receiver allocates, waited for on its worker
// The loss and predict's output live on the last stage's rank; the Trainer broadcasts them so
// that every rank returns the same values.
//
//   gpipe::mpi::Backend backend(argc, argv);   // MPI_COMM_WORLD, initialized here if need be;
//                                              // launched as `mpirun -n K ./train`
//   gpipe::mpi::Backend backend(comm);         // or on a communicator of the caller's
//   gpipe::Trainer<Model, Loss, gpipe::mpi::Backend, gpipe::OneFOneB> trainer(backend, {...});
//
// MPI is called from the rank's device worker during a step and from the calling thread between
// steps, never at once: MPI_THREAD_SERIALIZED is enough (checked at construction).
// Failures: work that throws tells every other rank at once; receives poll for that (and give
// up after Options::peer_timeout); finish_step, collective at the end of every step, makes all
// ranks throw the same Error naming the failing rank. A failure while a rank issues its part
// of a step (before its work runs) takes the same way (abort_step). A rank that dies ends the
// job (mpirun).
// Time: every rank's traces and timings count from one origin (align_clocks); take_trace()
// merges all ranks' work into one trace and take_timing() gives every rank the whole
// pipeline's timing (both collective), so a Trainer's last_step() is the pipeline's.
// Data parallel: the step's gradient sums over the replicas start on each rank's worker as soon
// as its stage's last backward is done (expect_reductions, start_reduction) and end in
// finish_step.
// Tied parameters on two ranks are kept equal and their gradients summed with exchange().
// Not yet (see the README's "Many processes"): NCCL between GPUs.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/host/backend.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

inline void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("gpipe: ") + call + " failed: " + std::string(text, length));
}

}  // namespace gpipe::detail

namespace gpipe::mpi {

/// MPI_Init_thread / MPI_Finalize for a program's lifetime, unless MPI is already initialized.
class Session {
 public:
  /// Initializes MPI with MPI_THREAD_SERIALIZED from main's `argc` and `argv` (which MPI may edit),
  /// unless it is already initialized, in which case the destructor leaves it alone too. Throws
  /// `gpipe::Error` when MPI_Init_thread fails.
  Session(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    detail::check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided),
                      "MPI_Init_thread");
    owns_ = true;
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    if (owns_) MPI_Finalize();
  }

 private:
  bool owns_ = false;
};

/// Construction options of an mpi::Backend, the same on every rank.
struct BackendOptions {
  std::size_t data_parallel = 1;    ///< replicas of the pipeline: world size = data_parallel x K
  std::size_t device_capacity = 0;  ///< bytes of this rank's device; 0 = no cap
  /// How long a rank waits for a message before it fails the step: a peer that died (or hangs)
  /// ends the step here within this time. A peer that throws ends it at once.
  std::chrono::seconds peer_timeout{600};
};

/// One host device per MPI rank: a `gpipe::data_parallel_backend` (backend/concepts.hpp) whose
/// world of R x K ranks runs R replicas of a K-device pipeline, rank r being device r % K of
/// replica r / K. Each rank runs its own device on a one-device host::Backend and issues only that
/// device's ops; activations and gradients cross between ranks as MPI messages (send, receive),
/// and a step ends with the collective finish_step(), which makes every rank throw the same Error
/// if any failed. Device arguments name pipeline devices 0..K-1; one that is not this rank's
/// throws `gpipe::Error`, except where a member says otherwise.
///
///     gpipe::mpi::Backend backend(argc, argv);  // MPI_COMM_WORLD; launched as mpirun -n K ./train
class Backend {
 public:
  /// The host backend's float kernel context: a rank's device is a host device.
  using Kernels = host::Kernels<float>;
  /// Orders work within this rank's device (across ranks, messages do).
  using Event = host::Event;
  /// Owning handle of `count` elements of `T` in this rank's device memory (host memory).
  template <class T>
  using Buffer = host::Buffer<T>;
  /// A piece of work: runs on this rank's device worker with its Kernels.
  using Work = host::Stream::Work;
  /// Construction options: replicas, capacity, peer timeout.
  using Options = BackendOptions;

  /// The backend's name as the runtime tests it.
  static constexpr std::string_view name = "mpi";

  /// MPI_COMM_WORLD; initializes MPI (MPI_THREAD_SERIALIZED) unless the program did, and then
  /// finalizes it when the backend goes.
  Backend(int& argc, char**& argv, Options options = {})
      : session_(std::make_unique<Session>(argc, argv)),
        comm_(MPI_COMM_WORLD),
        local_(1, {.device_capacity = options.device_capacity,
                   .first_device = device_in(comm_, options)}) {
    start(options);
  }
  /// On the caller's communicator, MPI initialized by the caller.
  explicit Backend(MPI_Comm comm = MPI_COMM_WORLD, Options options = {})
      : comm_(comm),
        local_(1, {.device_capacity = options.device_capacity,
                   .first_device = device_in(comm_, options)}) {
    start(options);
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  ~Backend() {
    try {
      local_.cancel();
    } catch (...) {  // a destructor reports nothing
    }
    complete_sends();
    free_communicators();
  }

  /// One device per rank: world rank r is device r % K of replica r / K (K = world size /
  /// data_parallel).
  std::size_t num_devices() const { return devices_; }
  /// Ranks in the communicator: R replicas x K devices.
  std::size_t world_size() const { return size_; }
  /// This process's rank in the communicator (rank 0 writes the files of a collective save).
  std::size_t rank() const { return rank_; }
  /// The pipeline device this rank runs: rank() % K.
  std::size_t device() const { return device_; }
  /// R, the pipeline replicas (Options::data_parallel).
  std::size_t replicas() const { return replicas_; }
  /// The replica this rank belongs to: rank() / K.
  std::size_t replica() const { return replica_; }
  /// Whether this rank runs `device`; the runtime issues only its own device's work. Any device
  /// number is accepted.
  bool is_local(std::size_t device) const { return device == device_; }
  /// The communicator given at construction; the backend's messages within a replica and its sums
  /// over the replicas use communicators split from it.
  MPI_Comm communicator() const { return comm_; }

  /// Bytes of this rank's device, as host::Backend::memory_stats counts them.
  MemoryStats memory_stats(std::size_t device) const { return local_.memory_stats(local(device)); }
  /// Sets this rank's device's peaks to its current use.
  void reset_peak() { local_.reset_peak(); }

  /// `count` uninitialized elements on this rank's `device`, counted under `kind`; throws
  /// OutOfMemory past Options::device_capacity.
  template <class T>
  Buffer<T> allocate(std::size_t device, std::size_t count, MemoryKind kind = MemoryKind::other) {
    return local_.template allocate<T>(local(device), count, kind);
  }
  /// Work that throws tells every other rank at once (a fault message), so that a rank waiting
  /// for this one's data stops waiting; the step then fails everywhere (finish_step).
  void submit(std::size_t device, WorkLabel label, Work work) {
    local_.submit(local(device), label, [this, work = std::move(work)](Kernels& k) {
      try {
        work(k);
      } catch (...) {
        if (!stopped_for_peer_) announce_failure();
        throw;
      }
    });
  }
  /// As host::Backend::record, on this rank's device.
  void record(std::size_t device, const Event& event) { local_.record(local(device), event); }
  /// As host::Backend::wait, on this rank's device.
  void wait(std::size_t device, const Event& event) { local_.wait(local(device), event); }

  /// On `device` (this rank's), after the work before it: sends src's `src.size()` floats to
  /// `peer`'s rank with `tag`, and takes src over until the send completes.
  void send(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
            Buffer<float>& src) {
    const int message_tag = step_tag(peer, tag);
    submit(device, label, [this, peer, message_tag, &src](Kernels&) {
      Pending pending{MPI_REQUEST_NULL, std::move(src)};
      detail::check_mpi(MPI_Isend(pending.buffer.data(), count_of(pending.buffer.size()), MPI_FLOAT,
                                  static_cast<int>(peer), message_tag, pipeline_, &pending.request),
                        "MPI_Isend");
      std::lock_guard lock(mu_);
      pending_.push_back(std::move(pending));
      release_completed_sends();
    });
  }
  /// On `device`, after the work before it: dst <- `count` floats from `peer`'s rank with `tag`,
  /// into memory allocated here (counted as `kind`).
  void receive(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
               Buffer<float>& dst, std::size_t count, MemoryKind kind) {
    const int message_tag = step_tag(peer, tag);
    submit(device, label, [this, device, peer, tag, message_tag, &dst, count, kind](Kernels&) {
      dst = allocate<float>(device, count, kind);
      MPI_Request request = MPI_REQUEST_NULL;
      detail::check_mpi(MPI_Irecv(dst.data(), count_of(count), MPI_FLOAT, static_cast<int>(peer),
                                  message_tag, pipeline_, &request),
                        "MPI_Irecv");
      const MPI_Status status = wait_for(request, "a message from device " + std::to_string(peer) +
                                                      " (tag " + std::to_string(tag) + ")");
      int received = 0;
      MPI_Get_count(&status, MPI_FLOAT, &received);
      if (static_cast<std::size_t>(received) != count)
        throw Error("gpipe: rank " + std::to_string(rank_) + " expected " + std::to_string(count) +
                    " floats from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                    "), got " + std::to_string(received));
      std::lock_guard lock(mu_);
      release_completed_sends();
    });
  }

  /// Collective over this replica's ranks, between steps: each gets the values of `device`'s.
  void broadcast(std::size_t device, std::span<float> values) {
    detail::check_mpi(MPI_Bcast(values.data(), count_of(values.size()), MPI_FLOAT,
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

  /// The step's gradient sums over the replicas, overlapped with the step: `values` (memory of
  /// this rank's device) in the order start_reduction will start them. Each is an
  /// MPI_Iallreduce over the replicas, started on the device's worker once its stage's last
  /// backward is done and completed by finish_step. A collective cannot be cancelled, so after a
  /// failure finish_step (or abort_step) starts the sums not yet started, on whatever the arrays
  /// hold: every rank starts the same ones, in the same order, every step.
  void expect_reductions(std::vector<std::span<float>> values) {
    std::lock_guard lock(mu_);
    detail::require(reductions_started_ == reductions_.size(),
                    "mpi::Backend: a step's gradient sums are still open");
    reductions_ = std::move(values);
    reductions_started_ = 0;
    reduction_requests_.clear();
  }
  /// On this rank's `device`, after the work submitted before it: starts the next sum that
  /// expect_reductions() announced (an MPI_Iallreduce in place; nothing once all have started).
  void start_reduction(std::size_t device, WorkLabel label) {
    submit(device, label, [this](Kernels&) {
      std::lock_guard lock(mu_);
      start_next_reduction();
    });
  }

  /// Traces and timings count microseconds from one origin on every rank (see align_clocks).
  void set_tracing(bool on) { local_.set_tracing(on); }
  /// Collective over the world: every rank gets the work of every rank since the last call, one
  /// merged trace ordered by start time, each event's device being its rank (with one replica,
  /// the pipeline device). The events' `what` stays valid while the backend lives.
  std::vector<TraceEvent> take_trace() {
    std::vector<char> mine;
    for (TraceEvent e : local_.take_trace()) {
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
  /// Collective over this replica's ranks: the compute time of each of its devices since the
  /// last call (every rank gets all of them), so that a Trainer's last_step() covers the whole
  /// pipeline on every rank.
  std::vector<ComputeTiming> take_timing() {
    ComputeTiming t = local_.take_timing().front();
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

  /// Drops this rank's work not yet run and releases its event waits, then waits for its pending
  /// sends (a send that may never be received after a failure is let go). Local: it tells no other
  /// rank; abort_step() does.
  void cancel() {
    local_.cancel();
    complete_sends();
  }
  /// Waits for this rank's work and its sends; rethrows the first failure on this rank.
  void synchronize() {
    local_.synchronize();
    complete_sends();
  }

  /// Collective, at the end of a step (the executor calls it instead of synchronize): waits for
  /// this rank's work, then the ranks agree whether any of them failed. If one did, every rank
  /// throws the same Error: the rank, and the failure as that rank saw it (stage, micro-batch and
  /// the original message). The next step's messages carry other tags than this one's.
  void finish_step() {
    std::string message;
    try {
      synchronize();
    } catch (...) {
      message = message_of(std::current_exception());
    }
    try {
      complete_reductions();
    } catch (...) {
      if (message.empty()) message = message_of(std::current_exception());
    }
    agree(std::move(message));
  }
  /// Collective, instead of finish_step, when issuing this rank's part of a step failed before
  /// its work could (an allocation of the issuing thread, say): tells the other ranks at once,
  /// drops the work issued so far, and joins the agreement; throws the agreed Error.
  [[noreturn]] void abort_step(std::exception_ptr failure) {
    announce_failure();
    try {
      cancel();
      complete_reductions();
    } catch (...) {  // the failure to report is `failure`
    }
    agree(message_of(failure));
    throw Error("gpipe: rank " + std::to_string(rank_) + " failed");  // agree threw already
  }

 private:
  struct Pending {
    MPI_Request request;
    Buffer<float> buffer;
  };

  /// This rank's device index in its pipeline, for the labels of its one host device (0 where
  /// start() will refuse the setup).
  static std::size_t device_in(MPI_Comm comm, const Options& options) {
    int initialized = 0, rank = 0, size = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0 || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS ||
        MPI_Comm_size(comm, &size) != MPI_SUCCESS || options.data_parallel == 0 ||
        static_cast<std::size_t>(size) % options.data_parallel != 0)
      return 0;
    return static_cast<std::size_t>(rank) %
           (static_cast<std::size_t>(size) / options.data_parallel);
  }

  /// One origin for every rank's clock: clock_offset_us_ turns this rank's microseconds since its
  /// host backend's epoch into microseconds since the origin. When all ranks share a machine
  /// they share steady_clock (CLOCK_MONOTONIC on Linux) and the origin is rank 0's epoch, exactly;
  /// across machines it is the end of a barrier, as exact as the barrier's ranks leave it at
  /// once (microseconds on shared memory, tens of microseconds over a network).
  void align_clocks() {
    MPI_Comm node = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type");
    int node_size = 0, one_machine = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    const int mine = static_cast<std::size_t>(node_size) == size_ ? 1 : 0;
    detail::check_mpi(MPI_Allreduce(&mine, &one_machine, 1, MPI_INT, MPI_MIN, comm_),
                      "MPI_Allreduce");
    using Clock = host::Stream::Clock;
    const auto epoch = local_.epoch();
    if (one_machine != 0) {
      long long first =
          std::chrono::duration_cast<std::chrono::nanoseconds>(epoch.time_since_epoch()).count();
      const long long own = first;
      detail::check_mpi(MPI_Bcast(&first, 1, MPI_LONG_LONG, 0, comm_), "MPI_Bcast");
      clock_offset_us_ = static_cast<double>(own - first) / 1000.0;
    } else {
      detail::check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
      clock_offset_us_ = -std::chrono::duration<double, std::micro>(Clock::now() - epoch).count();
    }
  }

  /// A trace event as bytes (all_gather's unit), and back; `what` is interned in labels_.
  static void put_event(std::vector<char>& out, const TraceEvent& e) {
    const std::uint64_t fields[4] = {e.device, e.label.stage, e.label.micro_batch,
                                     (e.label.internal ? 1u : 0u) | (e.label.compute ? 2u : 0u)};
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
                      .compute = (fields[3] & 2u) != 0},
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

  void start(const Options& options) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    detail::require(initialized != 0,
                    "mpi::Backend(comm) needs MPI initialized (MPI_Init_thread, or construct "
                    "it from argc, argv)");
    int provided = 0;
    MPI_Query_thread(&provided);
    detail::require(provided >= MPI_THREAD_SERIALIZED,
                    "mpi::Backend needs MPI initialized with at least MPI_THREAD_SERIALIZED "
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
    peer_timeout_ = options.peer_timeout;
    detail::require(options.data_parallel >= 1 && size_ % options.data_parallel == 0,
                    "mpi::Backend: the world has " + std::to_string(size_) +
                        " ranks, which is not data_parallel = " +
                        std::to_string(options.data_parallel) + " replicas x K devices");
    replicas_ = options.data_parallel;
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
    align_clocks();
  }
  void free_communicators() {
    for (MPI_Comm* c : {&pipeline_, &replicas_comm_, &exchange_comm_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }

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
  /// Starts the next expected gradient sum, if any is left; called with mu_ held.
  void start_next_reduction() {
    if (reductions_started_ == reductions_.size()) return;
    const std::span<float> values = reductions_[reductions_started_++];
    MPI_Request request = MPI_REQUEST_NULL;
    detail::check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size()),
                                     MPI_FLOAT, MPI_SUM, replicas_comm_, &request),
                      "MPI_Iallreduce");
    reduction_requests_.push_back(request);
  }
  /// Between steps (the worker idle): starts the expected sums not started, then waits for all.
  /// Every rank of the replicas' communicator starts the same sums (see expect_reductions), so
  /// the wait ends unless a rank died, which ends the job.
  void complete_reductions() {
    std::lock_guard lock(mu_);
    while (reductions_started_ < reductions_.size()) start_next_reduction();
    std::vector<MPI_Request> requests = std::move(reduction_requests_);
    reduction_requests_.clear();
    reductions_.clear();
    reductions_started_ = 0;
    if (requests.empty()) return;
    detail::check_mpi(
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall");
  }

  /// Frees the buffers of sends that have completed; called with mu_ held.
  void release_completed_sends() {
    for (std::size_t i = 0; i < pending_.size();) {
      int done = 0;
      detail::check_mpi(MPI_Test(&pending_[i].request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) {
        pending_[i] = std::move(pending_.back());
        pending_.pop_back();
      } else {
        ++i;
      }
    }
  }
  /// Waits for every pending send (their receivers run the same schedule) and frees them. After
  /// a failure (here or elsewhere) a send may never be received: it is let go, its buffer kept
  /// until the backend goes (MPI may still read it).
  void complete_sends() {
    std::lock_guard lock(mu_);
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0; !pending_.empty(); ++polls) {
      release_completed_sends();
      if (pending_.empty()) break;
      if (announced_ || peer_failed() || std::chrono::steady_clock::now() - start > peer_timeout_) {
        for (Pending& p : pending_) {
          MPI_Request_free(&p.request);
          abandoned_.push_back(std::move(p.buffer));
        }
        pending_.clear();
        break;
      }
      if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::unique_ptr<Session> session_;  ///< set when this backend initialized MPI: finalized last
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
  std::vector<Buffer<float>> abandoned_;       ///< buffers of sends let go after a failure
  std::mutex mu_;
  std::vector<Pending> pending_;
  std::vector<std::span<float>> reductions_;  ///< this step's gradient sums (expect_reductions)
  std::size_t reductions_started_ = 0;
  std::vector<MPI_Request> reduction_requests_;
  host::Backend local_;  ///< the rank's device; destroyed (workers joined) before pending_
};

}  // namespace gpipe::mpi
