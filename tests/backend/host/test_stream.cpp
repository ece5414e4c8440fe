// Streams and events of the host backend: in-order execution per stream, one worker thread per
// device, cross-stream order by record/wait, and failure handling: the first exception in any
// stream surfaces from synchronize() naming where it happened, every other stream stops (even one
// blocked on an event that will never be recorded), and the backend is usable afterwards.
//
// Ordering is asserted through events and synchronize() only; the few sleeps below make a race
// likely to show up when ordering is broken, never make a passing result depend on timing. The
// wait policies are told apart by the CPU time a 200 ms wait costs the waiting thread, with
// margins that a loaded machine keeps (a spinning wait yields its core, so it may get less of it).

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/host/backend.hpp"
#include "gpipe/error.hpp"
#include "support/errors.hpp"

namespace {

using gpipe::test::contains;

using gpipe::WorkLabel;
using gpipe::host::Backend;
using gpipe::host::WaitPolicy;
using Kernels = Backend::Kernels;
using Event = Backend::Event;

// The message of the gpipe::Error that backend.synchronize() throws, or "" (and a failed check)
// when it throws nothing.
std::string synchronize_error(Backend& backend) {
  try {
    backend.synchronize();
  } catch (const gpipe::Error& e) {
    return e.what();
  }
  FAIL_CHECK("synchronize() did not throw");
  return {};
}

// A backend that runs a trivial piece of work on every device and synchronizes cleanly.
void check_usable(Backend& backend) {
  std::vector<int> ran(backend.num_devices(), 0);
  for (std::size_t d = 0; d < backend.num_devices(); ++d)
    backend.submit(d, {"probe"}, [&ran, d](Kernels&) { ran[d] = 1; });
  CHECK_NOTHROW(backend.synchronize());
  for (std::size_t d = 0; d < backend.num_devices(); ++d) CHECK(ran[d] == 1);
}

// `trials` times: a value written by device 0's slow work, then read by device 1's work after a
// wait for device 0's event, is the value written.
void check_wait_orders(Backend& backend, int trials) {
  for (int trial = 0; trial < trials; ++trial) {
    int value = 0;  // plain int: the event, not an atomic, makes the hand-over safe
    int observed = -1;
    Event ready;
    backend.submit(0, {"slow producer"}, [&value](Kernels&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      value = 42;
    });
    backend.record(0, ready);
    backend.wait(1, ready);
    backend.submit(1, {"consumer"}, [&value, &observed](Kernels&) { observed = value; });
    backend.synchronize();
    CHECK(observed == 42);
  }
}

// Device 1 waits for an event never recorded; device 0's work fails once device 1 has reached
// its wait (or is about to): the failure surfaces naming device 0's work, device 1's work after
// the wait never runs, and the backend runs on.
void check_failure_releases_wait(Backend& backend) {
  std::atomic<bool> waiting{false};
  std::atomic<int> ran_after{0};
  Event never;
  backend.submit(1, {"mark"}, [&waiting](Kernels&) { waiting = true; });
  backend.wait(1, never);
  backend.submit(1, {"after"}, [&ran_after](Kernels&) { ++ran_after; });
  backend.submit(0, {"backward_input", 3, 0}, [&waiting](Kernels&) {
    while (!waiting) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    throw gpipe::Error("gpipe: injected");
  });
  const std::string message = synchronize_error(backend);
  CHECK(contains(message, "stage 3 (device 0), micro-batch 0, backward_input: injected"));
  CHECK(ran_after == 0);
  check_usable(backend);
}

// CPU time of the calling thread, in milliseconds.
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return 1e3 * static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_nsec);
}

// The CPU time device 1's thread spends waiting `wait` for an event that device 0 records after
// sleeping that long: what a device's waiting costs the cores.
double cpu_ms_while_waiting(Backend& backend, std::chrono::milliseconds wait) {
  Event ready;
  double before = 0, after = 0;  // on device 1's thread, around its wait
  backend.submit(0, {"sleep"}, [wait](Kernels&) { std::this_thread::sleep_for(wait); });
  backend.record(0, ready);
  backend.submit(1, {"before"}, [&before](Kernels&) { before = thread_cpu_ms(); });
  backend.wait(1, ready);
  backend.submit(1, {"after"}, [&after](Kernels&) { after = thread_cpu_ms(); });
  backend.synchronize();
  return after - before;
}

}  // namespace

TEST_SUITE("backend host stream") {
  TEST_CASE("work on one stream runs in submission order") {
    Backend backend(1);
    std::vector<int> order;
    for (int i = 0; i < 1000; ++i)
      backend.submit(0, {"push"}, [&order, i](Kernels&) { order.push_back(i); });
    backend.synchronize();
    REQUIRE(order.size() == 1000);
    for (int i = 0; i < 1000; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
  }

  TEST_CASE("each stream hands its work the kernel context of its own device") {
    Backend backend(3);
    std::array<std::size_t, 3> seen{};
    for (std::size_t d = 0; d < 3; ++d)
      backend.submit(d, {"device"}, [&seen, d](Kernels& k) { seen[d] = k.device(); });
    backend.synchronize();
    CHECK(seen == std::array<std::size_t, 3>{0, 1, 2});
  }

  TEST_CASE("work on different streams runs on different threads, none of them the caller's") {
    constexpr std::size_t devices = 4;
    Backend backend(devices);
    std::array<std::set<std::thread::id>, devices> ids;
    for (int round = 0; round < 20; ++round)
      for (std::size_t d = 0; d < devices; ++d)
        backend.submit(d, {"id"},
                       [&ids, d](Kernels&) { ids[d].insert(std::this_thread::get_id()); });
    backend.synchronize();

    std::set<std::thread::id> all;
    for (std::size_t d = 0; d < devices; ++d) {
      CHECK(ids[d].size() == 1);  // one worker per stream, always the same
      all.insert(ids[d].begin(), ids[d].end());
    }
    CHECK(all.size() == devices);
    CHECK(all.count(std::this_thread::get_id()) == 0);
  }

  TEST_CASE("a wait orders work after an event recorded on another stream") {
    Backend backend(2);
    check_wait_orders(backend, 20);
  }

  TEST_CASE("a wait for an event recorded earlier returns at once") {
    Backend backend(2);
    Event ready;
    int value = 0, observed = -1;
    backend.submit(0, {"producer"}, [&value](Kernels&) { value = 7; });
    backend.record(0, ready);
    backend.synchronize();
    backend.wait(1, ready);
    backend.submit(1, {"consumer"}, [&value, &observed](Kernels&) { observed = value; });
    backend.synchronize();
    CHECK(observed == 7);
  }

  TEST_CASE("events chain work across every stream in a ring") {
    constexpr std::size_t devices = 4;
    Backend backend(devices);
    std::vector<std::size_t> order;  // appended by each stream in turn, ordered by the events
    std::vector<Event> events(devices * 3);
    for (std::size_t i = 0; i < events.size(); ++i) {
      const std::size_t d = i % devices;
      if (i > 0) backend.wait(d, events[i - 1]);
      backend.submit(d, {"append"}, [&order, i](Kernels&) { order.push_back(i); });
      backend.record(d, events[i]);
    }
    backend.synchronize();
    REQUIRE(order.size() == events.size());
    for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == i);
  }

  TEST_CASE("an exception in a task surfaces from synchronize() with where it happened") {
    Backend backend(2);
    backend.submit(1, {"forward", 2, 5},
                   [](Kernels&) { throw std::runtime_error("the kernel blew up"); });
    const std::string message = synchronize_error(backend);
    CHECK(contains(message, "stage 2 (device 1), micro-batch 5, forward"));
    CHECK(contains(message, "the kernel blew up"));
    CHECK(message.starts_with("gpipe: "));
    check_usable(backend);
  }

  TEST_CASE("a label without stage or micro-batch names the device and the op") {
    Backend backend(3);
    backend.submit(2, {"optimizer step"}, [](Kernels&) { throw gpipe::Error("gpipe: bad lr"); });
    const std::string message = synchronize_error(backend);
    CHECK(contains(message, "device 2, optimizer step: bad lr"));
    CHECK(!contains(message, "gpipe: gpipe:"));  // the inner prefix is not repeated

    backend.submit(0, {"zero_grad", 1}, [](Kernels&) { throw 42; });
    const std::string unknown = synchronize_error(backend);
    CHECK(contains(unknown, "stage 1 (device 0), zero_grad"));
    CHECK(contains(unknown, "unknown exception"));
  }

  TEST_CASE("only the first failure is reported") {
    Backend backend(2);
    Event first_failed;
    backend.submit(0, {"first", 0, 0}, [](Kernels&) { throw std::runtime_error("first"); });
    backend.record(0, first_failed);  // skipped: released by the failure instead
    backend.wait(1, first_failed);
    backend.submit(1, {"second", 1, 0}, [](Kernels&) { throw std::runtime_error("second"); });
    const std::string message = synchronize_error(backend);
    CHECK(contains(message, "first"));
    CHECK(!contains(message, "second"));
  }

  TEST_CASE("OutOfMemory thrown inside a task stays OutOfMemory after synchronize()") {
    Backend backend(2, {.device_capacity = 64});
    gpipe::host::Buffer<float> held;
    backend.submit(1, {"forward", 1, 3},
                   [&backend, &held](Kernels&) { held = backend.allocate<float>(1, 1000); });
    std::string message;
    try {
      backend.synchronize();
      FAIL("expected gpipe::OutOfMemory");
    } catch (const gpipe::OutOfMemory& e) {
      message = e.what();
    }
    CHECK(contains(message, "stage 1 (device 1), micro-batch 3, forward"));
    CHECK(contains(message, "4000 bytes"));
    CHECK(contains(message, "capacity of 64 bytes"));
    CHECK(held.empty());
    CHECK(backend.memory_stats(1).current == 0);
    check_usable(backend);
  }

  TEST_CASE("after a failure later work on every stream is skipped and blocked waits end") {
    Backend backend(3);
    std::atomic<int> ran_after{0};
    Event after_failure;  // recorded only after the failing task: never recorded
    Event never;          // never recorded by anyone
    backend.submit(0, {"forward", 0, 1}, [](Kernels&) { throw std::runtime_error("injected"); });
    backend.submit(0, {"after"}, [&ran_after](Kernels&) { ++ran_after; });
    backend.record(0, after_failure);
    backend.wait(1, after_failure);
    backend.submit(1, {"after"}, [&ran_after](Kernels&) { ++ran_after; });
    backend.wait(2, never);
    backend.submit(2, {"after"}, [&ran_after](Kernels&) { ++ran_after; });

    const std::string message = synchronize_error(backend);
    CHECK(contains(message, "stage 0 (device 0), micro-batch 1, forward: injected"));
    CHECK(ran_after == 0);

    check_usable(backend);
    // Events work again too.
    Event ready;
    int value = 0, observed = -1;
    backend.submit(2, {"producer"}, [&value](Kernels&) { value = 5; });
    backend.record(2, ready);
    backend.wait(0, ready);
    backend.submit(0, {"consumer"}, [&value, &observed](Kernels&) { observed = value; });
    CHECK_NOTHROW(backend.synchronize());
    CHECK(observed == 5);
  }

  TEST_CASE("a failure releases a stream that was already blocked in an event wait") {
    Backend backend(2);
    check_failure_releases_wait(backend);
  }

  TEST_CASE("cancel() skips pending work and releases waiters, and the backend runs on") {
    Backend backend(2);
    std::atomic<int> ran_after{0};
    Event never;
    backend.wait(0, never);
    backend.submit(0, {"after"}, [&ran_after](Kernels&) { ++ran_after; });
    backend.wait(1, never);
    backend.submit(1, {"after"}, [&ran_after](Kernels&) { ++ran_after; });
    backend.cancel();
    CHECK(ran_after == 0);
    CHECK_NOTHROW(backend.synchronize());  // cancelling is not a failure
    check_usable(backend);
  }

  TEST_CASE("cancel() discards a failure that happened before it") {
    Backend backend(1);
    backend.submit(0, {"boom"}, [](Kernels&) { throw std::runtime_error("boom"); });
    backend.cancel();
    CHECK_NOTHROW(backend.synchronize());
    check_usable(backend);
  }

  TEST_CASE("destroying a backend with a task blocked in an event wait joins cleanly") {
    std::atomic<int> ran_after{0};
    std::atomic<bool> waiting{false};
    {
      Backend backend(3);
      Event never;
      backend.submit(1, {"mark"}, [&waiting](Kernels&) { waiting = true; });
      backend.wait(1, never);
      backend.submit(1, {"after"}, [&ran_after](Kernels&) { ++ran_after; });
      backend.wait(2, never);
      backend.submit(2, {"after"}, [&ran_after](Kernels&) { ++ran_after; });
      while (!waiting) std::this_thread::yield();
    }
    CHECK(ran_after == 0);
  }

  TEST_CASE("destroying a backend with queued work drops the work and frees what it holds") {
    auto counter = std::make_shared<int>(0);
    {
      Backend backend(2);
      Event never;
      backend.wait(0, never);
      for (int i = 0; i < 100; ++i)
        backend.submit(0, {"held"}, [counter](Kernels&) { ++*counter; });
    }
    CHECK(counter.use_count() == 1);  // every captured copy was destroyed
    CHECK(*counter == 0);
  }

  TEST_CASE("many small tasks with cross-stream events all complete (race stress)") {
    constexpr std::size_t devices = 4, rounds = 50, per_round = 50;  // 10k tasks
    Backend backend(devices);
    std::array<std::size_t, devices> counts{};  // each written by its stream only
    std::vector<std::array<std::size_t, devices>> snapshot(rounds);  // [round][device]
    std::vector<std::array<std::size_t, devices>> seen(rounds);      // [round][device]
    std::vector<std::array<Event, devices>> done(rounds);
    std::atomic<std::size_t> total{0};

    for (std::size_t r = 0; r < rounds; ++r) {
      for (std::size_t d = 0; d < devices; ++d) {
        const std::size_t left = (d + devices - 1) % devices;
        if (r > 0) {
          // Reads what the left neighbour published at the end of the previous round.
          backend.wait(d, done[r - 1][left]);
          backend.submit(d, {"read"}, [&seen, &snapshot, r, d, left](Kernels&) {
            seen[r][d] = snapshot[r - 1][left];
          });
        }
        for (std::size_t i = 0; i < per_round; ++i)
          backend.submit(d, {"count", d, r}, [&counts, &total, d](Kernels&) {
            ++counts[d];
            total.fetch_add(1, std::memory_order_relaxed);
          });
        backend.submit(d, {"publish"},
                       [&counts, &snapshot, r, d](Kernels&) { snapshot[r][d] = counts[d]; });
        backend.record(d, done[r][d]);
      }
    }
    backend.synchronize();

    CHECK(total == devices * rounds * per_round);
    for (std::size_t d = 0; d < devices; ++d) CHECK(counts[d] == rounds * per_round);
    for (std::size_t r = 1; r < rounds; ++r)
      for (std::size_t d = 0; d < devices; ++d) CHECK(seen[r][d] == r * per_round);
  }

  TEST_CASE("many steps that fail and recover in turn neither hang nor leak work") {
    Backend backend(4);
    for (int step = 0; step < 200; ++step) {
      std::vector<Event> events(4);
      std::atomic<int> ran{0};
      const std::size_t failing = static_cast<std::size_t>(step) % 4;
      for (std::size_t d = 0; d < 4; ++d) {
        if (d > 0) backend.wait(d, events[d - 1]);
        backend.submit(d, {"forward", d, 0}, [&ran, d, failing](Kernels&) {
          if (d == failing) throw std::runtime_error("fail");
          ++ran;
        });
        backend.record(d, events[d]);
      }
      const std::string message = synchronize_error(backend);
      CHECK(contains(message, "stage " + std::to_string(failing)));
      CHECK(ran == static_cast<int>(failing));  // the stages before the failing one ran
    }
    check_usable(backend);
  }

  TEST_CASE("WaitPolicy::automatic spins exactly where every device has cores of its own") {
    const unsigned cores = gpipe::host::usable_cores();
    REQUIRE(cores > 0);
    CHECK(Backend(1).spins());
    CHECK(Backend(cores).spins());
    CHECK_FALSE(Backend(cores + 1).spins());
    CHECK(Backend(cores, {.threads_per_device = 1}).spins());
    if (cores % 2 == 0) {  // a team of 2 threads per device counts twice
      CHECK(Backend(cores / 2, {.threads_per_device = 2}).spins());
      CHECK_FALSE(Backend(cores / 2 + 1, {.threads_per_device = 2}).spins());
    }
    CHECK(Backend(cores + 1, {.wait = WaitPolicy::spin}).spins());
    CHECK_FALSE(Backend(1, {.wait = WaitPolicy::block}).spins());
    gpipe::test::check_error([] { Backend(1, {.wait = static_cast<WaitPolicy>(7)}); },
                             "wait must be a WaitPolicy");
  }

  TEST_CASE("a spinning wait keeps a core busy and a blocking one frees it") {
    // What the policies promise the cores, not how fast a hand-over is: device 1 waits 200 ms.
    // Spinning, its thread polls the whole time (yielding to any other runnable thread, so a
    // loaded machine may give it less than all of it); blocking, it polls 100 us and sleeps.
    constexpr auto wait = std::chrono::milliseconds(200);
    Backend spinning(2, {.wait = WaitPolicy::spin}), blocking(2, {.wait = WaitPolicy::block});
    CHECK(cpu_ms_while_waiting(spinning, wait) > 50);
    CHECK(cpu_ms_while_waiting(blocking, wait) < 20);
  }

  TEST_CASE(
      "under either wait policy a wait orders work, ends on a failure or a cancel, and "
      "times out naming the work it waited for") {
    for (const WaitPolicy policy : {WaitPolicy::spin, WaitPolicy::block}) {
      CAPTURE(static_cast<int>(policy));
      {  // order
        Backend backend(2, {.wait = policy});
        check_wait_orders(backend, 5);
      }
      {  // a failure on another stream releases the wait, and so does a cancel
        Backend backend(2, {.wait = policy});
        check_failure_releases_wait(backend);
        Event never;
        backend.wait(0, never);
        backend.cancel();
        CHECK_NOTHROW(backend.synchronize());
        check_usable(backend);
      }
      {  // the timeout
        Backend backend(2, {.wait_timeout = std::chrono::milliseconds(50), .wait = policy});
        Event never;
        backend.wait(1, never, {.what = "send_activation", .stage = 4, .micro_batch = 3}, 0);
        const std::string message = synchronize_error(backend);
        CHECK(contains(message,
                       "waited 50 ms for stage 4 (device 0), micro-batch 3, "
                       "send_activation"));
        check_usable(backend);
      }
      {  // a backend destroyed while a stream waits joins it
        std::atomic<bool> waiting{false};
        Backend backend(2, {.wait = policy});
        Event never;
        backend.submit(1, {"mark"}, [&waiting](Kernels&) { waiting = true; });
        backend.wait(1, never);
        while (!waiting) std::this_thread::yield();
      }
    }
  }
}
