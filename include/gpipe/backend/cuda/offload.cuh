#pragma once
// Offload for cuda::Backend (the seam: runtime/offload.hpp; mpi::CudaBackend's is the same blocks
// on its rank's device: mpi/offload.cuh). An offloaded slot's stash goes to a pinned host block on
// its device's copy stream right after its F (the copy waits for F; the compute stream goes on, and
// the stash is freed in the copy stream's order once copied), and comes back on the copy stream
// ahead of the op before its B (allocated there again), which B waits for by an event. A device's
// blocks are one pinned array, laid out at each step's begin() and kept at the same address while
// it has room, since a CUDA graph replays the copies with the addresses it captured (key() lists
// them).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/offload.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/cuda/backend.cuh"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/step_graph.cuh"
#include "gpipe/runtime/offload.hpp"

namespace gpipe::cuda::detail {

// The pinned blocks and the copies of Remat::offload on a backend B with cuda::Backend's
// submit_copy, allocate, wait and count_host_memory (cuda::Backend, mpi::CudaBackend), whose
// Kernels are cuda::Kernels; devices are B's.
template <class B>
class OffloadBlocks {
 public:
  explicit OffloadBlocks(B& backend) : backend_(backend) {}
  OffloadBlocks(const OffloadBlocks&) = delete;
  OffloadBlocks& operator=(const OffloadBlocks&) = delete;
  ~OffloadBlocks() {
    for (std::size_t d = 0; d < held_.size(); ++d)
      if (held_[d] > 0) backend_.count_host_memory(d, -static_cast<std::ptrdiff_t>(held_[d]));
  }

  // Before a step's work: slot_bytes[s M + mb] bytes of host memory for each offloaded slot of
  // this process (0 for the others), slot_device[s M + mb] its device. host_memory_stats then
  // counts each device's blocks of this step.
  void begin(std::span<const std::size_t> slot_bytes, std::span<const std::size_t> slot_device) {
    std::size_t K = 0;
    for (const std::size_t d : slot_device) K = std::max(K, d + 1);
    while (arenas_.size() < K) arenas_.push_back(std::make_unique<cuda::PinnedArray<std::byte>>());
    if (held_.size() < K) held_.resize(K, 0);
    offsets_.assign(slot_bytes.size(), 0);
    if (events_.size() < slot_bytes.size()) events_.resize(slot_bytes.size());
    std::vector<std::size_t> total(K, 0);
    for (std::size_t i = 0; i < slot_bytes.size(); ++i) {
      offsets_[i] = total[slot_device[i]];
      total[slot_device[i]] += slot_bytes[i];
    }
    for (std::size_t d = 0; d < K; ++d) {
      if (total[d] > 0) arenas_[d]->reserve(total[d]);
      if (total[d] == held_[d]) continue;
      backend_.count_host_memory(
          d, static_cast<std::ptrdiff_t>(total[d]) - static_cast<std::ptrdiff_t>(held_[d]));
      held_[d] = total[d];
    }
  }

  // The host blocks' addresses, for the step's graph key (a graph copies to and from them).
  std::vector<std::uint64_t> key() const {
    std::vector<std::uint64_t> out;
    for (const auto& a : arenas_)
      out.push_back(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(a->span().data())));
    return out;
  }

  // Right after slot's F on device d: its buffers (stash, cheap stash) to its host block on the
  // copy stream, then freed in that stream's order.
  template <class T>
  void to_host(std::size_t d, WorkLabel label, std::size_t slot,
               std::array<cuda::Buffer<T>*, 2> buffers) {
    std::byte* host = arenas_[d]->span().data() + offsets_[slot];
    backend_.submit_copy(d, label, [host, buffers](cuda::Kernels& k) {
      std::size_t at = 0;
      for (cuda::Buffer<T>* b : buffers) {
        const std::size_t bytes = b->size() * sizeof(T);
        if (bytes > 0)
          GPIPE_CUDA_CHECK(cudaMemcpyAsync(host + at, b->data(), bytes, cudaMemcpyDeviceToHost,
                                           k.copy_stream()));
        at += bytes;
        b->reset();
      }
    });
  }

  // Ahead of the op before slot's B on device d: its buffers allocated again (`sizes` elements,
  // as activations) and filled from its host block on the copy stream; before_backward waits.
  template <class T>
  void from_host(std::size_t d, WorkLabel label, std::size_t slot,
                 std::array<cuda::Buffer<T>*, 2> buffers, std::array<std::size_t, 2> sizes) {
    const std::byte* host = arenas_[d]->span().data() + offsets_[slot];
    backend_.submit_copy(
        d, label,
        [this, d, host, buffers, sizes](cuda::Kernels& k) {
          std::size_t at = 0;
          for (std::size_t i = 0; i < buffers.size(); ++i) {
            *buffers[i] = backend_.template allocate<T>(d, sizes[i], MemoryKind::activations);
            const std::size_t bytes = sizes[i] * sizeof(T);
            if (bytes > 0)
              GPIPE_CUDA_CHECK(cudaMemcpyAsync(buffers[i]->data(), host + at, bytes,
                                               cudaMemcpyHostToDevice, k.copy_stream()));
            at += bytes;
          }
        },
        &events_[slot]);
  }

  // Before slot's B on device d: its compute stream waits for from_host's copies.
  void before_backward(std::size_t d, std::size_t slot) { backend_.wait(d, events_[slot]); }

 private:
  B& backend_;
  std::vector<std::unique_ptr<cuda::PinnedArray<std::byte>>> arenas_;  // per device
  std::vector<std::size_t> held_;     // per device: the bytes host_memory_stats counts
  std::vector<std::size_t> offsets_;  // per slot: its block's offset in its device's array
  std::vector<cuda::Event> events_;   // per slot: from_host's copies done
};

}  // namespace gpipe::cuda::detail

namespace gpipe::detail {

template <>
class Offload<cuda::Backend> : public cuda::detail::OffloadBlocks<cuda::Backend> {
 public:
  static constexpr bool supported = true;
  using OffloadBlocks::OffloadBlocks;
};

}  // namespace gpipe::detail
