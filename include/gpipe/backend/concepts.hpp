#pragma once
// The seams between the runtime and a backend, written down as concepts: what the Trainer and its
// executor call on a Backend, and on the Transport that hands activations and gradients between
// its devices. The kernel context a layer's code runs with is gpipe::kernel_context
// (model/kernel_context.hpp). gpipe::host::Backend and gpipe::cuda::Backend satisfy these (their
// headers check it); a new backend is written against them.
//
//   backend<B>               devices 0..num_devices()-1, each an in-order stream of work with its
//                            own counted memory:
//     B::Kernels             the kernel context work runs with (a kernel_context)
//     B::Event               recorded on one device's stream, waited for on another's
//     B::Buffer<T>           owning device memory: data(), size(), reset(); movable
//     B::name                "host", "cuda", ...
//     num_devices(), memory_stats(d), reset_peak()
//     allocate<T>(d, count, kind)   memory on device d, counted under kind
//     submit(d, label, work)        work(Kernels&) runs on d's stream, in submission order; a
//                                   failure is reported by synchronize() with the label
//     record(d, event), wait(d, event)
//     synchronize()          waits for all work; rethrows the first failure
//     cancel()               drops work not yet run and releases every wait
//     set_tracing(on), take_trace(), take_timing()
//     devices_share_cores(busy)   optional: whether `busy` devices computing at once share the
//                            machine's cores (for BubbleBreakdown; false where not provided)
//   multi_process_backend<B>  a backend of one device per process, R replicas of a pipeline of
//                            K devices (mpi::Backend, mpi::CudaBackend); the runtime reaches it
//                            only through its transport (transport/mpi.hpp), which calls:
//     is_local(d), rank(), world_size(), replicas(), replica()   the layout
//     send(d, label, peer, tag, buffer)   on local device d: hands `buffer` (taken over when the
//                            work runs) to device `peer`; a send never blocks the device. `tag`
//                            names the message (the recv has the same; its parity is the
//                            direction, see transport/mpi.hpp)
//     receive(d, label, peer, tag, buffer, count, kind)   on local device d: `buffer` <- count
//                            floats from `peer`, allocated there as `kind`
//     expect_reductions(v)   at the start of a step: the arrays (of this process's device) whose
//                            sum over the replicas the step computes, in the order they start
//     start_reduction(d, label)  on local device d, after the work before it: starts the next
//     finish_reductions()    at the step's end: starts those not started (a failed step), waits
//     announce_failure()     tells the other processes at once that this one failed
//     agree(failure)         collective, ends a step: the processes agree whether any failed
//                            ("" = not this one), and all throw the same Error if one did
//     broadcast(d, values), exchange(d, mine, theirs), allreduce_sum(values)   collectives
//                            between steps: from d's process; with d's process; over replicas
//   stage_transport<T, Kernels>  a backend's copy policy (transport_for<B>, transport/select.hpp):
//     T::receive(k, src, dst, n)   how transport::Transport copies within one process, on the
//                                  receiver's stream after its wait for the sender's event
//     T::sends               Sends::buffered when a send never blocks; Sends::rendezvous when a
//                            send completes only with its recv (NCCL across ranks): the Trainer
//                            then orders and validates its schedule for that (schedule/op.hpp)

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
/// ComputeTiming). gpipe::host::Backend and gpipe::cuda::Backend model it. (A function pointer
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
/// `replica()`), tagged messages (`send`, `receive`), the step's gradient sums over the replicas
/// (`expect_reductions`, `start_reduction`, `finish_reductions`), the failure agreement
/// (`announce_failure`, `agree`) and the collectives between steps (`broadcast`, `exchange`,
/// `allreduce_sum`). The runtime reaches it only through `transport::Transport`
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
};

/// A backend's copy policy (`transport_for<Backend>`): `T::receive(k, src, dst, n)` copies n
/// floats from the sender's memory to `dst` on the receiver's stream, after its wait for the
/// sender's event; `T::sends` is Sends::buffered when a send never blocks and Sends::rendezvous
/// when it completes only with its recv (the Trainer then orders the schedule with
/// order_for_rendezvous).
template <class T, class Kernels>
concept stage_transport = requires(Kernels& k, const float* src, float* dst, std::size_t n) {
  T::receive(k, src, dst, n);
  { T::sends } -> std::convertible_to<Sends>;
};

}  // namespace gpipe
