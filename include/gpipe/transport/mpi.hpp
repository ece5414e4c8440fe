#pragma once
// The transport of every backend that runs one device per process (a multi_process_backend,
// backend/concepts.hpp): mpi::Backend (host devices, MPI messages) and mpi::CudaBackend (GPUs,
// NCCL messages bootstrapped over MPI) share this one implementation of the protocol; each
// backend brings the mechanics (how a message is posted, how the sums run, how its device's work
// is waited for). The protocol:
//   messages   each process issues only its own device's ops; a send hands its buffer to the
//              backend (freed once sent), a receive allocates and fills the receiver's buffer.
//              A message's tag names it: (sending stage, micro-batch) and its direction, even
//              for an activation and odd for a gradient (mpi::CudaBackend sends the two
//              directions on separate NCCL communicators by this parity)
//   sums       with replicas, each stage's gradients are summed over them during the step, each
//              array as soon as its stage's last backward is done (begin_gradient_sums,
//              start_gradient_sum), and waited for at the step's end
//   agreement  finish_step waits for the rank's work and sums, then the ranks agree whether any
//              failed: if one did, every rank throws the same Error naming it. abort_step, when
//              issuing a step threw, first tells the other ranks at once.
//   between steps  broadcast from a device's rank, exchange between two ranks, sums over the
//              replicas (the backends' MPI collectives); copy within the rank's device

#include <chrono>
#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/concepts.hpp"
#include "gpipe/backend/mpi/agreement.hpp"
#include "gpipe/backend/mpi/shares.hpp"
#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/transport/in_process.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe::transport {

/// The transport of a backend of one device per process (see the top of this file).
template <class Backend>
requires multi_process_backend<Backend>
class Transport<Backend> {
 public:
  using Kernels = typename Backend::Kernels;                ///< the backend's kernel context
  using Buffer = typename Backend::template Buffer<float>;  ///< a message's data on the device

  /// How a send completes: buffered for MPI, rendezvous for NCCL (the backend's hand-over policy).
  static constexpr Sends sends = hand_over_for<Backend>::sends;

  /// A message between processes carries its data: nothing is left with the sender's slot. A
  /// message between two stages of this rank's device (a V-shaped placement's turn) is a local
  /// copy, as in one process: the sender leaves its buffer here.
  template <class T>
  struct Mailbox {
    /// a local message's buffer, freed by the receiver's copy
    typename Backend::template Buffer<T>* sent = nullptr;
  };

  /// A handle to `backend`, which must outlive it.
  explicit Transport(Backend& backend) : backend_(backend) {}

  /// `gpipe::Error` unless the backend's pipeline has exactly `devices` devices (ranks).
  static void check_device_count(const Backend& backend, std::size_t devices, std::size_t stages) {
    const std::string model =
        "the model has " + std::to_string(stages) + " stages on " + std::to_string(devices);
    detail::require(backend.num_devices() >= devices, model + " devices but the backend has only " +
                                                          std::to_string(backend.num_devices()));
    detail::require(backend.num_devices() == devices,
                    model + " devices, but the backend's pipeline has " +
                        std::to_string(backend.num_devices()) + " (world size " +
                        std::to_string(backend.world_size()) + " = " +
                        std::to_string(backend.replicas()) + " replicas x devices): launch " +
                        "replicas x " + std::to_string(devices) + " ranks");
  }
  /// Whether this rank runs `device`.
  bool is_local(std::size_t device) const { return backend_.is_local(device); }
  /// Rank 0 writes the files of a collective save.
  bool writes_files() const { return backend_.rank() == 0; }
  /// The replicas of the pipeline.
  std::size_t replicas() const { return backend_.replicas(); }
  /// The replica this rank belongs to.
  std::size_t replica() const { return backend_.replica(); }

  /// The tag of a message: even for an activation, odd for a gradient.
  static std::size_t tag(const Message& m) {
    return (m.stage * m.micro_batches + m.micro_batch) * 2 + (m.gradient ? 1 : 0);
  }
  /// On message.from (this rank's device): src is handed to the backend, which frees it once
  /// sent.
  template <class T>
  void send(WorkLabel label, const Message& message, typename Backend::template Buffer<T>& src,
            Mailbox<T>& box) const {
    if (message.from == message.to) {
      box.sent = &src;  // the receive below, later on the same stream, copies it
      return;
    }
    backend_.send(message.from, label, message.to, tag(message), src);
  }
  /// On message.to (this rank's device): dst <- count floats from message.from's rank, or, for
  /// a message within the device, from the buffer its send left (copied on the device's stream,
  /// then freed).
  template <class T>
  void receive(WorkLabel label, const Message& message, typename Backend::template Buffer<T>& dst,
               std::size_t count, MemoryKind kind, Mailbox<T>& box) const {
    if (message.from != message.to) {
      backend_.receive(message.to, label, message.from, tag(message), dst, count, kind);
      return;
    }
    detail::require(box.sent != nullptr, "a receive was issued before its send");
    auto& src = *box.sent;
    const std::size_t device = message.to;
    backend_.submit(device, label, [this, device, &src, &dst, count, kind](Kernels& k) {
      detail::require(src.size() == count, [&] {
        return "a message of " + std::to_string(src.size()) + " elements where " +
               std::to_string(count) + " were expected";
      });
      dst = backend_.template allocate<T>(device, count, kind);
      InProcessHandOver::receive(k, src.data(), dst.data(), count);
      src.reset();
    });
  }

  /// The arrays (on this rank's device) whose sum over the replicas the step computes, in the
  /// order start_gradient_sum starts them.
  void begin_gradient_sums(std::vector<std::span<float>> arrays) const {
    backend_.expect_reductions(std::move(arrays));
  }
  /// On `device`, after the work queued before it: starts the next sum.
  void start_gradient_sum(std::size_t device, WorkLabel label) const {
    backend_.start_reduction(device, label);
  }

  /// At a step's start, local: the step's timing counts from here. Not take_timing(), which is
  /// collective: a rank that refuses its inputs goes from here to the agreement (abort_step),
  /// which the others reach at the step's end, and no other collective may come between.
  void restart_timing() const { backend_.restart_timing(); }
  /// Collective, ends a step: waits for this rank's work and sums, then the ranks agree whether
  /// any failed; if one did, every rank throws the same Error.
  void finish_step() const {
    std::string failure;
    bool out_of_memory = false;
    const auto keep = [&](std::exception_ptr e) {
      if (!failure.empty()) return;
      failure = detail::FaultAgreement::message_of(e);
      out_of_memory = detail::FaultAgreement::out_of_memory(e);
    };
    try {
      backend_.synchronize();
    } catch (...) {
      keep(std::current_exception());
    }
    try {
      backend_.finish_reductions();
    } catch (...) {
      keep(std::current_exception());
    }
    backend_.agree(std::move(failure), out_of_memory);
  }
  /// Collective, instead of finish_step when issuing this rank's part of a step threw `failure`
  /// (before its work could fail): tells the other ranks at once, drops the work issued, and
  /// joins the agreement; throws the agreed Error.
  [[noreturn]] void abort_step(std::exception_ptr failure) const {
    backend_.announce_failure();
    try {
      backend_.cancel();
      backend_.finish_reductions();
    } catch (...) {  // the failure to report is `failure`
    }
    backend_.agree(detail::FaultAgreement::message_of(failure),
                   detail::FaultAgreement::out_of_memory(failure));
    throw Error("gpipe: rank " + std::to_string(backend_.rank()) + " failed");  // agree threw
  }

  /// `failure` was thrown on this rank between steps while doing `what` (a Trainer member): tells
  /// every other rank at once (MpiRanks::fail_between_steps), since it may have skipped a
  /// collective they wait in; the ranks are lost from then on.
  void fail_between_steps(std::string_view what, std::exception_ptr failure) const {
    backend_.fail_between_steps(what, detail::FaultAgreement::message_of(failure));
  }

  /// Collective over this replica's ranks: each gets `device`'s values.
  void broadcast(std::size_t device, std::span<float> values) const {
    backend_.broadcast(device, values);
  }
  /// Collective over every process (a barrier): whether every process passed true.
  bool all_succeeded(bool mine) const { return backend_.all_succeeded(mine); }
  /// As above, of doubles.
  void broadcast(std::size_t device, std::span<double> values) const {
    backend_.broadcast(device, values);
  }
  /// With `peer`'s rank, which calls it with this rank's device: sends mine, receives theirs
  /// (memory of this rank's device: over MPI for host ranks, NCCL for GPU ranks).
  void exchange(std::size_t peer, std::span<const float> mine, std::span<float> theirs) const {
    backend_.exchange(peer, mine, theirs);
  }
  /// The elements [first, last) of a stage's n parameters whose optimizer state this process
  /// keeps and updates: all of them, or with a backend that shards the optimizer over R > 1
  /// replicas (mpi::BackendOptions::shard_optimizer, ZeRO-1) this replica's 1/R.
  std::pair<std::size_t, std::size_t> optimizer_share(std::size_t n) const {
    if (!shards_optimizer()) return {0, n};
    return detail::replica_share(n, backend_.replicas(), backend_.replica());
  }
  /// Whether the optimizer state is sharded over the replicas (see optimizer_share).
  bool shards_optimizer() const {
    if constexpr (requires { backend_.shards_optimizer(); })
      return backend_.shards_optimizer();
    else
      return false;
  }
  /// Between steps, collective over the replicas when the optimizer is sharded: a stage's
  /// `values` (on this rank's device) <- every replica's share of them (optimizer_share), in place.
  void gather_optimizer_shares(std::span<float> values) const {
    if constexpr (requires { backend_.allgather_shares(values); })
      if (shards_optimizer()) backend_.allgather_shares(values);
  }
  /// Between steps, collective over the replicas when the optimizer is sharded: the n elements
  /// whose share (optimizer_share) this replica holds in `mine`, whole on replica 0, empty on
  /// the others.
  std::vector<float> collect_optimizer_shares(std::span<const float> mine, std::size_t n) const {
    if constexpr (requires { backend_.gather_shares(mine, n); }) {
      if (shards_optimizer()) return backend_.gather_shares(mine, n);
    }
    throw Error("gpipe: collect_optimizer_shares without a sharded optimizer");
  }
  /// Collective over every process: seconds from the earliest process's `start` to the latest
  /// one's `end`, on the one clock of the ranks' traces.
  double wall_seconds(std::chrono::steady_clock::time_point start,
                      std::chrono::steady_clock::time_point end) const {
    return backend_.wall_seconds(start, end);
  }
  /// Collective over the replicas: values <- their sum.
  void allreduce_sum(std::span<float> values) const { backend_.allreduce_sum(values); }
  /// Between steps: dst <- src, both on this rank's one device (`from` and `to`), after the work
  /// queued on it; returns once copied.
  void copy(WorkLabel label, std::size_t from, std::span<const float> src, std::size_t to,
            std::span<float> dst) const {
    detail::require(from == to && backend_.is_local(from),
                    "a copy between devices " + std::to_string(from) + " and " +
                        std::to_string(to) + ", where this rank runs one device");
    detail::require(src.size() == dst.size(), "a copy of " + std::to_string(src.size()) +
                                                  " floats into " + std::to_string(dst.size()));
    backend_.submit(to, label,
                    [src, dst](Kernels& k) { k.copy(src.size(), src.data(), dst.data()); });
    backend_.synchronize();
  }

 private:
  Backend& backend_;
};

}  // namespace gpipe::transport
