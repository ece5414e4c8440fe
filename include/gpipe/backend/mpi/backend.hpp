#pragma once
// gpipe::mpi::Backend: one host device per MPI rank, R = Options::data_parallel replicas of a
// K-device pipeline (world size R K). It composes the MPI backends' shared base (ranks.hpp: the
// layout, the fault agreement, one clock, the collectives between steps, ZeRO-1's shares) with a
// one-device host::Backend, its sends in flight (sends.hpp) and its gradient sums (sums.hpp).
//
//   gpipe::mpi::Backend backend(argc, argv);   // MPI_COMM_WORLD, initialized here if need be;
//                                              // launched as `mpirun -n K ./train`
//   gpipe::mpi::Backend backend(comm);         // or on a communicator of the caller's
//   gpipe::Trainer<Model, Loss, gpipe::mpi::Backend, gpipe::OneFOneB> trainer(backend, {...});
//
// MPI is called from the rank's device worker during a step and from the calling thread between
// steps, never at once: MPI_THREAD_SERIALIZED is enough (checked at construction). A GPU per
// rank, with NCCL between them, is mpi::CudaBackend (backend/mpi/cuda_backend.cuh).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/host/backend.hpp"
#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/ranks.hpp"
#include "gpipe/backend/mpi/sends.hpp"
#include "gpipe/backend/mpi/sums.hpp"
#include "gpipe/error.hpp"
#include "gpipe/transport/mpi.hpp"

namespace gpipe::mpi {

/// How an mpi::Backend's rank moves its messages while its device computes. A large message
/// (over the transport's eager limit: 64 KiB on Open MPI's tcp) is a rendezvous that moves only
/// while the sender is inside MPI; a rank that computes several ops back to back (GPipe's
/// forwards) would hold each hand-over until its next message.
enum class Progress {
  /// `thread` when the ranks span machines (TCP between them), `at_messages` when they share one
  /// (shared memory, where the receiver copies the data itself).
  automatic,
  /// A thread of the rank's polls its sends in flight (and gradient sums) every 50 µs while any
  /// is pending, under the lock that serializes the rank's MPI calls.
  thread,
  /// Only the rank's device worker calls MPI, at each send and receive.
  at_messages,
};

/// Construction options of an mpi::Backend, the same on every rank.
struct BackendOptions {
  std::size_t data_parallel = 1;    ///< replicas of the pipeline: world size = data_parallel x K
  std::size_t device_capacity = 0;  ///< bytes of this rank's device; 0 = no cap
  /// How long a rank waits for its peers (a message, a gradient sum, a collective, the agreement
  /// that ends a step) before it fails the step with an Error naming what it waited for (op,
  /// stage, micro-batch and the rank that did not send): a peer that is stuck or dead ends the
  /// step on every other rank within about twice this time. A peer that throws ends it at once.
  /// When a collective passes it the ranks can run nothing more together (Backend::lost_peers()).
  /// Positive.
  std::chrono::milliseconds peer_timeout{std::chrono::minutes(10)};
  /// The threads this rank's device computes on (host::BackendOptions::threads_per_device): more
  /// than 1 where a rank has cores of its own to spare, e.g. one rank per machine.
  std::size_t threads_per_device = 1;
  /// ZeRO-1: with R replicas, each keeps the optimizer state of 1/R of each stage's parameters
  /// and updates only those; the updated shares are then gathered by every replica
  /// (MPI_Allgatherv). The same parameters as without it, bit for bit, 1/R of the state's memory
  /// per rank; checkpoints are written and read in the same format. The optimizer's update must
  /// treat each parameter on its own (SGD, AdamW: elementwise), as a share may cut a tensor.
  bool shard_optimizer = false;
  /// How the rank moves its messages while its device computes (see Progress).
  Progress progress = Progress::automatic;
};

/// One host device per MPI rank: a `gpipe::multi_process_backend` (backend/concepts.hpp) whose
/// world of R x K ranks runs R replicas of a K-device pipeline, rank r being device r % K of
/// replica r / K. Each rank runs its own device on a one-device host::Backend and issues only that
/// device's ops; activations and gradients cross between ranks as MPI messages (send, receive),
/// and a step ends with the collective agreement of its transport (transport/mpi.hpp), which makes
/// every rank throw the same Error if any failed. Device arguments name pipeline devices 0..K-1;
/// one that is not this rank's throws `gpipe::Error`, except where a member says otherwise.
///
///     gpipe::mpi::Backend backend(argc, argv);  // MPI_COMM_WORLD; launched as mpirun -n K ./train
class Backend : public detail::MpiRanks<Backend, host::Backend> {
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
  /// Construction options: replicas, capacity, peer timeout, threads per device.
  using Options = BackendOptions;

  /// The backend's name as the runtime tests it.
  static constexpr std::string_view name = "mpi";

  /// MPI_COMM_WORLD; initializes MPI (MPI_THREAD_SERIALIZED) unless the program did, and then
  /// finalizes it when the backend goes.
  Backend(int& argc, char**& argv, Options options = {})
      : MpiRanks(argc, argv, options.data_parallel, options.peer_timeout),
        local_(1, local_options(options)),
        shard_optimizer_(options.shard_optimizer) {
    clocks_.align(local_.epoch());
    warn_if_team_shares_cores();
    start_progress(options.progress);
  }
  /// On the caller's communicator, MPI initialized by the caller.
  explicit Backend(MPI_Comm comm = MPI_COMM_WORLD, Options options = {})
      : MpiRanks(comm, options.data_parallel, options.peer_timeout),
        local_(1, local_options(options)),
        shard_optimizer_(options.shard_optimizer) {
    clocks_.align(local_.epoch());
    warn_if_team_shares_cores();
    start_progress(options.progress);
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  ~Backend() {
    stop_progress();
    try {
      local_.cancel();
    } catch (...) {  // a destructor reports nothing
    }
    complete_sends();
  }

  /// The threads this rank's device computes on (Options::threads_per_device).
  std::size_t threads_per_device() const { return local_.threads_per_device(); }
  /// Whether each replica keeps only its share of the optimizer state (Options::shard_optimizer,
  /// with more than one replica).
  bool shards_optimizer() const { return shard_optimizer_ && replicas() > 1; }
  /// Between steps, collective over the replicas: `values` (memory of this rank's device) <-
  /// every replica's share of them (its 1/R, detail::replica_share), in place.
  void allgather_shares(std::span<float> values) {
    synchronize();
    shares_.allgather(values);
  }
  /// Between steps, collective over the replicas: the n elements whose share each replica holds
  /// in `mine` (memory of this rank's device), whole on replica 0 (host memory), empty elsewhere.
  std::vector<float> gather_shares(std::span<const float> mine, std::size_t n) {
    synchronize();
    return shares_.gather(mine, n);
  }
  /// Whether this rank's device, computing on threads_per_device() threads, wants more cores than
  /// the rank may use (host::usable_cores(): its affinity mask, which mpirun narrows to one core
  /// by default; false when unknown). `busy` is 0 or 1: a rank runs one device.
  bool devices_share_cores(std::size_t busy) const { return local_.devices_share_cores(busy); }

  /// Tells every other rank at once that this one failed (once a step), under the lock of the
  /// rank's MPI calls: the worker and the progress thread may be calling MPI.
  void announce_failure() {
    std::lock_guard lock(mu_);
    agreement_.announce_failure();
  }
  /// Whether a thread of this rank moves its messages while its device computes (Progress).
  bool progress_thread() const { return progress_.joinable(); }

  /// Work that throws tells every other rank at once (a fault message), so that a rank waiting
  /// for this one's data stops waiting; the step then fails everywhere (the agreement).
  void submit(std::size_t device, WorkLabel label, Work work) {
    local_.submit(layout_.local(device), label, [this, work = std::move(work)](Kernels& k) {
      try {
        work(k);
      } catch (...) {
        if (!agreement_.stopped_for_peer()) {
          std::lock_guard lock(mu_);
          agreement_.announce_failure();
        }
        throw;
      }
    });
  }
  /// As host::Backend::record, on this rank's device.
  void record(std::size_t device, const Event& event) {
    local_.record(layout_.local(device), event);
  }
  /// As host::Backend::wait, on this rank's device.
  void wait(std::size_t device, const Event& event) { local_.wait(layout_.local(device), event); }

  /// On `device` (this rank's), after the work before it: sends src's `src.size()` elements
  /// (float, or bf16 under gpipe::MixedBf16: half the bytes) to `peer`'s rank with `tag`, and
  /// takes src over until the send completes.
  template <class T>
  void send(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
            Buffer<T>& src) {
    const int message_tag = layout_.step_tag(peer, tag);
    submit(device, label, [this, peer, message_tag, &src](Kernels&) {
      deadline_.require_together();
      std::lock_guard lock(mu_);
      sends_.start(src, static_cast<int>(peer), message_tag, layout_.pipeline());
      release_completed_sends();
      if (progress_.joinable()) progress_wake_.notify_one();
    });
  }
  /// On `device`, after the work before it: dst <- `count` elements (float or bf16) from
  /// `peer`'s rank with `tag`, into memory allocated here (counted as `kind`).
  template <class T>
  void receive(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
               Buffer<T>& dst, std::size_t count, MemoryKind kind) {
    const int message_tag = layout_.step_tag(peer, tag);
    submit(
        device, label, [this, label, device, peer, tag, message_tag, &dst, count, kind](Kernels&) {
          dst = allocate<T>(device, count, kind);
          MPI_Request request = MPI_REQUEST_NULL;
          {
            std::lock_guard lock(mu_);
            detail::check_mpi(
                MPI_Irecv(dst.data(), detail::mpi_count(count), detail::mpi_type<T>(),
                          static_cast<int>(peer), message_tag, layout_.pipeline(), &request),
                "MPI_Irecv");
          }
          const std::size_t peer_rank = layout_.replica() * layout_.devices() + peer;
          const MPI_Status status = agreement_.wait_for(request, peer_rank, mu_, [&] {
            return detail::awaited_message(label, tag, peer_rank);
          });
          int received = 0;
          MPI_Get_count(&status, detail::mpi_type<T>(), &received);
          if (static_cast<std::size_t>(received) != count)
            throw Error("gpipe: rank " + std::to_string(layout_.rank()) + " expected " +
                        std::to_string(count) + (std::is_same_v<T, float> ? " floats" : " bf16") +
                        " from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                        "), got " + std::to_string(received));
          std::lock_guard lock(mu_);
          release_completed_sends();
        });
  }

  /// Between steps, with `peer`'s rank of this replica (which calls it with this rank's device):
  /// after this rank's work, sends `mine` and receives `theirs`, memory of this rank's device,
  /// which is host memory (either may be empty; the sizes must match the peer's): MPI_Sendrecv.
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs) {
    synchronize();
    collectives_.exchange(peer, mine, theirs);
  }

  /// The step's gradient sums over the replicas, overlapped with the step: `values` (memory of
  /// this rank's device) in the order start_reduction will start them. Each is an
  /// MPI_Iallreduce over the replicas, started on the device's worker once its stage's last
  /// backward is done and completed by finish_reductions. A collective cannot be cancelled, so
  /// after a failure finish_reductions starts the sums not yet started, on whatever the arrays
  /// hold: every rank starts the same ones, in the same order, every step.
  void expect_reductions(std::vector<std::span<float>> values) {
    std::lock_guard lock(mu_);
    sums_.expect(std::move(values));
  }
  /// On this rank's `device`, after the work submitted before it: starts the next sum that
  /// expect_reductions() announced (an MPI_Iallreduce in place; nothing once all have started).
  void start_reduction(std::size_t device, WorkLabel label) {
    submit(device, label, [this, stage = label.stage](Kernels&) {
      std::lock_guard lock(mu_);
      sums_.start_next(stage, local_us());
    });
  }

  /// Turns tracing on or off (this rank's device work, and its gradient sums: each traced from
  /// its start to when the rank saw it complete, as background work labelled "all-reduce
  /// gradients" with its stage).
  void set_tracing(bool on) {
    std::lock_guard lock(mu_);
    sums_.set_tracing(on);
    local_.set_tracing(on);
  }

  /// Collective over the world: every rank gets the work of every rank since the last call, one
  /// merged trace ordered by start time, each event's device being its rank (with one replica,
  /// the pipeline device). The events' `what` stays valid while the backend lives.
  std::vector<TraceEvent> take_trace() {
    std::vector<TraceEvent> events = local_.take_trace();
    {
      std::lock_guard lock(mu_);
      const std::vector<TraceEvent> sums = sums_.take_events();
      events.insert(events.end(), sums.begin(), sums.end());
    }
    return clocks_.gather_trace(std::move(events));
  }
  /// Collective over this replica's ranks: the compute time of each of its devices since the
  /// last call (every rank gets all of them), so that a Trainer's last_step() covers the whole
  /// pipeline on every rank.
  std::vector<ComputeTiming> take_timing() {
    return clocks_.gather_timing(local_.take_timing().front());
  }

  /// Local: this rank's compute time counts afresh from here (what take_timing() will gather).
  void restart_timing() { (void)local_.take_timing(); }

  /// Drops this rank's work not yet run and releases its event waits, then waits for its pending
  /// sends (a send that may never be received after a failure is let go). Local: it tells no other
  /// rank; the transport's abort_step() does.
  void cancel() {
    local_.cancel();
    complete_sends();
  }
  /// Waits for this rank's work and its sends; rethrows the first failure on this rank.
  void synchronize() {
    local_.synchronize();
    complete_sends();
  }

  /// Between steps (the worker idle): starts the expected sums not started, then waits for all.
  /// Every rank of the replicas' communicator starts the same sums (see expect_reductions), so
  /// the wait ends unless a rank died, which ends the job.
  void finish_reductions() {
    std::lock_guard lock(mu_);
    sums_.finish([this] { return local_us(); });
  }

 private:
  friend class detail::MpiRanks<Backend, host::Backend>;

  /// A line on stderr when the rank's threads_per_device exceed the cores its affinity mask
  /// allows: they would take turns on them, slower than one thread.
  void warn_if_team_shares_cores() const {
    if (!devices_share_cores(1)) return;
    std::fprintf(stderr,
                 "gpipe: rank %zu: threads_per_device = %zu, but this rank may run on %u core(s) "
                 "(its affinity mask): its threads will share them. mpirun binds each rank to one "
                 "core by default: start it with --bind-to none, or --map-by slot:PE=%zu\n",
                 rank(), threads_per_device(), host::usable_cores(), threads_per_device());
  }

  /// The rank's one-device host::Backend: its pipeline device, capacity and threads.
  host::BackendOptions local_options(const Options& options) const {
    return {.device_capacity = options.device_capacity,
            .first_device = layout_.device(),
            .threads_per_device = options.threads_per_device};
  }

  /// Microseconds since the rank's device's epoch: the clock of its traces.
  double local_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                     local_.epoch())
        .count();
  }
  /// Starts the progress thread when `progress` asks for it (Progress::automatic: when the
  /// ranks span machines).
  void start_progress(Progress progress) {
    const bool thread =
        progress == Progress::thread || (progress == Progress::automatic && !layout_.one_machine());
    if (thread) progress_ = std::thread([this] { progress_loop(); });
  }
  /// Stops and joins the progress thread, if any.
  void stop_progress() {
    if (!progress_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    progress_wake_.notify_one();
    progress_.join();
  }
  /// The progress thread: while sends are in flight, polls them (and the gradient sums) every
  /// progress_interval under mu_, so that MPI moves their data while the worker computes; sleeps
  /// while none is. Between steps no send is in flight, so it makes no MPI call then.
  void progress_loop() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      if (sends_.empty()) {  // also once the ranks are lost: complete_sends abandoned them
        progress_wake_.wait(lock);
        continue;
      }
      try {
        release_completed_sends();
      } catch (...) {  // the worker's next message reports MPI's failure
      }
      lock.unlock();
      std::this_thread::sleep_for(progress_interval);
      lock.lock();
    }
  }
  static constexpr std::chrono::microseconds progress_interval{50};

  /// Frees the buffers of sends that have completed and notes the completed gradient sums; called
  /// with mu_ held, at every message of the rank's worker.
  void release_completed_sends() {
    sums_.test(local_us());
    sends_.release_completed();
  }
  /// Waits for every pending send (their receivers run the same schedule) and frees them. After
  /// a failure (here or elsewhere) a send may never be received: it is let go (MpiSends::abandon).
  void complete_sends() {
    std::lock_guard lock(mu_);
    if (lost_peers()) {  // no MPI call may progress a collective past the deadline now
      sends_.abandon();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      release_completed_sends();
      if (sends_.empty()) break;
      if (agreement_.announced() || agreement_.peer_failed() || deadline_.peer_abandoned() ||
          agreement_.timed_out(start)) {
        sends_.abandon();
        break;
      }
      detail::pause_between_polls(polls);
    }
  }

  /// sends_, sums_ and the rank's MPI calls during a step: the worker's, the progress thread's
  /// and the caller's
  std::mutex mu_;
  detail::MpiSends sends_;                            ///< in flight
  detail::MpiGradientSums sums_{layout_, deadline_};  ///< this step's sums over the replicas
  host::Backend local_;           ///< the rank's device; destroyed (workers joined) before sends_
  bool shard_optimizer_ = false;  ///< Options::shard_optimizer
  std::condition_variable progress_wake_;  ///< a send started, or stop_progress
  bool stopping_ = false;                  ///< stop_progress (under mu_)
  std::thread progress_;                   ///< Progress::thread's; joined before local_ goes
};

}  // namespace gpipe::mpi
static_assert(gpipe::multi_process_backend<gpipe::mpi::Backend>);
