#pragma once
// Backend-neutral memory pieces: the byte accounting every backend's allocator keeps (current,
// peak and an optional capacity, in all and per MemoryKind), Buffer<T, Allocator>, an owning
// handle to one allocation, and DeviceMemory<Allocator>, a backend's allocators with the memory
// members of `gpipe::backend`. An Allocator provides
//   void* allocate(std::size_t bytes, MemoryKind)       (nullptr for 0 bytes; may throw)
//   void deallocate(void*, std::size_t bytes, MemoryKind) noexcept
//   std::size_t device() const

#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

// Thread-safe: a device's memory may be freed by work running for another device.
class MemoryCounter {
 public:
  // `named`: the number the device goes by in messages (a rank's one device is its pipeline
  // device, not 0).
  MemoryCounter(std::size_t device, std::size_t capacity, std::size_t named)
      : device_(device), named_(named) {
    stats_.capacity = capacity;
  }
  MemoryCounter(std::size_t device, std::size_t capacity)
      : MemoryCounter(device, capacity, device) {}

  // Counts `bytes` as in use; throws OutOfMemory (and counts nothing) past the capacity.
  void reserve(std::size_t bytes, MemoryKind kind) {
    std::lock_guard lock(mu_);
    // current <= capacity whenever there is a cap, so the subtraction cannot wrap.
    if (stats_.capacity != 0 && bytes > stats_.capacity - stats_.current)
      throw OutOfMemory("gpipe: out of memory on device " + std::to_string(named_) +
                        ": allocating " + std::to_string(bytes) + " bytes with " +
                        std::to_string(stats_.current) + " in use exceeds the capacity of " +
                        std::to_string(stats_.capacity) + " bytes");
    stats_.current += bytes;
    if (stats_.current > stats_.peak) stats_.peak = stats_.current;
    const auto k = static_cast<std::size_t>(kind);
    stats_.current_by_kind[k] += bytes;
    if (stats_.current_by_kind[k] > stats_.peak_by_kind[k])
      stats_.peak_by_kind[k] = stats_.current_by_kind[k];
  }
  void release(std::size_t bytes, MemoryKind kind) noexcept {
    std::lock_guard lock(mu_);
    stats_.current -= bytes;
    stats_.current_by_kind[static_cast<std::size_t>(kind)] -= bytes;
  }

  MemoryStats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard lock(mu_);
    stats_.peak = stats_.current;
    stats_.peak_by_kind = stats_.current_by_kind;
  }
  std::size_t device() const { return device_; }

 private:
  std::size_t device_;
  std::size_t named_;
  mutable std::mutex mu_;
  MemoryStats stats_;
};

// Owns `size` elements of T on one device (uninitialized). Move-only; empty when size is 0.
template <class T, class Allocator>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& allocator, std::size_t size, MemoryKind kind = MemoryKind::other)
      : allocator_(&allocator),
        data_(static_cast<T*>(allocator.allocate(bytes_of(size, allocator.device()), kind))),
        size_(size),
        kind_(kind) {}
  Buffer(Buffer&& other) noexcept
      : allocator_(std::exchange(other.allocator_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        kind_(other.kind_) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      allocator_ = std::exchange(other.allocator_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      kind_ = other.kind_;
    }
    return *this;
  }
  ~Buffer() { reset(); }

  void reset() noexcept {
    if (allocator_ != nullptr) allocator_->deallocate(data_, size_ * sizeof(T), kind_);
    allocator_ = nullptr;
    data_ = nullptr;
    size_ = 0;
  }

  T* data() const { return data_; }
  MemoryKind kind() const { return kind_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  // size * sizeof(T), or OutOfMemory when that does not fit a size_t.
  static std::size_t bytes_of(std::size_t size, std::size_t device) {
    if (size > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw OutOfMemory("gpipe: out of memory on device " + std::to_string(device) + ": " +
                        std::to_string(size) + " elements of " + std::to_string(sizeof(T)) +
                        " bytes overflow the size of an allocation");
    return size * sizeof(T);
  }

  Allocator* allocator_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryKind kind_ = MemoryKind::other;
};

/// The counted memory of a backend's devices, one Allocator each, and the members of
/// `gpipe::backend` over it: memory_stats, reset_peak, allocate. host::Backend and cuda::Backend
/// derive from it publicly, so that these members and their contracts are stated once; a backend
/// adds each device's allocator as it makes the device, and its devices are those that have one.
/// Being the base, the allocators are made before and destroyed after everything the backend
/// itself holds (streams, queued work), which may still free buffers as it goes.
template <class Allocator>
class DeviceMemory {
 public:
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  /// Bytes `device`'s buffers hold now and at most since the last reset_peak(), in all and per
  /// MemoryKind; what the allocator keeps for reuse (the host's freed blocks, the CUDA pool's
  /// cached ones) and a backend's own scratch (CUDA kernel scratch, staging) are not counted.
  MemoryStats memory_stats(std::size_t device) const { return allocator(device).stats(); }
  /// Sets every device's peaks to its current use, so that memory_stats() then reports the peak
  /// of what follows.
  void reset_peak() {
    for (auto& a : allocators_) a->reset_peak();
  }
  /// `count` uninitialized elements of `T` on `device`, counted under `kind`; throws OutOfMemory
  /// past the device's capacity, or when the device itself (the host, the GPU) has no memory
  /// left. On CUDA, allocation and free are stream-ordered (cuda/memory.cuh).
  template <class T>
  Buffer<T, Allocator> allocate(std::size_t device, std::size_t count,
                                MemoryKind kind = MemoryKind::other) {
    return Buffer<T, Allocator>(allocator(device), count, kind);
  }

 protected:
  DeviceMemory() = default;
  ~DeviceMemory() = default;

  /// Makes the allocator of the next device (device number `devices()`) from `args`.
  template <class... Args>
  void add_device(Args&&... args) {
    allocators_.push_back(std::make_unique<Allocator>(std::forward<Args>(args)...));
  }
  /// The devices added so far.
  std::size_t devices() const { return allocators_.size(); }
  /// Throws gpipe::Error unless `device` is one of the devices added.
  void check_device(std::size_t device) const {
    require(device < allocators_.size(), [&] {
      return "device " + std::to_string(device) + " does not exist; the backend has " +
             std::to_string(allocators_.size()) + " devices";
    });
  }
  Allocator& allocator(std::size_t device) const {
    check_device(device);
    return *allocators_[device];
  }

 private:
  std::vector<std::unique_ptr<Allocator>> allocators_;
};

}  // namespace gpipe::detail
