#pragma once
// Per-device memory of the host backend: an allocator with the backends' byte accounting (see
// backend/memory.hpp) over aligned operator new, and Buffer<T>, an owning handle to an
// allocation on one device.

#include <cstddef>
#include <new>
#include <string>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/memory.hpp"
#include "gpipe/error.hpp"

namespace gpipe::host {

// Thread-safe: any worker may free memory that another device's worker allocated.
class DeviceAllocator {
 public:
  static constexpr std::size_t alignment = 64;

  DeviceAllocator(std::size_t device, std::size_t capacity) : counter_(device, capacity) {}
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // Throws OutOfMemory when the allocation would take the device past its capacity.
  void* allocate(std::size_t bytes, MemoryKind kind = MemoryKind::other) {
    if (bytes == 0) return nullptr;
    counter_.reserve(bytes, kind);
    try {
      return ::operator new (bytes, std::align_val_t{alignment});
    } catch (const std::bad_alloc&) {
      counter_.release(bytes, kind);
      throw OutOfMemory("gpipe: the host could not allocate " + std::to_string(bytes) +
                        " bytes for device " + std::to_string(device()));
    }
  }

  void deallocate(void* p, std::size_t bytes, MemoryKind kind = MemoryKind::other) noexcept {
    if (p == nullptr) return;
    ::operator delete (p, std::align_val_t{alignment});
    counter_.release(bytes, kind);
  }

  MemoryStats stats() const { return counter_.stats(); }
  void reset_peak() { counter_.reset_peak(); }
  std::size_t device() const { return counter_.device(); }

 private:
  detail::MemoryCounter counter_;
};

template <class T>
using Buffer = detail::Buffer<T, DeviceAllocator>;

}  // namespace gpipe::host
