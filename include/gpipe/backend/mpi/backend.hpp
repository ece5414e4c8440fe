#pragma once
// gpipe::mpi::Backend: one host device per MPI rank. With R = Options::data_parallel replicas
// of a K-device pipeline (world size R K), rank r is device r % K of replica r / K, so stage s
// runs on the ranks with r % K == s % K; the Trainer, the schedules and the model types are the
// ones of one process. Replica i takes its share of the mini-batch, and the gradients are
// summed over the replicas after each step (allreduce_sum). Each rank issues only its own device's
// ops; activations and gradients cross between ranks as MPI point-to-point messages:
//   send     MPI_Isend from the sender's output buffer, on its device's worker; the buffer stays
//            with the pending send and is freed on the sender once the send completes (checked
//            at every later transfer and at synchronize), so a send never blocks its device
//   receive  MPI_Recv into memory the receiver allocates, on its worker
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
// Not yet (see the README's "Many processes"): the gradient sum overlapped with the step (it
// runs after it), parameter() of a stage on another rank, ties across ranks, a failure on one
// rank ending the step on every rank, and a bound on the wait for a rank that died.

#include <mpi.h>

#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
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

// MPI_Init_thread / MPI_Finalize for a program's lifetime, unless MPI is already initialized.
class Session {
 public:
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

struct BackendOptions {
  std::size_t data_parallel = 1;    // replicas of the pipeline: world size = data_parallel x K
  std::size_t device_capacity = 0;  // bytes of this rank's device; 0 = no cap
};

class Backend {
 public:
  using Kernels = host::Kernels<float>;
  using Event = host::Event;
  template <class T>
  using Buffer = host::Buffer<T>;
  using Work = host::Stream::Work;
  using Options = BackendOptions;

  static constexpr std::string_view name = "mpi";

  // MPI_COMM_WORLD; initializes MPI (MPI_THREAD_SERIALIZED) unless the program did, and then
  // finalizes it when the backend goes.
  Backend(int& argc, char**& argv, Options options = {})
      : session_(std::make_unique<Session>(argc, argv)),
        comm_(MPI_COMM_WORLD),
        local_(1, {.device_capacity = options.device_capacity}) {
    start(options);
  }
  // On the caller's communicator, MPI initialized by the caller.
  explicit Backend(MPI_Comm comm = MPI_COMM_WORLD, Options options = {})
      : comm_(comm), local_(1, {.device_capacity = options.device_capacity}) {
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

  // One device per rank: world rank r is device r % K of replica r / K (K = world size /
  // data_parallel).
  std::size_t num_devices() const { return devices_; }
  std::size_t world_size() const { return size_; }
  std::size_t rank() const { return rank_; }
  std::size_t device() const { return device_; }
  std::size_t replicas() const { return replicas_; }
  std::size_t replica() const { return replica_; }
  bool is_local(std::size_t device) const { return device == device_; }
  MPI_Comm communicator() const { return comm_; }

  MemoryStats memory_stats(std::size_t device) const { return local_.memory_stats(local(device)); }
  void reset_peak() { local_.reset_peak(); }

  template <class T>
  Buffer<T> allocate(std::size_t device, std::size_t count, MemoryKind kind = MemoryKind::other) {
    return local_.template allocate<T>(local(device), count, kind);
  }
  void submit(std::size_t device, WorkLabel label, Work work) {
    local_.submit(local(device), label, std::move(work));
  }
  void record(std::size_t device, const Event& event) { local_.record(local(device), event); }
  void wait(std::size_t device, const Event& event) { local_.wait(local(device), event); }

  // On `device` (this rank's), after the work before it: sends src's `src.size()` floats to
  // `peer`'s rank with `tag`, and takes src over until the send completes.
  void send(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
            Buffer<float>& src) {
    check_peer(peer, tag);
    submit(device, label, [this, peer, tag, &src](Kernels&) {
      Pending pending{MPI_REQUEST_NULL, std::move(src)};
      detail::check_mpi(
          MPI_Isend(pending.buffer.data(), count_of(pending.buffer.size()), MPI_FLOAT,
                    static_cast<int>(peer), static_cast<int>(tag), pipeline_, &pending.request),
          "MPI_Isend");
      std::lock_guard lock(mu_);
      pending_.push_back(std::move(pending));
      release_completed_sends();
    });
  }
  // On `device`, after the work before it: dst <- `count` floats from `peer`'s rank with `tag`,
  // into memory allocated here (counted as `kind`).
  void receive(std::size_t device, WorkLabel label, std::size_t peer, std::size_t tag,
               Buffer<float>& dst, std::size_t count, MemoryKind kind) {
    check_peer(peer, tag);
    submit(device, label, [this, device, peer, tag, &dst, count, kind](Kernels&) {
      dst = allocate<float>(device, count, kind);
      MPI_Status status;
      detail::check_mpi(MPI_Recv(dst.data(), count_of(count), MPI_FLOAT, static_cast<int>(peer),
                                 static_cast<int>(tag), pipeline_, &status),
                        "MPI_Recv");
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

  // Collective over this replica's ranks, between steps: each gets the values of `device`'s.
  void broadcast(std::size_t device, std::span<float> values) {
    detail::check_mpi(MPI_Bcast(values.data(), count_of(values.size()), MPI_FLOAT,
                                static_cast<int>(device), pipeline_),
                      "MPI_Bcast");
  }
  // Collective over the replicas (the ranks of the same device in every replica), between
  // steps: values <- their sum over the replicas, in place. values is host memory or memory of
  // this rank's device (the same thing here).
  void allreduce_sum(std::span<float> values) {
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), MPI_FLOAT,
                                    MPI_SUM, replicas_comm_),
                      "MPI_Allreduce");
  }

  void set_tracing(bool on) { local_.set_tracing(on); }
  std::vector<TraceEvent> take_trace() { return local_.take_trace(); }
  // This rank's device, at its index in the schedule; the others' entries are empty.
  std::vector<ComputeTiming> take_timing() {
    std::vector<ComputeTiming> all(devices_);
    all[device_] = local_.take_timing().front();
    return all;
  }

  void cancel() {
    local_.cancel();
    complete_sends();
  }
  // Waits for this rank's work and its sends; rethrows the first failure.
  void synchronize() {
    local_.synchronize();
    complete_sends();
  }

 private:
  struct Pending {
    MPI_Request request;
    Buffer<float> buffer;
  };

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
  }
  void free_communicators() {
    for (MPI_Comm* c : {&pipeline_, &replicas_comm_})
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
    detail::require(tag <= max_tag_,
                    "message tag " + std::to_string(tag) + " exceeds this MPI's MPI_TAG_UB = " +
                        std::to_string(max_tag_) + " (too many stages x micro-batches)");
  }
  static int count_of(std::size_t n) {
    detail::require(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                    "a message of " + std::to_string(n) + " floats exceeds MPI's int count");
    return static_cast<int>(n);
  }
  // Frees the buffers of sends that have completed; called with mu_ held.
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
  // Waits for every pending send (their receivers run the same schedule) and frees them.
  void complete_sends() {
    std::lock_guard lock(mu_);
    for (Pending& p : pending_) MPI_Wait(&p.request, MPI_STATUS_IGNORE);
    pending_.clear();
  }

  std::unique_ptr<Session> session_;  // set when this backend initialized MPI: finalized last
  MPI_Comm comm_;
  MPI_Comm pipeline_ = MPI_COMM_NULL;       // this replica's ranks; rank = device
  MPI_Comm replicas_comm_ = MPI_COMM_NULL;  // this device's rank in every replica
  std::size_t rank_ = 0, size_ = 0, max_tag_ = 32767;
  std::size_t replicas_ = 1, devices_ = 1, replica_ = 0, device_ = 0;
  std::mutex mu_;
  std::vector<Pending> pending_;
  host::Backend local_;  // the rank's device; destroyed (workers joined) before pending_
};

}  // namespace gpipe::mpi
