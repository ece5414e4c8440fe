#pragma once
// Host memory that ends at an inaccessible page, for the emulated kernel tests: a kernel that
// reads or writes past a buffer's end faults, and the bytes between the end and that page hold
// NaN, which a test checks are unchanged after each kernel.

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gpipe/error.hpp"

namespace gpipe::test {

// Host memory that ends at a PROT_NONE page.
class GuardedBuffer {
 public:
  // `bytes` of data whose first byte is `offset` bytes past a 16-byte boundary.
  GuardedBuffer(std::size_t bytes, std::size_t offset) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t pages = (bytes + offset + 16 + page - 1) / page + 1;
    size_ = pages * page;
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("test: mmap failed");
    base_ = static_cast<unsigned char*>(p);
    unsigned char* guard = base_ + size_ - page;
    if (mprotect(guard, page, PROT_NONE) != 0) throw Error("test: mprotect failed");
    // As close to the guard page as the alignment allows.
    const auto end = reinterpret_cast<std::uintptr_t>(guard);
    data_ = reinterpret_cast<unsigned char*>((end - bytes - offset) / 16 * 16 + offset);
    tail_ = data_ + bytes;
    tail_bytes_ = static_cast<std::size_t>(guard - tail_);
    const float nan = std::nanf("");
    for (std::size_t i = 0; i < tail_bytes_; ++i)
      tail_[i] = reinterpret_cast<const unsigned char*>(&nan)[i % sizeof(float)];
    std::memcpy(tail_copy_, tail_, tail_bytes_);
  }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  ~GuardedBuffer() { munmap(base_, size_); }

  void* data() const { return data_; }
  bool tail_intact() const { return std::memcmp(tail_, tail_copy_, tail_bytes_) == 0; }

 private:
  unsigned char* base_ = nullptr;
  std::size_t size_ = 0;
  unsigned char* data_ = nullptr;
  unsigned char* tail_ = nullptr;
  std::size_t tail_bytes_ = 0;  // < 16 + alignment slack
  unsigned char tail_copy_[64] = {};
};

}  // namespace gpipe::test
