#pragma once
// Per-device memory of the host backend: an allocator with the backends' byte accounting (see
// backend/memory.hpp) over aligned operator new, and Buffer<T>, an owning handle to an
// allocation on one device.
//
// Freed blocks are kept, by size, and handed out again to the next request of that size, as the
// CUDA backend's pool does: a training step allocates the same sizes every step, and returning
// large blocks to the operating system made each step fault in and zero every page again (a
// quarter of a GPT step's time). The accounting counts what buffers hold, not the cache; the
// cache holds at most what was once in use, and is freed when the allocator goes, or first when
// operator new fails.

#include <cstddef>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/memory.hpp"
#include "gpipe/error.hpp"

namespace gpipe::host {

/// One device's memory: aligned blocks of operator new, counted against the device's capacity,
/// and freed blocks kept by size for reuse. Thread-safe: any worker may free memory that another
/// device's worker allocated.
class DeviceAllocator {
 public:
  /// Alignment of every block in bytes: a cache line, and the widest SIMD register (AVX-512).
  static constexpr std::size_t alignment = 64;

  /// Counts for `device` (the number it goes by in out-of-memory messages), capped at `capacity`
  /// bytes; 0 = no cap.
  DeviceAllocator(std::size_t device, std::size_t capacity) : counter_(device, capacity) {}
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;
  ~DeviceAllocator() { release_cached(); }

  /// `bytes` bytes aligned to `alignment` (nullptr for 0), counted under `kind`. Throws
  /// OutOfMemory when they would take the device past its capacity, or when the host has not
  /// got them even after the cached blocks are freed.
  void* allocate(std::size_t bytes, MemoryKind kind = MemoryKind::other) {
    if (bytes == 0) return nullptr;
    counter_.reserve(bytes, kind);
    {
      const std::lock_guard lock(mutex_);
      const auto it = cached_.find(bytes);
      if (it != cached_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        return p;
      }
    }
    try {
      return new_block(bytes);
    } catch (const std::bad_alloc&) {
      release_cached();
      try {
        return new_block(bytes);
      } catch (const std::bad_alloc&) {
        counter_.release(bytes, kind);
        throw OutOfMemory("gpipe: the host could not allocate " + std::to_string(bytes) +
                          " bytes for device " + std::to_string(device()));
      }
    }
  }

  /// Takes back a block of allocate() with its `bytes` and `kind`: uncounts it, and keeps it for
  /// the next request of that size. A null `p` does nothing.
  void deallocate(void* p, std::size_t bytes, MemoryKind kind = MemoryKind::other) noexcept {
    if (p == nullptr) return;
    counter_.release(bytes, kind);
    try {
      const std::lock_guard lock(mutex_);
      cached_[bytes].push_back(p);
    } catch (...) {  // no memory to remember the block: give it back instead
      ::operator delete (p, std::align_val_t{alignment});
    }
  }

  /// Frees every cached block.
  void release_cached() noexcept {
    const std::lock_guard lock(mutex_);
    for (auto& [bytes, blocks] : cached_)
      for (void* p : blocks) ::operator delete (p, std::align_val_t{alignment});
    cached_.clear();
  }

  /// Bytes in use now and at most since the last reset_peak(), in all and per MemoryKind;
  /// cached free blocks are not in use.
  MemoryStats stats() const { return counter_.stats(); }
  /// Sets the peaks to the current use.
  void reset_peak() { counter_.reset_peak(); }
  /// The number the device goes by, as given to the constructor.
  std::size_t device() const { return counter_.device(); }

 private:
  static void* new_block(std::size_t bytes) {
    return ::operator new (bytes, std::align_val_t{alignment});
  }

  detail::MemoryCounter counter_;
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> cached_;  ///< bytes -> free blocks
};

/// Owns `size()` uninitialized elements of `T` on one device: `data()`, `size()`, `kind()`,
/// `reset()`; move-only, empty when the size is 0. Its memory goes back to the allocator (to be
/// reused) when it is reset or destroyed, so it must not outlive the backend.
template <class T>
using Buffer = detail::Buffer<T, DeviceAllocator>;

}  // namespace gpipe::host
