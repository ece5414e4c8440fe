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
//   multi_process_backend<B>  a backend whose devices live in several processes (mpi::Backend):
//     is_local(d)            whether this process runs device d; the runtime issues only the
//                            ops, allocations and parameter work of its own devices
//     send(d, label, peer, tag, buffer)   on local device d: hands `buffer` (taken over when the
//                            work runs) to device `peer`; a send never blocks the device. `tag`
//                            names the message (the recv has the same); it is even for an
//                            activation (to the next stage) and odd for a gradient
//     receive(d, label, peer, tag, buffer, count, kind)   on local device d: `buffer` <- count
//                            floats from `peer`, allocated there as `kind`
//     broadcast(d, values)   collective, between steps: every process of the pipeline gets d's
//                            values
//     exchange(d, mine, theirs)  between steps, with device d's process (which calls it with
//                            this one's device): sends mine, receives theirs
//     finish_step()          collective, ends a step (instead of synchronize): the processes
//                            agree whether any failed, and all throw the same Error if one did
//     abort_step(failure)    collective, ends a step whose issuing threw `failure` on this
//                            process: tells the others, cancels, and throws the agreed Error
//     rank()                 this process's place in the world (rank 0 writes files)
//   data_parallel_backend<B>  a multi_process_backend with R replicas of the pipeline:
//     replicas(), replica()  R, and which one this process belongs to
//     allreduce_sum(values)  collective over the replicas, between steps: values <- their sum
//     expect_reductions(v)   at the start of a step: the arrays (of this process's devices)
//                            whose sum over the replicas the step computes, in the order the
//                            sums start
//     start_reduction(d, label)  on local device d, after the work before it: starts the next
//                            expected sum (in place); finish_step / abort_step start those not
//                            started (a failed step) and wait for all of them
//   stage_transport<T, Kernels>  how a stage's output reaches the next stage's device:
//     T::receive(k, src, dst, n)   on the receiver's stream, after its wait for the sender's
//                                  event: dst (its memory) <- src (the sender's)
//     T::sends               Sends::buffered when a send never blocks (one process: the
//                            receiver reads the sender's memory); Sends::rendezvous when a send
//                            completes only with its recv (between processes, NCCL across
//                            ranks): the Trainer then runs order_for_rendezvous(schedule),
//                            validates it under that rule (schedule/op.hpp) and requires
//                            messages_in_order (NCCL matches a pair's messages by order).

#include <concepts>
#include <cstddef>
#include <exception>
#include <span>
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

/// A backend whose devices live in several processes (mpi::Backend). `is_local(d)` says
/// whether this process runs device d (the runtime issues only the work of its own devices);
/// `send(d, label, peer, tag, buffer)` hands `buffer` from local device d to device `peer`
/// without blocking d; `receive(d, label, peer, tag, buffer, count, kind)` fills `buffer`,
/// allocated on d as `kind`, with count floats from `peer`; `broadcast` and `exchange` run
/// between steps; `finish_step()` ends a step instead of
/// `synchronize()`, and it and `abort_step(failure)` make every process throw the same Error if
/// one failed; `rank()` is this process's rank (rank 0 writes files).
template <class B>
concept multi_process_backend = backend<B> &&
    requires(B& b, const B& cb, std::size_t device, WorkLabel label,
             typename B::template Buffer<float>& buffer, std::span<float> values) {
  { cb.is_local(device) } -> std::convertible_to<bool>;
  b.send(device, label, device, device, buffer);
  b.receive(device, label, device, device, buffer, device, MemoryKind::activations);
  b.broadcast(device, values);
  b.exchange(device, std::span<const float>(values), values);
  b.finish_step();
  b.abort_step(std::exception_ptr{});
  { cb.rank() } -> std::convertible_to<std::size_t>;
};

/// A multi_process_backend running R replicas of the pipeline: `replicas()` is R and
/// `replica()` the one this process belongs to. `allreduce_sum(values)` sums over the replicas
/// between steps; within a step, `expect_reductions(arrays)` lists the arrays to sum, in the
/// order the sums start, and `start_reduction(d, label)` starts the next one (in place) after the
/// work queued before it on device d; `finish_step()` waits for all of them.
template <class B>
concept data_parallel_backend = multi_process_backend<B> &&
    requires(B& b, const B& cb, std::span<float> values, std::size_t device, WorkLabel label) {
  { cb.replicas() } -> std::convertible_to<std::size_t>;
  { cb.replica() } -> std::convertible_to<std::size_t>;
  b.allreduce_sum(values);
  b.expect_reductions(std::vector<std::span<float>>{});
  b.start_reduction(device, label);
};

namespace detail {

// Whether this process runs `device` (always, for a backend of one process).
template <class B>
bool is_local(const B& backend, std::size_t device) {
  if constexpr (multi_process_backend<B>) {
    return backend.is_local(device);
  } else {
    return true;
  }
}

// Every process gets `device`'s values (nothing to do in one process).
template <class B>
void broadcast_from(B& backend, std::size_t device, std::span<float> values) {
  if constexpr (multi_process_backend<B>) backend.broadcast(device, values);
}

// Whether this process writes the files of a collective save (the only one, or rank 0).
template <class B>
bool writes_files(const B& backend) {
  if constexpr (multi_process_backend<B>) {
    return backend.rank() == 0;
  } else {
    return true;
  }
}

// The replicas of the pipeline (1 but for a data_parallel_backend) and this process's.
template <class B>
std::size_t replicas_of(const B& backend) {
  if constexpr (data_parallel_backend<B>) {
    return backend.replicas();
  } else {
    return 1;
  }
}
template <class B>
std::size_t replica_of(const B& backend) {
  if constexpr (data_parallel_backend<B>) {
    return backend.replica();
  } else {
    return 0;
  }
}

}  // namespace detail

/// How a stage's output reaches the next stage's device: `T::receive(k, src, dst, n)` copies n
/// floats from the sender's memory to `dst` on the receiver's stream, after its wait for the
/// sender's event. `T::sends` is Sends::buffered when a send never blocks (one process) and
/// Sends::rendezvous when it completes only with its recv; the Trainer then reorders the
/// schedule with order_for_rendezvous.
template <class T, class Kernels>
concept stage_transport = requires(Kernels& k, const float* src, float* dst, std::size_t n) {
  T::receive(k, src, dst, n);
  { T::sends } -> std::convertible_to<Sends>;
};

}  // namespace gpipe
