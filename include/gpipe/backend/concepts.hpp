#pragma once
// The seams between the runtime and a backend, written down as concepts (each documented where
// it is declared below): `device_buffer`, `backend` (devices as in-order streams of work with
// counted memory: what the executor submits to), `multi_process_backend` (a device per process:
// the mechanics transport/mpi.hpp's Transport calls), and `hand_over_policy` (how a backend copies
// a message between two of its devices in one process). The kernel context a layer's code runs with
// is gpipe::kernel_context (model/kernel_context.hpp). gpipe::host::Backend and
// gpipe::cuda::Backend satisfy `backend` (their headers check it), the MPI backends
// `multi_process_backend`; a new backend is written against them.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// An owning handle to device memory: movable, default-constructible (empty), with `data()`,
/// `size()` (in elements) and `reset()` (frees the memory now and leaves the handle empty).
template <class Buffer>
concept device_buffer = std::movable<Buffer> && std::default_initializable<Buffer> &&
    requires(Buffer& b, const Buffer& cb) {
  cb.data();
  { cb.size() } -> std::convertible_to<std::size_t>;
  b.reset();
};

/// What the Trainer runs on: devices `0..num_devices()-1`, each an in-order stream of work with
/// its own counted memory. `B::Kernels` is the kernel_context work runs with, `B::Event` is
/// recorded on one device's stream and waited for on another's, `B::Buffer` is a device_buffer
/// made by `allocate<T>(device, count, kind)` (counted under `kind`; OutOfMemory past the
/// device's capacity). `submit(device, label, work)` queues `work(Kernels&)` on the device's
/// stream, in submission order; `synchronize()` waits for all work and rethrows the first failure
/// as a gpipe::Error (OutOfMemory stays OutOfMemory) whose message starts with describe(label,
/// device); `cancel()` drops work not yet run and releases every wait.
/// `set_tracing`, `take_trace()` and `take_timing()` report what ran (TraceEvent,
/// ComputeTiming); `B::name` names it ("host", "cuda"). Optional: `devices_share_cores(busy)`,
/// whether `busy` devices computing at once share the machine's cores (BubbleBreakdown; false
/// where not provided). gpipe::host::Backend and gpipe::cuda::Backend model it. (A function pointer
/// stands for the work: nvcc's front end refuses a lambda in a requires-clause.)
template <class B>
concept backend = requires(B& b, const B& cb, std::size_t device, WorkLabel label,
                           const typename B::Event& event, void (*work)(typename B::Kernels&)) {
  requires kernel_context<typename B::Kernels>;
  requires device_buffer<typename B::template Buffer<float>>;
  requires std::default_initializable<typename B::Event>;
  { B::name } -> std::convertible_to<std::string_view>;
  { cb.num_devices() } -> std::convertible_to<std::size_t>;
  { cb.memory_stats(device) } -> std::same_as<MemoryStats>;
  b.reset_peak();
  {
    b.template allocate<float>(device, device, MemoryKind::other)
    } -> std::same_as<typename B::template Buffer<float>>;
  b.submit(device, label, work);
  b.record(device, event);
  b.wait(device, event);
  b.synchronize();
  b.cancel();
  b.set_tracing(true);
  { b.take_trace() } -> std::same_as<std::vector<TraceEvent>>;
  { b.take_timing() } -> std::same_as<std::vector<ComputeTiming>>;
};

/// A backend of one device per process, running R replicas of a pipeline (mpi::Backend,
/// mpi::CudaBackend): the layout (`is_local(d)`, `rank()`, `world_size()`, `replicas()`,
/// `replica()`); tagged messages: `send(d, label, peer, tag, buffer)` hands `buffer` (taken over
/// when the work runs) from local device d to `peer` without blocking d, `receive(d, label, peer,
/// tag, buffer, count, kind)` fills `buffer`, allocated on d as `kind` (a tag's parity is its
/// direction, see transport/mpi.hpp); the step's gradient sums over the replicas
/// (`expect_reductions`, `start_reduction`, `finish_reductions`); the failure agreement
/// (`announce_failure`, `agree(failure, out_of_memory)`, collective: all throw one Error if one
/// failed, OutOfMemory if so); `restart_timing()`, which starts the rank's count of compute time
/// afresh without a collective (`take_timing()` gathers it, collectively); and the collectives
/// between steps (`broadcast` of floats or doubles, `exchange`, `allreduce_sum`, `all_succeeded`,
/// and `wall_seconds(start, end)`: from the earliest rank's start to the latest one's end, on the
/// ranks' one clock). The runtime reaches it only through `transport::Transport`
/// (transport/mpi.hpp).
template <class B>
concept multi_process_backend = backend<B> &&
    requires(B& b, const B& cb, std::size_t device, WorkLabel label,
             typename B::template Buffer<float>& buffer, std::span<float> values) {
  { cb.is_local(device) } -> std::convertible_to<bool>;
  { cb.rank() } -> std::convertible_to<std::size_t>;
  { cb.world_size() } -> std::convertible_to<std::size_t>;
  { cb.replicas() } -> std::convertible_to<std::size_t>;
  { cb.replica() } -> std::convertible_to<std::size_t>;
  b.send(device, label, device, device, buffer);
  b.receive(device, label, device, device, buffer, device, MemoryKind::activations);
  b.expect_reductions(std::vector<std::span<float>>{});
  b.start_reduction(device, label);
  b.finish_reductions();
  b.announce_failure();
  b.agree(std::string{});
  b.broadcast(device, values);
  b.broadcast(device, std::span<double>());
  { b.all_succeeded(true) } -> std::convertible_to<bool>;
  b.exchange(device, std::span<const float>(values), values);
  b.allreduce_sum(values);
  b.restart_timing();
  {
    b.wall_seconds(std::chrono::steady_clock::time_point{}, std::chrono::steady_clock::time_point{})
    } -> std::convertible_to<double>;
};

/// A backend's hand-over policy (`hand_over_for<Backend>`): `T::receive(k, src, dst, n)` copies n
/// floats from the sender's memory to `dst` on the receiver's stream, after its wait for the
/// sender's event; `T::sends` is Sends::buffered when a send never blocks and Sends::rendezvous
/// when it completes only with its recv (the Trainer then orders the schedule with
/// order_for_rendezvous).
template <class T, class Kernels>
concept hand_over_policy = requires(Kernels& k, const float* src, float* dst, std::size_t n) {
  T::receive(k, src, dst, n);
  { T::sends } -> std::convertible_to<Sends>;
};

}  // namespace gpipe
