#pragma once
// gpipe::transport::Transport<Backend>: the one seam through which the runtime moves data between
// devices and processes. The executor, the step runner and the parameter store call it for every
// backend alike, without asking what kind of backend it is; a kind of backend that moves data
// differently specializes it in this folder:
//   transport.hpp   (this file) the interface, and its definition for every backend whose devices
//                   live in one process: a stage's output is handed over by the receiving
//                   device's stream, which waits for the sender's event and then copies with the
//                   backend's hand-over policy (hand_over_for<Backend>: in_process.hpp, a kernel
//                   copy; cuda.cuh, a peer copy or an NCCL pair); the collectives have nothing to
//                   do
//   mpi.hpp         every backend of one device per rank (mpi::Backend over MPI, mpi::CudaBackend
//                   over NCCL): tagged messages, collectives over the ranks, gradient sums over
//                   the replicas and the failure agreement that ends each step
//
// The interface both definitions provide is the concept `transport_interface` below, in named
// parts (the members' contracts are stated there); the executor checks it for its backend.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/concepts.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/transport/hand_over.hpp"

namespace gpipe::transport {

/// One message of a step: stage `stage`'s output for the next stage (an activation) or its input
/// gradient for the previous one, of micro-batch `micro_batch` (of `micro_batches`), from device
/// `from` to device `to`.
struct Message {
  std::size_t stage = 0;          ///< the sending stage
  std::size_t micro_batch = 0;    ///< the micro-batch whose data it carries
  std::size_t micro_batches = 1;  ///< M, the step's micro-batches (tags count with it)
  bool gradient = false;  ///< an input gradient (to stage - 1), else an activation (to stage + 1)
  std::size_t from = 0;   ///< the sending stage's device
  std::size_t to = 0;     ///< the receiving stage's device
};

/// Where the devices run: `is_local(d)`, whether this process runs device d (issues its work);
/// `writes_files()`, whether this process writes the files of a collective save; `replicas()`
/// and `replica()`, the data-parallel replicas of the pipeline and this process's one;
/// `check_device_count(backend, n, stages)`, a gpipe::Error unless the backend runs a pipeline
/// of n devices.
template <class T, class Backend>
concept process_layout = requires(const T& t, const Backend& b, std::size_t d) {
  { t.is_local(d) } -> std::convertible_to<bool>;
  { t.writes_files() } -> std::convertible_to<bool>;
  { t.replicas() } -> std::convertible_to<std::size_t>;
  { t.replica() } -> std::convertible_to<std::size_t>;
  T::check_device_count(b, d, d);
};

/// A step's messages: `sends` (Sends::buffered or Sends::rendezvous: the Trainer orders and
/// validates its schedule for it); `Mailbox<E>`, what a message of elements E leaves with its
/// sender's slot for the receiver; `send(label, message, src, box)`, within a step on
/// message.from's stream, hands src over; `receive(label, message, dst, count, kind, box)`, on
/// message.to's stream, dst <- the message's count elements, allocated there as `kind`, and frees
/// the sender's buffer where it can reach it. In one process a message may hold any element type
/// (bf16 under MixedBf16).
template <class T, class Backend>
concept step_messages = requires(const T& t, WorkLabel label, const Message& message,
                                 typename Backend::template Buffer<float>& buffer,
                                 typename T::template Mailbox<float>& box, std::size_t n,
                                 MemoryKind kind) {
  { T::sends } -> std::convertible_to<Sends>;
  t.send(label, message, buffer, box);
  t.receive(label, message, buffer, n, kind, box);
};

/// A step's end: `restart_timing()` at its start (its timing counts from there, no collective);
/// `finish_step()` waits for its work (with several processes they agree whether one failed, and
/// all throw the same Error); `abort_step(failure)` ends a step whose issuing threw: cancels its
/// work, tells the other processes, and throws.
template <class T>
concept step_agreement = requires(const T& t, std::exception_ptr failure) {
  t.restart_timing();
  t.finish_step();
  t.abort_step(failure);
};

/// Between processes and replicas: `begin_gradient_sums(arrays)` and `start_gradient_sum(d,
/// label)`, with replicas the arrays whose sum over them a step computes, in the order the sums
/// start (the next one after the work queued on d); between steps `broadcast(d, values)` (every
/// process gets device d's floats or doubles), `exchange(peer, mine, theirs)` (d's process and
/// this one swap arrays: a tie across processes), `allreduce_sum(values)` (their sum over the
/// replicas), `all_succeeded(ok)` (whether every process passed ok: a barrier).
template <class T>
concept process_collectives = requires(const T& t, std::vector<std::span<float>> arrays,
                                       std::size_t d, WorkLabel label, std::span<float> floats,
                                       std::span<double> doubles) {
  t.begin_gradient_sums(arrays);
  t.start_gradient_sum(d, label);
  t.broadcast(d, floats);
  t.broadcast(d, doubles);
  t.exchange(d, std::span<const float>(floats), floats);
  t.allreduce_sum(floats);
  { t.all_succeeded(true) } -> std::convertible_to<bool>;
};

/// ZeRO-1 (with replicas and a backend that shards; in one process every share is its own):
/// `optimizer_share(n)`, the [begin, end) of a stage's n parameters whose optimizer state this
/// process keeps; `shards_optimizer()`; between steps `gather_optimizer_shares(values)` gives
/// every replica the updated parameters and `collect_optimizer_shares(mine, n)` replica 0 the
/// whole state for a checkpoint.
template <class T>
concept optimizer_shares = requires(const T& t, std::size_t n, std::span<float> values) {
  { t.optimizer_share(n) } -> std::convertible_to<std::pair<std::size_t, std::size_t>>;
  { t.shards_optimizer() } -> std::convertible_to<bool>;
  t.gather_optimizer_shares(values);
  {
    t.collect_optimizer_shares(std::span<const float>(values), n)
    } -> std::same_as<std::vector<float>>;
};

/// Between steps: `wall_seconds(start, end)`, seconds from the earliest process's start to the
/// latest one's end (steady_clock; across processes on the traces' one clock); `copy(label,
/// from, src, to, dst)`, an array of one of this process's devices into another's (or the
/// same's), device to device (a tie within the process); `fail_between_steps(what, failure)`,
/// this process's work between steps threw `failure` while doing `what`: with several
/// processes the others are told at once.
template <class T>
concept between_steps = requires(const T& t, std::chrono::steady_clock::time_point time,
                                 WorkLabel label, std::size_t d, std::span<float> dst,
                                 std::exception_ptr failure) {
  { t.wall_seconds(time, time) } -> std::convertible_to<double>;
  t.copy(label, d, std::span<const float>(dst), d, dst);
  t.fail_between_steps(std::string_view(), failure);
};

/// transport_interface<T, Backend>: what the runtime calls of `Transport<Backend>` (T), for
/// every backend alike.
template <class T, class Backend>
concept transport_interface = process_layout<T, Backend> && step_messages<T, Backend> &&
    step_agreement<T> && process_collectives<T> && optimizer_shares<T> && between_steps<T>;

/// How the runtime moves data for a Backend: a handle (it holds a reference to the backend, and
/// copies and const members are cheap). This definition serves every backend whose devices
/// live in one process: a message is handed over by the receiving device's stream after it waits
/// for the sender's event, with the backend's hand-over policy (`hand_over_for<Backend>`); there is
/// one replica and nothing to agree on. Backends of one device per process get the
/// specialization of gpipe/transport/mpi.hpp.
template <class Backend>
class Transport {
 public:
  using Kernels = typename Backend::Kernels;                ///< the backend's kernel context
  using Buffer = typename Backend::template Buffer<float>;  ///< a message's data on a device
  using HandOver =
      hand_over_for<Backend>;  ///< the backend's hand-over policy (transport/hand_over.hpp)
  static_assert(hand_over_policy<HandOver, Kernels>,
                "gpipe: a backend's hand-over policy needs receive(kernels, src, dst, n) and sends "
                "(backend/concepts.hpp)");

  /// How a send completes: the hand-over policy's rule.
  static constexpr Sends sends = HandOver::sends;

  /// A message of one process, of elements T: the sender records `ready` after its data and
  /// leaves its buffer.
  template <class T>
  struct Mailbox {
    typename Backend::Event ready;  ///< recorded on the sender's stream after its data
    typename Backend::template Buffer<T>* sent = nullptr;  ///< freed by the receiver's copy
  };

  /// A handle to `backend`, which must outlive it.
  explicit Transport(Backend& backend) : backend_(backend) {}

  /// `gpipe::Error` unless the backend has the `devices` a pipeline of `stages` stages needs.
  static void check_device_count(const Backend& backend, std::size_t devices, std::size_t stages) {
    detail::require(backend.num_devices() >= devices, "the model has " + std::to_string(stages) +
                                                          " stages on " + std::to_string(devices) +
                                                          " devices but the backend has only " +
                                                          std::to_string(backend.num_devices()));
  }
  /// Every device is this process's.
  bool is_local(std::size_t) const { return true; }
  /// The only process writes the files.
  bool writes_files() const { return true; }
  /// One replica of the pipeline.
  std::size_t replicas() const { return 1; }
  /// ... and this process runs it.
  std::size_t replica() const { return 0; }

  /// On message.from's stream: `box` gets src and an event recorded after the work before it.
  template <class T>
  void send(WorkLabel, const Message& message, typename Backend::template Buffer<T>& src,
            Mailbox<T>& box) const {
    box.sent = &src;
    backend_.record(message.from, box.ready);
  }
  /// On message.to's stream, after its wait for the sender's event: dst <- the sender's buffer,
  /// copied into memory allocated here as `kind` (so the bytes count where they live); the
  /// sender's buffer is freed once copied.
  template <class T>
  void receive(WorkLabel label, const Message& message, typename Backend::template Buffer<T>& dst,
               std::size_t count, MemoryKind kind, Mailbox<T>& box) const {
    detail::require(box.sent != nullptr, "a receive was issued before its send");
    const std::size_t device = message.to;
    // the send that records box.ready, named in a timeout's message
    backend_.wait(
        device, box.ready,
        {.what = to_string(message.gradient ? OpKind::send_gradient : OpKind::send_activation),
         .stage = message.stage,
         .micro_batch = message.micro_batch},
        message.from);
    auto& src = *box.sent;
    backend_.submit(device, label, [this, device, &src, &dst, count, kind](Kernels& k) {
      detail::require(src.size() == count, [&] {
        return "a message of " + std::to_string(src.size()) + " elements where " +
               std::to_string(count) + " were expected";
      });
      dst = backend_.template allocate<T>(device, count, kind);
      HandOver::receive(k, src.data(), dst.data(), count);
      src.reset();
    });
  }

  /// One replica: there is nothing to sum.
  void begin_gradient_sums(std::vector<std::span<float>> arrays) const {
    detail::require(arrays.empty(), "one process has no replicas to sum gradients over");
  }
  /// One replica: nothing to start.
  void start_gradient_sum(std::size_t, WorkLabel) const {}

  /// At a step's start: the step's timing counts from here.
  void restart_timing() const { (void)backend_.take_timing(); }
  /// Waits for the step's work; rethrows the first failure of any stream.
  void finish_step() const { backend_.synchronize(); }
  /// Cancels the work issued, then rethrows `failure`.
  [[noreturn]] void abort_step(std::exception_ptr failure) const {
    backend_.cancel();
    std::rethrow_exception(failure);
  }

  /// One process: it has `device`'s values already.
  void broadcast(std::size_t, std::span<float>) const {}
  /// As above, of doubles.
  void broadcast(std::size_t, std::span<double>) const {}
  /// One process: waits for its devices' work, and it is every process.
  bool all_succeeded(bool mine) const {
    backend_.synchronize();
    return mine;
  }
  /// One process holds every device's arrays: it has no peer to exchange with.
  void exchange(std::size_t, std::span<const float>, std::span<float>) const {
    throw Error("gpipe: a backend of one process has no other process to exchange with");
  }
  /// One process keeps the optimizer state of every parameter: [0, n).
  std::pair<std::size_t, std::size_t> optimizer_share(std::size_t n) const { return {0, n}; }
  /// One process does not shard the optimizer.
  bool shards_optimizer() const { return false; }
  /// Nothing to gather: every share is this process's.
  void gather_optimizer_shares(std::span<float>) const {}
  /// Never called: the optimizer is not sharded in one process.
  std::vector<float> collect_optimizer_shares(std::span<const float>, std::size_t) const {
    throw Error("gpipe: collect_optimizer_shares without a sharded optimizer");
  }
  /// Seconds from `start` to `end`: this process is every process.
  double wall_seconds(std::chrono::steady_clock::time_point start,
                      std::chrono::steady_clock::time_point end) const {
    return std::chrono::duration<double>(end - start).count();
  }
  /// One replica: values are their own sum.
  void allreduce_sum(std::span<float>) const {}
  /// One process: nobody to tell.
  void fail_between_steps(std::string_view, std::exception_ptr) const {}
  /// Between steps: dst, on device `to`, <- src, on device `from` (both this process's), after
  /// the work queued on both, by the hand-over policy (device to device: never through the host);
  /// returns once copied.
  void copy(WorkLabel label, std::size_t from, std::span<const float> src, std::size_t to,
            std::span<float> dst) const {
    copy_array(label, from, src, to, dst);
  }
  /// As the copy of floats, of bf16 (a tied tensor's part of gpipe::MixedBf16's copy of the
  /// weights).
  void copy(WorkLabel label, std::size_t from, std::span<const bf16> src, std::size_t to,
            std::span<bf16> dst) const {
    copy_array(label, from, src, to, dst);
  }

 private:
  template <class T>
  void copy_array(WorkLabel label, std::size_t from, std::span<const T> src, std::size_t to,
                  std::span<T> dst) const {
    detail::require(src.size() == dst.size(), "a copy of " + std::to_string(src.size()) +
                                                  " elements into " + std::to_string(dst.size()));
    typename Backend::Event ready;  // lives until the synchronize below
    if (from != to) {
      backend_.record(from, ready);
      backend_.wait(to, ready);
    }
    backend_.submit(to, label, [from, to, src, dst](Kernels& k) {
      if (from == to)
        copy_on(k, src.size(), src.data(), dst.data());
      else
        HandOver::receive(k, src.data(), dst.data(), src.size());
    });
    backend_.synchronize();
  }
  // dst(n) <- src(n) on one device: by the context, or for bf16 by its bf16 context.
  template <class T>
  static void copy_on(Kernels& k, std::size_t n, const T* src, T* dst) {
    if constexpr (requires { k.copy(n, src, dst); })
      k.copy(n, src, dst);
    else
      k.bf16_context().copy(n, src, dst);
  }

  Backend& backend_;
};

/// Runs `work` on this process, then every process agrees whether it threw anywhere
/// (collective: every process calls it, through a transport of its backend). When none threw, it
/// returns; otherwise it throws on every process: its own exception where `work` threw, elsewhere
/// gpipe::Error saying that another process could not `what`, an OutOfMemory where a process ran
/// out of memory. For work that may fail on one process alone outside a step (its allocations,
/// its files), after which the processes must still agree, and may go on together.
template <class T, class Work>
void together(const T& transport, std::string_view what, Work&& work) {
  std::exception_ptr failure;
  bool out_of_memory = false;
  try {
    std::forward<Work>(work)();
  } catch (const OutOfMemory&) {
    failure = std::current_exception();
    out_of_memory = true;
  } catch (...) {
    failure = std::current_exception();
  }
  if (transport.all_succeeded(failure == nullptr)) return;
  const bool any_out_of_memory = !transport.all_succeeded(!out_of_memory);
  if (failure) std::rethrow_exception(failure);
  if (any_out_of_memory)
    throw OutOfMemory("gpipe: another process ran out of memory: it could not " +
                      std::string(what) + " (its error says how much)");
  throw Error("gpipe: another process could not " + std::string(what) + " (its error says why)");
}

}  // namespace gpipe::transport
