#pragma once
// gpipe::mpi::CudaBackend: one GPU per MPI rank. The layout, the fault protocol and the merged
// trace are mpi::Backend's (detail::MpiRanks: R replicas x K devices, rank r is device r % K
// of replica r / K); the rank's device is a one-device cuda::Backend on GPU
// Options::gpu (default: the rank's index among the ranks of its machine, modulo the GPUs there).
// Activations and gradients move between ranks' GPUs with NCCL, bootstrapped over MPI (rank 0 of
// each communicator calls ncclGetUniqueId, MPI_Bcast hands the id out, every rank calls
// ncclCommInitRank): two communicators per replica's pipeline for ncclSend/ncclRecv, one for
// activations (even tags) and one for gradients (odd tags), and one per device's replicas for
// ncclAllReduce.
//   exchange      between steps (a tie across ranks): ncclSend/ncclRecv on the gradients'
//                 communicator, GPU memory to GPU memory, on the compute stream.
//   send/receive  queued as they are issued; a run of them with no other work between is one
//                 NCCL group (ncclGroupStart/End) on the rank's communication stream, after an
//                 event of the compute stream (the sent data exist, the received buffers are
//                 allocated), and the compute stream waits for a group that receives. NCCL sends
//                 complete only with their receives (Sends::rendezvous): the Trainer orders and
//                 validates its schedule for that (order_for_rendezvous). A sent buffer is freed
//                 once its group has completed.
//   messages      NCCL matches a pair's messages on a communicator in the order they are posted,
//                 without tags. With one communicator per direction (by the tag's parity, see
//                 transport/mpi.hpp) that is the order of messages_in_order
//                 (schedule/rendezvous.hpp), which the Trainer requires; every step, the
//                 agreement also checks with MPI that what each rank sent to each peer in each
//                 direction (tags and sizes, hashed) is what that peer received.
//   gradient sums ncclAllReduce on a third stream, started as each stage's last backward is done
//                 (expect_reductions, start_reduction), completed by finish_reductions.
//   faults        as mpi::Backend (a failing rank tells the others at once; the step's end is
//                 the agreement, transport/mpi.hpp); a rank that knows of a failure, or waits past
//                 Options::peer_timeout, aborts its NCCL communicators (ncclCommAbort) so that no
//                 stream waits forever, and after a failed step every rank makes new ones.
// MPI is called by the thread that calls the backend (a cuda::Backend's work runs there).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error \
    "gpipe/backend/mpi/cuda_backend.cuh is CUDA code: compile it with nvcc (see gpipe/mpi_cuda.cuh)"
#endif

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/backend/cuda/backend.cuh"
#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/backend/mpi/ranks.hpp"
#include "gpipe/backend/mpi/sums.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/transport/mpi.hpp"
#include "gpipe/transport/nccl_ranks.cuh"

#if !GPIPE_CUDA_NCCL
#error \
    "gpipe::mpi::CudaBackend needs NCCL (GPIPE_CUDA_NCCL=1: link gpipe::cuda where NCCL is found)"
#endif

namespace gpipe::mpi {

/// Construction options of an mpi::CudaBackend, the same on every rank (but `gpu`).
struct CudaBackendOptions {
  std::size_t data_parallel = 1;    ///< replicas of the pipeline: world size = data_parallel x K
  std::size_t device_capacity = 0;  ///< bytes this rank may hold on its GPU; 0 = no cap
  /// How long a rank waits for its peers before it fails the step (and aborts its NCCL
  /// communicators): a peer that died or hangs ends the step here within this time. A peer that
  /// throws ends it at once.
  std::chrono::seconds peer_timeout{600};
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
  using transport = gpipe::transport::NcclRanks;

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
  /// and releases every resource.
  ~CudaBackend() {
    group_.clear();
    bool busy = false;
    for (cudaStream_t s : {compute_stream_, comm_stream_, reduce_stream_})
      if (s != nullptr && cudaStreamQuery(s) == cudaErrorNotReady) busy = true;
    if (busy) {
      abort_communicators();  // nothing may wait for a peer now
    } else {
      for (ncclComm_t c : {activations_nccl_, gradients_nccl_, replicas_nccl_})
        if (c != nullptr) (void)ncclCommDestroy(c);
    }
    try {
      wait_for_streams(/*abort_on_failure=*/false);
      local_.cancel();
    } catch (...) {  // a destructor reports nothing
    }
    pending_.clear();
    for (cudaStream_t* s : {&comm_stream_, &reduce_stream_})
      if (*s != nullptr) (void)cudaStreamDestroy(*s);
  }

  /// The CUDA device ordinal of this rank's GPU.
  int gpu() const { return local_.gpu(0); }

  /// As cuda::Backend::submit on this rank's device, after the sends and receives issued before
  /// it have been posted. Work that throws tells every other rank at once.
  void submit(std::size_t device, WorkLabel label, Work work) {
    local_.submit(layout_.local(device), label, [this, work = std::move(work)](Kernels& k) {
      agreement_.telling_failure([&] {
        post_group(k);
        work(k);
      });
    });
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
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                  "gpipe: mpi::CudaBackend sends float or bf16 messages");
    layout_.check_peer(peer, tag);
    local_.submit(layout_.local(device), label, [this, peer, tag, &src](Kernels&) {
      Transfer t{.send = true, .peer = peer, .tag = tag, .count = src.size()};
      t.type = nccl_type<T>();
      t.bytes = src.size() * sizeof(T);
      t.data = src.data();
      t.buffer_of<T>() = std::move(src);
      note_message(sent_hashes_, t);
      group_.push_back(std::move(t));
    });
  }
  /// On `device`, after the work before it: dst <- `count` elements from `peer`'s rank
  /// (ncclRecv), into memory allocated here (counted as `kind`).
  template <class T>
  void receive(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
               Buffer<T>& dst, std::size_t count, MemoryKind kind) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                  "gpipe: mpi::CudaBackend receives float or bf16 messages");
    layout_.check_peer(peer, tag);
    local_.submit(layout_.local(device), label,
                  [this, device, peer, tag, &dst, count, kind](Kernels&) {
                    dst = allocate<T>(device, count, kind);
                    Transfer t{.send = false, .peer = peer, .tag = tag, .count = count};
                    t.type = nccl_type<T>();
                    t.bytes = count * sizeof(T);
                    t.data = dst.data();
                    note_message(received_hashes_, t);
                    group_.push_back(std::move(t));
                  });
  }

  /// Between steps, with `peer`'s rank of this replica (which calls it with this rank's device):
  /// sends `mine` and receives `theirs`, both memory of this rank's GPU (either may be empty; the
  /// sizes must match the peer's), GPU to GPU: one NCCL group (ncclSend/ncclRecv on the
  /// gradients' communicator, idle between steps) on the compute stream, after its work; waits
  /// for it. A tie across ranks exchanges its values and its gradient sums this way.
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs) {
    layout_.check_peer(peer, 0);
    if (gradients_nccl_ == nullptr)
      throw Error("gpipe: mpi::CudaBackend has no NCCL communicator between its devices");
    flush(layout_.device());
    const int to = static_cast<int>(peer);
    ncclResult_t posted = ncclGroupStart();
    if (posted == ncclSuccess && !mine.empty())
      posted =
          ncclSend(mine.data(), mine.size(), ncclFloat32, to, gradients_nccl_, compute_stream_);
    if (posted == ncclSuccess && !theirs.empty())
      posted =
          ncclRecv(theirs.data(), theirs.size(), ncclFloat32, to, gradients_nccl_, compute_stream_);
    const ncclResult_t ended = ncclGroupEnd();
    GPIPE_NCCL_CHECK(posted);
    GPIPE_NCCL_CHECK(ended);
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
  /// communicators if this rank failed or a peer did); local: it tells no other rank.
  void cancel() {
    flush(layout_.device());
    wait_for_streams(/*abort_on_failure=*/true);
    local_.cancel();
    group_.clear();
    pending_.clear();
  }
  /// Waits for this rank's work and its transfers; rethrows the first failure on this rank.
  void synchronize() {
    flush(layout_.device());
    wait_for_streams(/*abort_on_failure=*/true);
    local_.synchronize();
    pending_.clear();
  }

  /// Between steps: starts the expected sums not started, then waits for all of them.
  void finish_reductions() {
    while (!sums_.all_started()) start_next_reduction(compute_stream_);
    sums_.clear();
    wait_for_streams(/*abort_on_failure=*/true);
  }

  /// Collective, the agreement that ends every step (`failure`: this rank's, "" if none): first
  /// checks that every pair of ranks posted the same messages in the same order this step, then
  /// the ranks agree whether any failed; if one did, every rank throws the same Error (rank,
  /// stage, micro-batch and the original message) and all make new NCCL communicators.
  void agree(std::string failure) {
    // after a failure the ranks' messages differ anyway; the failure is what to report. A rank
    // may see the mismatch before it hears of another rank's failure (whose messages were never
    // posted): so a mismatch counts as second-hand, and a first-hand failure elsewhere wins.
    std::string order = check_message_order();
    if (failure.empty() && !aborted_ && !order.empty()) {
      failure = std::move(order);
      agreement_.stop_for_peer();
    }
    if (failure.empty() && aborted_)
      failure = abort_reason_ == silent_peer
                    ? "gpipe: no message from a peer within " +
                          std::to_string(agreement_.peer_timeout().count()) +
                          " s (Options::peer_timeout): is every rank alive?"
                    : std::string("gpipe: stopped waiting for its peers (NCCL aborted): ") +
                          abort_reason_;
    try {
      agreement_.agree(std::move(failure));
    } catch (...) {
      abort_reason_ = "";
      abort_communicators();
      make_communicators();
      throw;
    }
  }

 private:
  friend class detail::MpiRanks<CudaBackend, cuda::Backend>;

  template <class T>
  static ncclDataType_t nccl_type() {
    return std::is_same_v<T, float> ? ncclFloat32 : ncclBfloat16;
  }
  struct Transfer {
    bool send = false;
    std::size_t peer = 0, tag = 0, count = 0;
    ncclDataType_t type = ncclFloat32;
    std::size_t bytes = 0;
    void* data = nullptr;
    Buffer<float> buffer = {};  ///< a send's data, kept until its group completes
    Buffer<bf16> buffer_bf16 = {};
    template <class T>
    Buffer<T>& buffer_of() {
      if constexpr (std::is_same_v<T, float>)
        return buffer;
      else
        return buffer_bf16;
    }
  };
  struct PendingSends {
    std::vector<Buffer<float>> buffers;
    std::vector<Buffer<bf16>> buffers_bf16;
    cudaEvent_t done = nullptr;  ///< recorded after the group on the communication stream
    PendingSends() = default;
    PendingSends(PendingSends&& other) noexcept
        : buffers(std::move(other.buffers)),
          buffers_bf16(std::move(other.buffers_bf16)),
          done(std::exchange(other.done, nullptr)) {}
    PendingSends& operator=(PendingSends&& other) noexcept {
      if (this != &other) {
        release();
        buffers = std::move(other.buffers);
        buffers_bf16 = std::move(other.buffers_bf16);
        done = std::exchange(other.done, nullptr);
      }
      return *this;
    }
    ~PendingSends() { release(); }
    /// Waits for the group (its streams are idle or its communicator aborted when this runs),
    /// then frees the buffers.
    void release() {
      if (done != nullptr) {
        (void)cudaEventSynchronize(done);
        (void)cudaEventDestroy(done);
        done = nullptr;
      }
      buffers.clear();
      buffers_bf16.clear();
    }
  };

  /// The rank's one-device cuda::Backend: its GPU (Options::gpu, or its index among its
  /// machine's ranks modulo the GPUs there), capacity and pipeline device.
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
            .first_device = layout.device()};
  }

  void start() {
    clocks_.align(local_.epoch());
    local_.submit(0, {.what = "set up NCCL streams", .internal = true},
                  [this](Kernels& k) { compute_stream_ = k.stream(); });
    local_.synchronize();
    check_a_gpu_per_rank();
    GPIPE_CUDA_CHECK(cudaSetDevice(gpu()));
    GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&reduce_stream_, cudaStreamNonBlocking));
    sent_hashes_.assign(2 * layout_.devices(), 0);
    received_hashes_.assign(2 * layout_.devices(), 0);
    make_communicators();
  }

  /// Collective: NCCL refuses two ranks of one communicator on one GPU (ncclCommInitRank fails
  /// with "Duplicate GPU detected"). Says so before NCCL is asked, on every rank alike, naming the
  /// two ranks, the GPU and its machine: each rank's GPU (its UUID, one per physical device
  /// whatever CUDA_VISIBLE_DEVICES says) is compared with those of the ranks it will share a
  /// communicator with (its replica's pipeline, its device's replicas).
  void check_a_gpu_per_rank() const {
    struct Identity {
      char uuid[16];
      int rank;
      int gpu;
      char host[MPI_MAX_PROCESSOR_NAME];
    };
    Identity own{};
    cudaDeviceProp properties{};
    GPIPE_CUDA_CHECK(cudaGetDeviceProperties(&properties, gpu()));
    static_assert(sizeof properties.uuid.bytes == sizeof own.uuid);
    std::memcpy(own.uuid, properties.uuid.bytes, sizeof own.uuid);
    own.rank = static_cast<int>(layout_.rank());
    own.gpu = gpu();
    int length = 0;
    detail::check_mpi(MPI_Get_processor_name(own.host, &length), "MPI_Get_processor_name");
    std::vector<MPI_Comm> shared;
    if (layout_.devices() > 1) shared.push_back(layout_.pipeline());
    if (layout_.replicas() > 1) shared.push_back(layout_.replicas_comm());
    for (MPI_Comm comm : shared) {
      int size = 0;
      MPI_Comm_size(comm, &size);
      std::vector<Identity> all(static_cast<std::size_t>(size));
      detail::check_mpi(
          MPI_Allgather(&own, sizeof own, MPI_BYTE, all.data(), sizeof own, MPI_BYTE, comm),
          "MPI_Allgather");
      for (std::size_t i = 0; i < all.size(); ++i)
        for (std::size_t j = i + 1; j < all.size(); ++j)
          if (std::memcmp(all[i].uuid, all[j].uuid, sizeof own.uuid) == 0)
            throw Error("gpipe: mpi::CudaBackend: ranks " + std::to_string(all[i].rank) + " and " +
                        std::to_string(all[j].rank) + " both run on GPU " +
                        std::to_string(all[i].gpu) + " of " + all[i].host +
                        ", and NCCL needs a GPU of its own for each rank that shares a "
                        "communicator: start at most as many ranks per machine as it has GPUs, "
                        "or give each rank its own Options::gpu");
    }
  }
  /// Collective over `comm`: an NCCL communicator of the same ranks.
  ncclComm_t nccl_over(MPI_Comm comm) {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    ncclUniqueId id{};
    if (rank == 0) GPIPE_NCCL_CHECK(ncclGetUniqueId(&id));
    detail::check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm), "MPI_Bcast");
    GPIPE_CUDA_CHECK(cudaSetDevice(gpu()));
    ncclComm_t nccl = nullptr;
    GPIPE_NCCL_CHECK(ncclCommInitRank(&nccl, size, id, rank));
    return nccl;
  }
  /// Collective: the pipeline's (one per direction) and (with replicas) the replicas'
  /// communicators.
  void make_communicators() {
    if (layout_.devices() > 1) {
      activations_nccl_ = nccl_over(layout_.pipeline());
      gradients_nccl_ = nccl_over(layout_.pipeline());
    }
    if (layout_.replicas() > 1) replicas_nccl_ = nccl_over(layout_.replicas_comm());
    aborted_ = false;
  }
  /// Local: ends every NCCL operation of this rank that still waits (ncclCommAbort).
  void abort_communicators() {
    for (ncclComm_t* c : {&activations_nccl_, &gradients_nccl_, &replicas_nccl_}) {
      if (*c != nullptr) (void)ncclCommAbort(*c);
      *c = nullptr;
    }
    aborted_ = true;
  }
  /// Whether NCCL reports a failed peer on a communicator of this rank.
  bool nccl_failed() const {
    for (ncclComm_t c : {activations_nccl_, gradients_nccl_, replicas_nccl_}) {
      ncclResult_t result = ncclSuccess;
      if (c != nullptr && ncclCommGetAsyncError(c, &result) == ncclSuccess &&
          result != ncclSuccess && result != ncclInProgress)
        return true;
    }
    return false;
  }

  /// Folds a transfer's tag and size into the running hash of the messages to or from its peer
  /// in its direction (the tag's parity).
  static void note_message(std::vector<std::uint64_t>& hashes, const Transfer& t) {
    std::uint64_t& h = hashes[2 * t.peer + (t.tag & 1u)];
    for (const std::uint64_t v :
         {static_cast<std::uint64_t>(t.tag), static_cast<std::uint64_t>(t.bytes)})
      h = (h ^ v) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  }
  /// Collective over this replica's ranks: "" when every rank received from each peer exactly
  /// what that peer sent to it, in order, this step; else the first mismatch this rank sees.
  /// Resets the hashes.
  std::string check_message_order() {
    const std::size_t k = layout_.devices();
    std::vector<std::uint64_t> sent_to_me(2 * k, 0);
    const int status = MPI_Alltoall(sent_hashes_.data(), 2, MPI_UINT64_T, sent_to_me.data(), 2,
                                    MPI_UINT64_T, layout_.pipeline());
    std::string out;
    if (status != MPI_SUCCESS) out = "gpipe: MPI_Alltoall failed while checking NCCL messages";
    for (std::size_t i = 0; i < 2 * k && out.empty(); ++i)
      if (sent_to_me[i] != received_hashes_[i])
        out = "gpipe: the NCCL " + std::string(i % 2 == 1 ? "gradients" : "activations") +
              " from device " + std::to_string(i / 2) + " to device " +
              std::to_string(layout_.device()) +
              " were posted in another order (or with other sizes) by the receiver than by the "
              "sender: NCCL has no tags, so the schedule must post each pair's messages in the "
              "same order on both sides";
    sent_hashes_.assign(2 * k, 0);
    received_hashes_.assign(2 * k, 0);
    return out;
  }

  /// From work on the compute stream `compute`: posts the queued transfers as one NCCL group on
  /// the communication stream, after what the compute stream has issued; the compute stream
  /// waits for the group if it receives.
  void post_group(Kernels& k) { post_group(k.stream()); }
  void post_group(cudaStream_t compute) {
    if (group_.empty()) return;
    std::vector<Transfer> group = std::move(group_);
    group_.clear();
    if (activations_nccl_ == nullptr) {
      if (aborted_) return;  // a failed step: its transfers are dropped, the step fails anyway
      throw Error("gpipe: mpi::CudaBackend has no NCCL communicator between its devices");
    }
    cudaEvent_t ready = nullptr, done = nullptr;
    GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    GPIPE_CUDA_CHECK(cudaEventRecord(ready, compute));
    GPIPE_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready, 0));
    (void)cudaEventDestroy(ready);
    GPIPE_NCCL_CHECK(ncclGroupStart());
    bool receives = false;
    for (const Transfer& t : group) {
      const int peer = static_cast<int>(t.peer);
      ncclComm_t comm = (t.tag & 1u) != 0 ? gradients_nccl_ : activations_nccl_;
      const ncclResult_t posted = t.send
                                      ? ncclSend(t.data, t.count, t.type, peer, comm, comm_stream_)
                                      : ncclRecv(t.data, t.count, t.type, peer, comm, comm_stream_);
      if (posted != ncclSuccess) {
        (void)ncclGroupEnd();
        GPIPE_NCCL_CHECK(posted);  // names the send or receive by its line
      }
      receives = receives || !t.send;
    }
    GPIPE_NCCL_CHECK(ncclGroupEnd());
    GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    GPIPE_CUDA_CHECK(cudaEventRecord(done, comm_stream_));
    if (receives) GPIPE_CUDA_CHECK(cudaStreamWaitEvent(compute, done, 0));
    PendingSends sends;
    sends.done = done;
    for (Transfer& t : group)
      if (t.send) {
        if (t.buffer.data() != nullptr) sends.buffers.push_back(std::move(t.buffer));
        if (t.buffer_bf16.data() != nullptr) sends.buffers_bf16.push_back(std::move(t.buffer_bf16));
      }
    pending_.push_back(std::move(sends));
    release_completed_sends();
  }
  /// Posts the queued transfers from a piece of work on `device` (outside other work).
  void flush(std::size_t device) {
    local_.submit(layout_.local(device), {.what = "post transfers", .internal = true},
                  [this](Kernels& k) { post_group(k); });
  }
  /// Frees the buffers of send groups that have completed.
  void release_completed_sends() {
    std::erase_if(pending_,
                  [](const PendingSends& p) { return cudaEventQuery(p.done) == cudaSuccess; });
  }

  /// Starts the next expected gradient sum on the reduction stream, after `compute`'s work.
  void start_next_reduction(cudaStream_t compute) {
    const std::optional<std::span<float>> values = sums_.next();
    if (!values) return;
    if (replicas_nccl_ == nullptr) {
      if (aborted_) return;
      throw Error("gpipe: mpi::CudaBackend has no NCCL communicator between its replicas");
    }
    cudaEvent_t ready = nullptr;
    GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    GPIPE_CUDA_CHECK(cudaEventRecord(ready, compute));
    GPIPE_CUDA_CHECK(cudaStreamWaitEvent(reduce_stream_, ready, 0));
    (void)cudaEventDestroy(ready);
    GPIPE_NCCL_CHECK(ncclAllReduce(values->data(), values->data(), values->size(), ncclFloat32,
                                   ncclSum, replicas_nccl_, reduce_stream_));
  }
  /// Waits until this rank's streams are idle. With abort_on_failure, once this rank or another
  /// has failed, NCCL reports a lost peer, or Options::peer_timeout passes, it aborts the NCCL
  /// communicators first, so that no operation waits for a peer forever; the caller's
  /// transport's finish_step then fails the step.
  void wait_for_streams(bool abort_on_failure) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      bool busy = false;
      for (cudaStream_t s : {compute_stream_, comm_stream_, reduce_stream_})
        if (s != nullptr && cudaStreamQuery(s) == cudaErrorNotReady) busy = true;
      if (!busy) break;
      if (abort_on_failure && !aborted_) {
        const char* reason = nullptr;
        if (agreement_.announced())
          reason = "this rank failed";
        else if (agreement_.peer_failed())
          reason = "another rank failed";
        else if (nccl_failed())
          reason = "NCCL reported a failed peer (ncclCommGetAsyncError)";
        else if (agreement_.timed_out(start))
          reason = silent_peer;
        if (reason != nullptr) {
          if (!agreement_.announced()) agreement_.stop_for_peer();
          abort_communicators();
          abort_reason_ = reason;
        }
      }
      detail::pause_between_polls(polls);
    }
    (void)cudaGetLastError();
    release_completed_sends();
  }

  cuda::Backend local_;                    ///< the rank's device
  cudaStream_t compute_stream_ = nullptr;  ///< local_'s compute stream
  cudaStream_t comm_stream_ = nullptr;     ///< NCCL sends and receives
  cudaStream_t reduce_stream_ = nullptr;   ///< NCCL gradient sums
  ncclComm_t activations_nccl_ = nullptr;  ///< this replica's ranks (rank = device): activations
  ncclComm_t gradients_nccl_ = nullptr;    ///< the same ranks: gradients
  ncclComm_t replicas_nccl_ = nullptr;     ///< this device's rank in every replica
  bool aborted_ = false;                   ///< the communicators were aborted this step
  const char* abort_reason_ = "";          ///< ... and why
  static constexpr const char* silent_peer = "a peer was silent too long";
  std::vector<Transfer> group_;        ///< transfers issued since the last other work
  std::vector<PendingSends> pending_;  ///< posted send groups, not known to be complete
  std::vector<std::uint64_t> sent_hashes_, received_hashes_;  ///< per peer, this step
  detail::SumOrder sums_;                                     ///< this step's gradient sums
};

}  // namespace gpipe::mpi

static_assert(gpipe::multi_process_backend<gpipe::mpi::CudaBackend>);
