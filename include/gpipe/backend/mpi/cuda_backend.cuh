#pragma once
// gpipe::mpi::CudaBackend: one GPU per MPI rank. The ranks, the fault protocol and the merged
// trace are mpi::Backend's (detail::MpiRanks); the rank's device is a one-device cuda::Backend on
// GPU Options::gpu, and activations and gradients move between the ranks' GPUs with NCCL:
//   send/receive  queued and posted in NCCL groups on a communication stream (nccl_groups.cuh).
//                 NCCL sends complete only with their receives (Sends::rendezvous): the Trainer
//                 orders and validates its schedule for that (order_for_rendezvous).
//   messages      NCCL has no tags: with one communicator per direction (nccl.cuh) a pair's
//                 messages match in the order of messages_in_order (schedule/rendezvous.hpp),
//                 which the Trainer requires and the agreement checks (message_hashes.hpp).
//   exchange      between steps (a tie across ranks): ncclSend/ncclRecv on the gradients'
//                 communicator, GPU memory to GPU memory, on the compute stream.
//   gradient sums ncclAllReduce on a third stream, started as each stage's last backward is done
//                 (expect_reductions, start_reduction), completed by finish_reductions.
//   faults        as mpi::Backend; a rank that knows of a failure, or waits past
//                 Options::peer_timeout, aborts its NCCL communicators so that no stream waits
//                 forever, and after a failed step every rank makes new ones.
//   deadline      Options::peer_timeout bounds every wait of a rank, for its peers and for its
//                 GPU alike (a stream that waits for a receive looks like one whose kernel does
//                 not end): wait_for_streams waits for both at once, and the rank's cuda::Backend
//                 has it as its wait_timeout. Work still running past it, even with the NCCL
//                 communicators aborted, is the rank's own and stuck: its step fails first-hand
//                 naming the op, and the work is left running with what it uses (leaked).
// MPI is called by the thread that calls the backend (a cuda::Backend's work runs there).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error \
    "gpipe/backend/mpi/cuda_backend.cuh is CUDA code: compile it with nvcc (see gpipe/mpi_cuda.cuh)"
#endif

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/cuda/backend.cuh"
#include "gpipe/backend/mpi/message_hashes.hpp"
#include "gpipe/backend/mpi/nccl.cuh"
#include "gpipe/backend/mpi/nccl_groups.cuh"
#include "gpipe/backend/mpi/ranks.hpp"
#include "gpipe/backend/mpi/sums.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/transport/mpi.hpp"
#include "gpipe/transport/nccl_hand_over.cuh"

namespace gpipe::mpi {

/// Construction options of an mpi::CudaBackend, the same on every rank (but `gpu`).
struct CudaBackendOptions {
  std::size_t data_parallel = 1;    ///< replicas of the pipeline: world size = data_parallel x K
  std::size_t device_capacity = 0;  ///< bytes this rank may hold on its GPU; 0 = no cap
  /// How long a rank waits for its peers (its transfers, the collectives, the agreement that
  /// ends a step) before it fails the step (and aborts its NCCL communicators) with an Error
  /// naming what it waited for (op, stage, micro-batch and the peer's rank): a peer that is stuck
  /// or dead ends the step on every other rank within about twice this time. A peer that throws
  /// ends it at once. As mpi::BackendOptions::peer_timeout; positive. It bounds every wait for
  /// the rank's GPU as well (its cuda::Backend's wait_timeout, which that Error then names): a
  /// kernel that does not end fails the step on its rank, first-hand, naming its op, stage and
  /// micro-batch, within about 1.1 times this (the NCCL work gets a tenth more to end once
  /// aborted). So it must exceed a step's GPU time, as a peer waits that long for its messages.
  std::chrono::milliseconds peer_timeout{std::chrono::minutes(10)};
  /// CUDA device ordinal of this rank's GPU; -1: the rank's index among the ranks on its machine,
  /// modulo the GPUs there (one rank per GPU when launched with as many ranks per node as GPUs).
  int gpu = -1;
  bool tf32 = false;  ///< TF32 tensor-core GEMMs (cuda::BackendOptions::tf32)
};

/// One GPU per MPI rank: a `gpipe::multi_process_backend` (backend/concepts.hpp) like
/// mpi::Backend, whose ranks run their device on a one-device cuda::Backend and hand activations
/// and gradients to each other with NCCL (see the top of gpipe/backend/mpi/cuda_backend.cuh).
/// Device arguments name pipeline devices 0..K-1; one that is not this rank's throws
/// `gpipe::Error`, except where a member says otherwise. Not thread-safe: one thread calls it.
///
///     gpipe::mpi::CudaBackend backend(argc, argv);  // mpirun -n K ./train, a GPU per rank
class CudaBackend : public detail::MpiRanks<CudaBackend, cuda::Backend> {
 public:
  /// The CUDA backend's kernel context: a rank's device is a GPU.
  using Kernels = cuda::Kernels;
  /// Orders work within this rank's device (across ranks, messages do).
  using Event = cuda::Event;
  /// Owning handle of `count` elements of `T` on this rank's GPU.
  template <class T>
  using Buffer = cuda::Buffer<T>;
  /// A piece of work: runs on the calling thread and enqueues on this rank's streams.
  using Work = cuda::Backend::Work;
  /// Construction options: replicas, capacity, peer timeout, GPU, TF32.
  using Options = CudaBackendOptions;
  /// NCCL between ranks: rendezvous sends.
  using hand_over = gpipe::transport::NcclHandOver;

  /// The backend's name as the runtime tests it.
  static constexpr std::string_view name = "mpi-cuda";

  /// MPI_COMM_WORLD; initializes MPI (MPI_THREAD_SERIALIZED) unless the program did, and then
  /// finalizes it when the backend goes. Collective.
  CudaBackend(int& argc, char**& argv, Options options = {})
      : MpiRanks(argc, argv, options.data_parallel, options.peer_timeout),
        local_(1, local_options(layout_, options)) {
    start();
  }
  /// On the caller's communicator, MPI initialized by the caller. Collective.
  explicit CudaBackend(MPI_Comm comm = MPI_COMM_WORLD, Options options = {})
      : MpiRanks(comm, options.data_parallel, options.peer_timeout),
        local_(1, local_options(layout_, options)) {
    start();
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  /// Aborts the NCCL communicators (nothing waits for a peer any more), drops work not yet issued
  /// and releases every resource. Work still running after Options::peer_timeout (a kernel that
  /// does not end) is left running, with the streams, memory and buffers it may use (as
  /// cuda::Backend's destructor leaves them).
  ~CudaBackend() {
    if (streams_busy())
      nccl_.abort();  // nothing may wait for a peer now
    else
      nccl_.destroy();
    const bool idle = wait_for_streams(/*abort_on_failure=*/false, agreement_.peer_timeout());
    try {
      local_.cancel(wait_ends_);  // the same deadline; local_'s destructor then does not wait again
    } catch (...) {               // a destructor reports nothing
    }
    groups_.drop();  // frees the groups that completed
    if (reduce_stream_ != nullptr && idle) (void)cudaStreamDestroy(reduce_stream_);
  }

  /// The CUDA device ordinal of this rank's GPU.
  int gpu() const { return local_.gpu(0); }

  /// As cuda::Backend::submit on this rank's device, after the sends and receives issued before
  /// it have been posted. Work that throws tells every other rank at once.
  void submit(std::size_t device, WorkLabel label, Work work) {
    local_.submit(layout_.local(device), label, [this, work = std::move(work)](Kernels& k) {
      agreement_.telling_failure([&] {
        groups_.post(k.stream());
        work(k);
      });
    });
  }
  /// As cuda::Backend::submit_copy on this rank's device: work on its copy stream (Remat::offload's
  /// copies: mpi/offload.cuh). Work that throws tells every other rank at once.
  void submit_copy(std::size_t device, WorkLabel label, Work work, const Event* done = nullptr) {
    local_.submit_copy(
        layout_.local(device), label,
        [this, work = std::move(work)](Kernels& k) {
          agreement_.telling_failure([&] { work(k); });
        },
        done);
  }
  /// As cuda::Backend::host_memory_stats, of this rank's device.
  MemoryStats host_memory_stats(std::size_t device) const {
    return local_.host_memory_stats(layout_.local(device));
  }
  /// As cuda::Backend::count_host_memory, for this rank's device.
  void count_host_memory(std::size_t device, std::ptrdiff_t bytes) {
    local_.count_host_memory(layout_.local(device), bytes);
  }
  /// As cuda::Backend::record, on this rank's device (after the transfers issued before it).
  void record(std::size_t device, const Event& event) {
    flush(device);
    local_.record(0, event);
  }
  /// As cuda::Backend::wait, on this rank's device (after the transfers issued before it).
  void wait(std::size_t device, const Event& event) {
    flush(device);
    local_.wait(0, event);
  }

  /// On `device` (this rank's), after the work before it: sends src's elements (float, or bf16
  /// under gpipe::MixedBf16: half the bytes) to `peer`'s rank (ncclSend), and takes src over
  /// until the send completes. `tag` names the message (its parity the direction): the peer's
  /// receive must have the same one, in the same order (checked by agree).
  template <class T>
  void send(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
            Buffer<T>& src) {
    layout_.check_peer(peer, tag);
    local_.submit(layout_.local(device), label, [this, label, peer, tag, &src](Kernels&) {
      detail::NcclTransfer t = detail::NcclTransfer::sending(peer, tag, src);
      t.label = label;
      hashes_.sent(peer, tag, t.bytes());
      groups_.queue(std::move(t));
    });
  }
  /// On `device`, after the work before it: dst <- `count` elements (float or bf16) from `peer`'s
  /// rank (ncclRecv), into memory allocated here (counted as `kind`).
  template <class T>
  void receive(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
               Buffer<T>& dst, std::size_t count, MemoryKind kind) {
    layout_.check_peer(peer, tag);
    local_.submit(layout_.local(device), label,
                  [this, label, device, peer, tag, &dst, count, kind](Kernels&) {
                    dst = allocate<T>(device, count, kind);
                    detail::NcclTransfer t = detail::NcclTransfer::receiving(peer, tag, dst);
                    t.label = label;
                    hashes_.received(peer, tag, t.bytes());
                    groups_.queue(std::move(t));
                  });
  }

  /// Between steps, with `peer`'s rank of this replica (which calls it with this rank's device):
  /// sends `mine` and receives `theirs`, both memory of this rank's GPU (either may be empty; the
  /// sizes must match the peer's), GPU to GPU: one NCCL group (ncclSend/ncclRecv on the
  /// gradients' communicator, idle between steps) on the compute stream, after its work; waits
  /// for it. A tie across ranks exchanges its values and its gradient sums this way.
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs) {
    layout_.check_peer(peer, 0);
    flush(layout_.device());
    nccl_.exchange(peer, mine, theirs, compute_stream_);
    synchronize();
  }

  /// The step's gradient sums over the replicas (arrays on this rank's GPU), in the order
  /// start_reduction will start them; each an ncclAllReduce in place, completed by
  /// finish_reductions. After a failure finish_reductions starts those not yet started, so that
  /// every rank starts the same ones in the same order.
  void expect_reductions(std::vector<std::span<float>> values) {
    sums_.expect(std::move(values), "mpi::CudaBackend");
  }
  /// On this rank's `device`, after the work submitted before it: starts the next sum that
  /// expect_reductions() announced.
  void start_reduction(std::size_t device, WorkLabel label) {
    submit(device, label, [this](Kernels& k) { start_next_reduction(k.stream()); });
  }

  /// Collective over the world: every rank's work since the last call, one merged trace whose
  /// events' device is their rank.
  std::vector<TraceEvent> take_trace() {
    flush(layout_.device());
    return clocks_.gather_trace(local_.take_trace());
  }
  /// Collective over this replica's ranks: each device's compute time since the last call.
  std::vector<ComputeTiming> take_timing() {
    flush(layout_.device());
    return clocks_.gather_timing(local_.take_timing().front());
  }

  /// Local: this rank's compute time counts afresh from here (what take_timing() will gather).
  void restart_timing() {
    flush(layout_.device());
    (void)local_.take_timing();
  }

  /// Drops this rank's work not yet issued and waits for its streams (aborting its NCCL
  /// communicators if this rank failed or a peer did), at most Options::peer_timeout: work still
  /// running then is left running, and cancel() returns all the same (as cuda::Backend::cancel);
  /// local: it tells no other rank.
  void cancel() {
    flush(layout_.device());
    gave_up_ = !wait_for_streams(/*abort_on_failure=*/true, agreement_.peer_timeout());
    local_.cancel(wait_ends_);  // its copy stream, by the same deadline
    groups_.drop();
  }
  /// Waits for this rank's work and its transfers, at most Options::peer_timeout; rethrows the
  /// first failure on this rank. Work still running then (the communicators aborted) is this
  /// rank's own failure: it tells the others and throws `gpipe::Error` naming the op, stage and
  /// micro-batch that has not finished (as cuda::Backend::synchronize).
  void synchronize() {
    flush(layout_.device());
    gave_up_ = !wait_for_streams(/*abort_on_failure=*/true, agreement_.peer_timeout());
    if (gave_up_) fail_unfinished();
    local_.synchronize(wait_ends_);  // its copy stream, by the same deadline
    groups_.release_all();
  }

  /// Between steps: starts the expected sums not started, then waits for all of them (not again
  /// when the synchronize() or cancel() before it gave up on this rank's work, at most
  /// Options::peer_timeout otherwise); throws `gpipe::Error` as synchronize() when they have not
  /// finished then.
  void finish_reductions() {
    while (!sums_.all_started()) start_next_reduction(compute_stream_);
    sums_.clear();
    const bool again = std::exchange(gave_up_, false);
    if (!wait_for_streams(/*abort_on_failure=*/true,
                          again ? std::chrono::milliseconds{} : agreement_.peer_timeout()))
      fail_unfinished();
  }

  /// Collective, the agreement that ends every step (`failure`: this rank's, "" if none;
  /// `out_of_memory`: whether it was an OutOfMemory): first checks that every pair of ranks
  /// posted the same messages in the same order this step, then the ranks agree whether any
  /// failed; if one did, every rank throws the same Error (rank, stage, micro-batch and the
  /// original message; an OutOfMemory where that was one) and all make new NCCL communicators.
  void agree(std::string failure, bool out_of_memory = false) {
    // after a failure the ranks' messages differ anyway; the failure is what to report. A rank
    // may see the mismatch before it hears of another rank's failure (whose messages were never
    // posted): so a mismatch counts as second-hand, and a first-hand failure elsewhere wins.
    std::string order;
    try {
      order = hashes_.check();
    } catch (const Error&) {  // past the deadline: the agreement reports it with `failure`
    }
    if (failure.empty() && !nccl_.aborted() && !order.empty()) {
      failure = std::move(order);
      agreement_.stop_for_peer();
    }
    if (failure.empty() && nccl_.aborted())
      failure = abort_reason_ == silent_peer
                    ? "gpipe: waited " + std::to_string(agreement_.peer_timeout().count()) +
                          " ms for " + awaited_ + " (Options::peer_timeout): is that rank stuck " +
                          "in its work, or dead?"
                    : std::string("gpipe: stopped waiting for its peers (NCCL aborted): ") +
                          abort_reason_;
    try {
      agreement_.agree(std::move(failure), out_of_memory);
    } catch (...) {
      abort_reason_ = "";
      nccl_.abort();
      if (!lost_peers()) nccl_.make();  // collective: not with a rank lost
      throw;
    }
  }

 private:
  friend class detail::MpiRanks<CudaBackend, cuda::Backend>;
  using Clock = std::chrono::steady_clock;

  /// The rank's one-device cuda::Backend: its GPU (Options::gpu, or its index among its
  /// machine's ranks modulo the GPUs there), capacity and pipeline device; its waits for the GPU
  /// last at most Options::peer_timeout (see the top of this file, "deadline").
  static cuda::BackendOptions local_options(const detail::MpiLayout& layout,
                                            const Options& options) {
    int gpu = options.gpu;
    if (gpu < 0) {
      const int count = cuda::device_count();
      gpu = count > 0 ? static_cast<int>(layout.machine_rank()) % count
                      : 0;  // none: cuda::Backend says so
    }
    return {.device_capacity = options.device_capacity,
            .gpus = {gpu},
            .tf32 = options.tf32,
            .first_device = layout.device(),
            .wait_timeout = options.peer_timeout};
  }
  /// Collective: the common clock, and the compute and reduction streams.
  void start() {
    clocks_.align(local_.epoch());
    local_.submit(0, {.what = "set up NCCL streams", .internal = true},
                  [this](Kernels& k) { compute_stream_ = k.stream(); });
    local_.synchronize();
    GPIPE_CUDA_CHECK(cudaSetDevice(gpu()));
    GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&reduce_stream_, cudaStreamNonBlocking));
  }

  /// Posts the queued transfers from a piece of work on `device` (outside other work).
  void flush(std::size_t device) {
    local_.submit(layout_.local(device), {.what = "post transfers", .internal = true},
                  [this](Kernels& k) { groups_.post(k.stream()); });
  }

  /// Starts the next expected gradient sum on the reduction stream, after `compute`'s work.
  void start_next_reduction(cudaStream_t compute) {
    const std::optional<std::span<float>> values = sums_.next();
    if (!values) return;
    if (nccl_.replicas() == nullptr) {
      if (nccl_.aborted()) return;
      throw Error("gpipe: mpi::CudaBackend has no NCCL communicator between its replicas");
    }
    detail::stream_waits_for(reduce_stream_, compute);
    GPIPE_NCCL_CHECK(ncclAllReduce(values->data(), values->data(), values->size(), ncclFloat32,
                                   ncclSum, nccl_.replicas(), reduce_stream_));
  }
  /// Whether one of this rank's streams has work left.
  bool streams_busy() const {
    for (cudaStream_t s : {compute_stream_, groups_.stream(), reduce_stream_})
      if (s != nullptr && cudaStreamQuery(s) == cudaErrorNotReady) return true;
    return false;
  }
  /// Why to give up on the peers now, waiting since `start`: this rank or another failed, NCCL
  /// reports a lost peer, or Options::peer_timeout passed; nullptr while none of them.
  const char* reason_to_abort(std::chrono::steady_clock::time_point start) {
    if (agreement_.announced()) return "this rank failed";
    if (agreement_.peer_failed()) return "another rank failed";
    if (deadline_.peer_abandoned()) return "another rank failed between steps";
    if (nccl_.failed()) return "NCCL reported a failed peer (ncclCommGetAsyncError)";
    if (agreement_.timed_out(start)) return silent_peer;
    return nullptr;
  }
  /// The rank's one wait for its GPU and its peers: polls its streams (cuda::detail::poll_until)
  /// until they are idle, for at most `patience` (Options::peer_timeout; zero: one poll). With
  /// abort_on_failure, once reason_to_abort gives one, and at the latest when `patience` has
  /// passed (a silent peer), it aborts the NCCL communicators, so that no operation waits for a
  /// peer forever; the streams then get until the end of `patience`, and at least abort_grace()
  /// after the abort, to end their NCCL work. Whether the streams are idle: work still running
  /// then is left running (fail_unfinished names it). Frees the groups that completed. The
  /// wait's end (wait_ends_) is the deadline of the rank's cuda::Backend's wait that follows, for
  /// its copy stream: one deadline for both.
  bool wait_for_streams(bool abort_on_failure, Clock::duration patience) {
    const Clock::time_point start = Clock::now();
    std::optional<Clock::time_point> aborted_at;
    const auto abort = [&](const char* reason) {
      if (reason == silent_peer) {  // first-hand: tell the others, who may wait for this one
        awaited_ = groups_.awaited(layout_.replica() * layout_.devices());
        agreement_.announce_failure();
      } else if (!agreement_.announced()) {
        agreement_.stop_for_peer();
      }
      nccl_.abort();
      abort_reason_ = reason;
      aborted_at = Clock::now();
    };
    const auto idle = [this] { return !streams_busy(); };
    bool done = cuda::detail::poll_until(start + patience, [&] {
      if (idle()) return true;
      if (abort_on_failure && !nccl_.aborted())
        if (const char* reason = reason_to_abort(start)) abort(reason);
      return false;
    });
    if (!done && abort_on_failure && !nccl_.aborted()) {  // the deadline has passed
      const char* reason = reason_to_abort(start);
      abort(reason != nullptr ? reason : silent_peer);
    }
    wait_ends_ = start + patience;
    if (aborted_at && *aborted_at + abort_grace() > wait_ends_)
      wait_ends_ = *aborted_at + abort_grace();
    if (!done) done = cuda::detail::poll_until(wait_ends_, idle);
    (void)cudaGetLastError();
    groups_.release_completed();
    return done;
  }
  /// How long the streams may still take to end their NCCL work once the communicators were
  /// aborted: a tenth of Options::peer_timeout.
  Clock::duration abort_grace() const { return agreement_.peer_timeout() / 10; }
  /// After a wait that gave up on this rank's streams: the rank failed first-hand (its own work
  /// did not end, even with its communicators aborted); throws `gpipe::Error` naming the op,
  /// stage and micro-batch of its device that has not finished (cuda::Backend's), or, when its
  /// device is idle, the transfers that have not (NcclGroups::awaited).
  [[noreturn]] void fail_unfinished() {
    agreement_.fail_first_hand();
    local_.synchronize(wait_ends_);  // passed: a poll; throws when the device is busy
    const std::string awaited = groups_.awaited(layout_.replica() * layout_.devices());
    throw Error("gpipe: the NCCL work of rank " + std::to_string(layout_.rank()) +
                " has not ended within " + std::to_string(agreement_.peer_timeout().count()) +
                " ms (Options::peer_timeout), although its communicators were aborted" +
                (awaited.empty() ? std::string() : ": " + awaited));
  }

  cuda::Backend local_;                                     ///< the rank's device
  detail::NcclCommunicators nccl_{layout_, local_.gpu(0)};  ///< between the ranks' GPUs
  detail::NcclGroups groups_{nccl_, local_.gpu(0)};         ///< sends and receives
  detail::MessageHashes hashes_{layout_, deadline_};        ///< this step's messages, hashed
  detail::SumOrder sums_;                                   ///< this step's gradient sums
  cudaStream_t compute_stream_ = nullptr;                   ///< local_'s compute stream
  cudaStream_t reduce_stream_ = nullptr;                    ///< NCCL gradient sums
  const char* abort_reason_ = "";  ///< why the communicators were aborted this step
  std::string awaited_;            ///< the transfers a silent peer held up (NcclGroups::awaited)
  bool gave_up_ = false;           ///< the latest synchronize() or cancel() gave up on the work
  Clock::time_point wait_ends_;    ///< the deadline of the latest wait_for_streams
  static constexpr const char* silent_peer = "a peer was silent too long";
};

}  // namespace gpipe::mpi

static_assert(gpipe::multi_process_backend<gpipe::mpi::CudaBackend>);

// The executor's seam for activation offload, specialized for this backend.
#include "gpipe/backend/mpi/offload.cuh"
