// Per-device memory of the host backend: byte accounting (current, peak, reset_peak), capacity
// enforcement with a gpipe::OutOfMemory that says what did not fit, Buffer's ownership (released
// exactly once across moves), zero-size buffers, and Backend's per-device view of all of it.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/host/backend.hpp"
#include "gpipe/backend/host/memory.hpp"
#include "gpipe/error.hpp"

namespace {

using gpipe::MemoryStats;
using gpipe::host::Backend;
using gpipe::host::Buffer;
using gpipe::host::DeviceAllocator;

void check_stats(const MemoryStats& stats, std::size_t current, std::size_t peak) {
  CHECK(stats.current == current);
  CHECK(stats.peak == peak);
}

}  // namespace

TEST_SUITE("backend host memory") {
  TEST_CASE("a Buffer is move-only") {
    static_assert(!std::is_copy_constructible_v<Buffer<float>>);
    static_assert(!std::is_copy_assignable_v<Buffer<float>>);
    static_assert(std::is_nothrow_move_constructible_v<Buffer<float>>);
    static_assert(std::is_nothrow_move_assignable_v<Buffer<float>>);
    static_assert(!std::is_copy_constructible_v<DeviceAllocator>);
  }

  TEST_CASE("an allocator counts the bytes of live buffers and the peak since the last reset") {
    DeviceAllocator allocator(0, 0);
    check_stats(allocator.stats(), 0, 0);
    CHECK(allocator.stats().capacity == 0);
    {
      Buffer<float> a(allocator, 10);
      check_stats(allocator.stats(), 40, 40);
      {
        Buffer<double> b(allocator, 5);
        check_stats(allocator.stats(), 80, 80);
      }
      check_stats(allocator.stats(), 40, 80);

      allocator.reset_peak();
      check_stats(allocator.stats(), 40, 40);

      Buffer<char> c(allocator, 3);
      check_stats(allocator.stats(), 43, 43);
    }
    check_stats(allocator.stats(), 0, 43);
    allocator.reset_peak();
    check_stats(allocator.stats(), 0, 0);
  }

  TEST_CASE("buffers are aligned, sized and writable") {
    DeviceAllocator allocator(0, 0);
    Buffer<float> b(allocator, 100);
    REQUIRE(b.data() != nullptr);
    CHECK(b.size() == 100);
    CHECK_FALSE(b.empty());
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % DeviceAllocator::alignment == 0);
    for (std::size_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<float>(i);
    CHECK(b.data()[99] == 99.0f);
  }

  TEST_CASE("a freed block serves the next request of its size, counted as a new allocation") {
    DeviceAllocator allocator(0, 0);
    Buffer<float> a(allocator, 1000);
    float* const first = a.data();
    a.reset();
    CHECK(allocator.stats().current == 0);
    Buffer<float> other(allocator, 999);  // another size: a block of its own
    CHECK(other.data() != first);
    Buffer<float> again(allocator, 1000);
    CHECK(again.data() == first);
    CHECK(allocator.stats().current == 1999 * sizeof(float));
    Buffer<float> second(allocator, 1000);  // the cached block is taken: a new one
    CHECK(second.data() != first);
    again.reset();
    second.reset();
    allocator.release_cached();
    CHECK(allocator.stats().current == 999 * sizeof(float));
  }

  TEST_CASE("reset() releases a buffer's bytes once, and a second reset() does nothing") {
    DeviceAllocator allocator(0, 0);
    Buffer<float> b(allocator, 8);
    CHECK(allocator.stats().current == 32);
    b.reset();
    CHECK(b.empty());
    CHECK(b.data() == nullptr);
    CHECK(allocator.stats().current == 0);
    b.reset();
    CHECK(allocator.stats().current == 0);
  }

  TEST_CASE("an allocation past the capacity throws OutOfMemory naming device, request and cap") {
    DeviceAllocator allocator(3, 100);
    CHECK(allocator.stats().capacity == 100);
    CHECK(allocator.device() == 3);
    Buffer<char> held(allocator, 64);
    const MemoryStats before = allocator.stats();

    std::string message;
    try {
      Buffer<char> too_much(allocator, 40);
      FAIL("expected gpipe::OutOfMemory");
    } catch (const gpipe::OutOfMemory& e) {
      message = e.what();
    }
    CHECK(message.find("device 3") != std::string::npos);
    CHECK(message.find("40 bytes") != std::string::npos);
    CHECK(message.find("64") != std::string::npos);  // in use
    CHECK(message.find("capacity of 100 bytes") != std::string::npos);

    const MemoryStats after = allocator.stats();
    CHECK(after.current == before.current);
    CHECK(after.peak == before.peak);
    CHECK(after.capacity == before.capacity);
  }

  TEST_CASE("OutOfMemory is a gpipe::Error and a std::runtime_error") {
    static_assert(std::is_base_of_v<gpipe::Error, gpipe::OutOfMemory>);
    static_assert(std::is_base_of_v<std::runtime_error, gpipe::Error>);
    DeviceAllocator allocator(0, 16);
    CHECK_THROWS_AS(Buffer<float>(allocator, 5), gpipe::Error);
    CHECK_THROWS_AS(Buffer<float>(allocator, 5), std::runtime_error);
    CHECK(allocator.stats().current == 0);
    CHECK(allocator.stats().peak == 0);
  }

  TEST_CASE("an allocation of exactly the remaining capacity succeeds") {
    DeviceAllocator allocator(0, 100);
    Buffer<char> a(allocator, 60);
    Buffer<char> b(allocator, 40);
    check_stats(allocator.stats(), 100, 100);
    CHECK_THROWS_AS(Buffer<char>(allocator, 1), gpipe::OutOfMemory);
    a.reset();
    Buffer<char> c(allocator, 60);
    check_stats(allocator.stats(), 100, 100);
  }

  TEST_CASE("a request whose byte count overflows is OutOfMemory, not a small allocation") {
    DeviceAllocator capped(0, 1024);
    DeviceAllocator uncapped(1, 0);
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    // count * sizeof(float) wraps around to 4 bytes.
    CHECK_THROWS_AS(Buffer<float>(capped, max / 4 + 2), gpipe::OutOfMemory);
    CHECK_THROWS_AS(Buffer<float>(uncapped, max / 4 + 2), gpipe::OutOfMemory);
    // current + bytes wraps around below the capacity.
    Buffer<char> held(capped, 16);
    CHECK_THROWS_AS(capped.allocate(max - 8), gpipe::OutOfMemory);
    check_stats(capped.stats(), 16, 16);
    check_stats(uncapped.stats(), 0, 0);
  }

  TEST_CASE("a moved-from buffer is empty and the bytes are released exactly once") {
    DeviceAllocator allocator(0, 0);
    {
      Buffer<float> a(allocator, 16);
      float* const data = a.data();
      Buffer<float> b(std::move(a));
      CHECK(a.empty());
      CHECK(a.data() == nullptr);
      CHECK(a.size() == 0);
      CHECK(b.data() == data);
      CHECK(b.size() == 16);
      CHECK(allocator.stats().current == 64);
      a.reset();  // nothing to release
      CHECK(allocator.stats().current == 64);
    }
    CHECK(allocator.stats().current == 0);
  }

  TEST_CASE("move assignment releases the target's old bytes and takes the source's") {
    DeviceAllocator allocator(0, 0);
    Buffer<float> a(allocator, 4);    // 16 bytes
    Buffer<float> b(allocator, 100);  // 400 bytes
    CHECK(allocator.stats().current == 416);
    float* const data = a.data();
    b = std::move(a);
    CHECK(allocator.stats().current == 16);
    CHECK(b.data() == data);
    CHECK(b.size() == 4);
    CHECK(a.empty());

    Buffer<float>& alias = b;
    b = std::move(alias);  // self-move keeps the buffer
    CHECK(b.data() == data);
    CHECK(allocator.stats().current == 16);

    b = Buffer<float>();
    CHECK(b.empty());
    CHECK(allocator.stats().current == 0);
  }

  TEST_CASE("a buffer moved between allocators returns its bytes to the allocator it came from") {
    DeviceAllocator zero(0, 0), one(1, 0);
    Buffer<float> a(zero, 10);
    Buffer<float> b(one, 20);
    b = std::move(a);
    CHECK(zero.stats().current == 40);
    CHECK(one.stats().current == 0);
    b.reset();
    CHECK(zero.stats().current == 0);
  }

  TEST_CASE("a zero-size buffer is empty, takes no bytes and fits even a full device") {
    DeviceAllocator allocator(0, 8);
    Buffer<double> full(allocator, 1);
    Buffer<float> none(allocator, 0);
    CHECK(none.empty());
    CHECK(none.size() == 0);
    CHECK(none.data() == nullptr);
    check_stats(allocator.stats(), 8, 8);
    Buffer<float> moved(std::move(none));
    moved.reset();
    check_stats(allocator.stats(), 8, 8);

    const Buffer<int> default_constructed;
    CHECK(default_constructed.empty());
    CHECK(default_constructed.data() == nullptr);
  }

  TEST_CASE("a backend's devices count their memory independently") {
    Backend backend(3);
    CHECK(backend.num_devices() == 3);
    for (std::size_t d = 0; d < 3; ++d) {
      check_stats(backend.memory_stats(d), 0, 0);
      CHECK(backend.memory_stats(d).capacity == 0);
    }
    auto a = backend.allocate<float>(0, 10);
    auto b = backend.allocate<float>(2, 25);
    check_stats(backend.memory_stats(0), 40, 40);
    check_stats(backend.memory_stats(1), 0, 0);
    check_stats(backend.memory_stats(2), 100, 100);

    a.reset();
    check_stats(backend.memory_stats(0), 0, 40);
    check_stats(backend.memory_stats(2), 100, 100);

    backend.reset_peak();
    check_stats(backend.memory_stats(0), 0, 0);
    check_stats(backend.memory_stats(1), 0, 0);
    check_stats(backend.memory_stats(2), 100, 100);
  }

  TEST_CASE("a backend constructed with a device capacity caps every device separately") {
    Backend backend(2, {.device_capacity = 256});
    CHECK(backend.memory_stats(0).capacity == 256);
    CHECK(backend.memory_stats(1).capacity == 256);
    auto a = backend.allocate<float>(0, 64);  // all of device 0
    auto b = backend.allocate<float>(1, 64);  // all of device 1: the cap is per device
    check_stats(backend.memory_stats(0), 256, 256);
    check_stats(backend.memory_stats(1), 256, 256);

    std::string message;
    try {
      (void)backend.allocate<float>(1, 1);
      FAIL("expected gpipe::OutOfMemory");
    } catch (const gpipe::OutOfMemory& e) {
      message = e.what();
    }
    CHECK(message.find("device 1") != std::string::npos);
    CHECK(message.find("4 bytes") != std::string::npos);
    CHECK(message.find("256") != std::string::npos);
    check_stats(backend.memory_stats(1), 256, 256);

    a.reset();
    auto c = backend.allocate<float>(0, 64);
    check_stats(backend.memory_stats(0), 256, 256);
  }

  TEST_CASE("allocating on or asking about a device the backend does not have is a gpipe::Error") {
    Backend backend(2);
    std::string message;
    try {
      (void)backend.allocate<float>(2, 1);
      FAIL("expected gpipe::Error");
    } catch (const gpipe::Error& e) {
      message = e.what();
    }
    CHECK(message.find("device 2") != std::string::npos);
    CHECK(message.find("2 devices") != std::string::npos);
    CHECK_THROWS_AS((void)backend.memory_stats(7), gpipe::Error);
    CHECK_THROWS_AS((void)backend.allocate<float>(static_cast<std::size_t>(-1), 1), gpipe::Error);
    check_stats(backend.memory_stats(0), 0, 0);
    check_stats(backend.memory_stats(1), 0, 0);
  }

  TEST_CASE("a backend needs at least one device") { CHECK_THROWS_AS(Backend(0), gpipe::Error); }

  TEST_CASE("buffers freed on another thread than the one that allocated them are counted") {
    Backend backend(2);
    auto a = backend.allocate<float>(0, 32);
    // Device 1's worker frees device 0's buffer, as the executor does after a transfer.
    backend.submit(1, {"free"}, [&a](Backend::Kernels&) { a.reset(); });
    backend.synchronize();
    check_stats(backend.memory_stats(0), 0, 128);
  }
}
