// The CUDA backend's own machinery: event order across virtual devices whatever the issue order,
// the stream-ordered allocator (accounting, capacity, frees from another device's stream, reuse
// of freed blocks), failures (stored, later work skipped, rethrown by synchronize with where they
// happened; cancel), tracing, and predict. A Trainer's failures (bad input, out of memory, a layer
// that throws inside a stream) are the error conformance suite's (tests/cuda/test_errors.cu).
// Multi-GPU cases run with at least two GPUs and are skipped otherwise.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpipe/cuda.cuh"
#include "gpipe/gpipe.hpp"  // the host backend, the reference
#include "support/cuda_factory.cuh"
#include "support/errors.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using gpipe::test::contains;
using gpipe::test::error_of;

using gpipe::MemoryKind;
using gpipe::WorkLabel;
using gpipe::cuda::Backend;
using gpipe::cuda::Kernels;

template <class T>
std::vector<T> download(Backend& backend, std::size_t device, const T* p, std::size_t n) {
  std::vector<T> out(n);
  backend.submit(device, {"download"}, [&](Kernels& k) { k.download(n, p, out.data()); });
  backend.synchronize();
  return out;
}

}  // namespace

TEST_SUITE("without a GPU") {
  TEST_CASE("a backend on a machine without a GPU is a gpipe::Error that says so") {
    const std::string message = error_of([] { Backend backend(1); });
    CHECK(contains(message, "gpipe: cuda::Backend needs a CUDA GPU"));
    CHECK(contains(message, "gpipe::host::Backend"));
    CHECK(gpipe::cuda::device_count() == 0);
  }
}

TEST_SUITE("cuda backend") {
  TEST_CASE("a GPU that does not exist is a gpipe::Error that names it") {
    const int count = gpipe::cuda::device_count();
    const std::string message = error_of([&] { Backend backend(2, {.gpus = {0, count}}); });
    CHECK(contains(message, "gpus[1] = " + std::to_string(count) + " is not a GPU"));
    CHECK(contains(error_of([] { Backend backend(2, {.gpus = {0}}); }), "one per device"));
    CHECK(contains(error_of([] { Backend backend(0); }), "at least one device"));
  }

  TEST_CASE("virtual devices map to GPUs round robin by default") {
    const int count = gpipe::cuda::device_count();
    Backend backend(5);
    REQUIRE(backend.num_devices() == 5);
    for (std::size_t d = 0; d < 5; ++d) CHECK(backend.gpu(d) == static_cast<int>(d) % count);
  }

  TEST_CASE("a wait issued before its record still orders the work after the record") {
    // Device 1's program is issued first and begins with a wait for an event that device 0 has
    // not recorded yet: its work must run after device 0's, as on the host backend.
    Backend backend(2);
    const std::size_t n = gpipe::test::ordering_size(1 << 24);  // so that a missing order shows
    auto a = backend.allocate<float>(0, n);
    auto b = backend.allocate<float>(1, n);
    Backend::Event ready;
    std::vector<int> order;
    backend.wait(1, ready);
    backend.submit(1, {"consume"}, [&](Kernels& k) {
      order.push_back(1);
      k.copy(n, a.data(), b.data());
    });
    CHECK(order.empty());  // held back on the host until the record is issued
    backend.submit(0, {"produce"}, [&](Kernels& k) {
      order.push_back(0);
      k.fill(n, 0.0f, a.data());
      for (int i = 0; i < 8; ++i) k.accumulate(n, a.data(), a.data());
      k.fill(n, 5.0f, a.data());
    });
    backend.record(0, ready);
    backend.synchronize();
    CHECK(order == std::vector<int>{0, 1});
    const std::vector<float> got = download(backend, 1, b.data(), n);
    CHECK(got.front() == 5.0f);
    CHECK(got.back() == 5.0f);
  }

  TEST_CASE("events order work across streams, step after step") {
    Backend backend(3);
    const std::size_t n = gpipe::test::ordering_size(1 << 22);
    auto x = backend.allocate<float>(0, n);
    auto y = backend.allocate<float>(1, n);
    auto z = backend.allocate<float>(2, n);
    for (int i = 1; i <= 20; ++i) {
      Backend::Event e01, e12;
      backend.submit(0, {"fill"}, [&](Kernels& k) { k.fill(n, static_cast<float>(i), x.data()); });
      backend.record(0, e01);
      backend.wait(1, e01);
      backend.submit(1, {"double"}, [&](Kernels& k) { k.add(n, x.data(), x.data(), y.data()); });
      backend.record(1, e12);
      backend.wait(2, e12);
      backend.submit(2, {"copy"}, [&](Kernels& k) { k.copy(n, y.data(), z.data()); });
    }
    backend.synchronize();
    const std::vector<float> got = download(backend, 2, z.data(), n);
    CHECK(got.front() == 40.0f);
    CHECK(got[n / 2] == 40.0f);
    CHECK(got.back() == 40.0f);
  }

  TEST_CASE("memory is counted per device and per kind, and capped") {
    Backend backend(2, {.device_capacity = 1 << 20});
    {
      auto p = backend.allocate<float>(0, 1000, MemoryKind::parameters);
      auto a = backend.allocate<float>(0, 500, MemoryKind::activations);
      auto s = backend.allocate<std::int32_t>(1, 10);
      const gpipe::MemoryStats m0 = backend.memory_stats(0);
      CHECK(m0.current == 6000);
      CHECK(m0.capacity == 1 << 20);
      CHECK(m0.current_of(MemoryKind::parameters) == 4000);
      CHECK(m0.current_of(MemoryKind::activations) == 2000);
      CHECK(backend.memory_stats(1).current == 40);
      a.reset();
      CHECK(backend.memory_stats(0).current == 4000);
      CHECK(backend.memory_stats(0).peak == 6000);
      CHECK(backend.memory_stats(0).peak_of(MemoryKind::activations) == 2000);
      backend.reset_peak();
      CHECK(backend.memory_stats(0).peak == 4000);

      const std::string message =
          error_of<gpipe::OutOfMemory>([&] { auto big = backend.allocate<float>(0, 1 << 18); });
      CHECK(contains(message, "out of memory on device 0"));
      CHECK(backend.memory_stats(0).current == 4000);
    }
    CHECK(backend.memory_stats(0).current == 0);
    CHECK(backend.memory_stats(1).current == 0);
  }

  TEST_CASE(
      "a receiver frees the sender's buffer in its own stream order, and the pool reuses "
      "the block safely") {
    // The executor's receive: the sender allocates and fills, the receiver's work allocates its
    // copy, copies and frees the sender's buffer right away. The sender then allocates again at
    // once, and the pool may hand it the freed block: only after the receiver's copy.
    Backend backend(2);
    const std::size_t n = gpipe::test::ordering_size(1 << 22);
    auto sum = backend.allocate<float>(1, n);
    backend.submit(1, {"zero"}, [&](Kernels& k) { k.fill(n, 0.0f, sum.data()); });
    std::vector<Backend::Buffer<float>> sent(50);
    std::vector<Backend::Event> ready(50);
    for (std::size_t i = 0; i < sent.size(); ++i) {
      backend.submit(0, {"send"}, [&, i](Kernels& k) {
        sent[i] = backend.allocate<float>(0, n, MemoryKind::workspace);
        k.fill(n, static_cast<float>(i), sent[i].data());
      });
      backend.record(0, ready[i]);
      backend.wait(1, ready[i]);
      backend.submit(1, {"receive"}, [&, i](Kernels& k) {
        auto mine = backend.allocate<float>(1, n, MemoryKind::workspace);
        gpipe::transport::CudaHandOver::receive(k, sent[i].data(), mine.data(), n);
        sent[i].reset();
        k.accumulate(n, mine.data(), sum.data());
      });
    }
    backend.synchronize();
    CHECK(backend.memory_stats(0).current == 0);
    CHECK(backend.memory_stats(1).current == n * sizeof(float));
    const std::vector<float> got = download(backend, 1, sum.data(), n);
    const float expected = 49.0f * 50.0f / 2.0f;
    CHECK(got.front() == expected);
    CHECK(got[n / 3] == expected);
    CHECK(got.back() == expected);
  }

  TEST_CASE("a failure is stored, later work is skipped, and synchronize rethrows it with where") {
    Backend backend(2);
    int ran = 0;
    backend.submit(0, {"fine"}, [&](Kernels&) { ++ran; });
    backend.submit(1, {.what = "forward", .stage = 1, .micro_batch = 3},
                   [](Kernels&) { throw std::runtime_error("injected"); });
    backend.submit(0, {"skipped"}, [&](Kernels&) { ++ran; });
    const std::string message = error_of([&] { backend.synchronize(); });
    CHECK(message == "gpipe: stage 1 (device 1), micro-batch 3, forward: injected");
    CHECK(ran == 1);

    // The backend runs again after synchronize; OutOfMemory stays OutOfMemory.
    backend.submit(0, {"again"}, [&](Kernels&) { ++ran; });
    backend.synchronize();
    CHECK(ran == 2);
    backend.submit(0, {"allocate"}, [&](Kernels&) {
      throw gpipe::OutOfMemory("gpipe: out of memory on device 0: test");
    });
    const std::string oom = error_of<gpipe::OutOfMemory>([&] { backend.synchronize(); });
    CHECK(oom == "gpipe: device 0, allocate: out of memory on device 0: test");
  }

  TEST_CASE("a wait for an event that is never recorded does not hang") {
    Backend backend(2);
    Backend::Event never;
    int ran = 0;
    backend.wait(1, never);
    backend.submit(1, {"after the wait"}, [&](Kernels&) { ++ran; });
    CHECK(contains(error_of([&] { backend.synchronize(); }), "never recorded"));
    CHECK(ran == 0);

    backend.wait(0, never);
    backend.submit(0, {"after the wait"}, [&](Kernels&) { ++ran; });
    backend.cancel();
    backend.synchronize();
    CHECK(ran == 0);
  }

  TEST_CASE("tracing records every piece of work with its device and label") {
    Backend backend(2);
    const std::size_t n = gpipe::test::ordering_size(1 << 20);
    auto x = backend.allocate<float>(0, n);
    auto y = backend.allocate<float>(1, n);
    backend.set_tracing(true);
    Backend::Event e;
    backend.submit(0, {.what = "forward", .stage = 0, .micro_batch = 0},
                   [&](Kernels& k) { k.fill(n, 1.0f, x.data()); });
    backend.record(0, e);
    backend.wait(1, e);
    backend.submit(1, {.what = "forward", .stage = 1, .micro_batch = 0},
                   [&](Kernels& k) { k.copy(n, x.data(), y.data()); });
    backend.synchronize();
    const std::vector<gpipe::TraceEvent> trace = backend.take_trace();
    REQUIRE(trace.size() == 2);  // event records and waits are not traced
    CHECK(trace[0].device == 0);
    CHECK(trace[1].device == 1);
    CHECK(trace[0].label.stage == 0);
    CHECK(trace[1].label.what == "forward");
    for (const gpipe::TraceEvent& t : trace) {
      CHECK(t.start_us >= 0);
      CHECK(t.end_us >= t.start_us);
    }
    CHECK(trace[1].start_us >= trace[0].end_us - 1.0);  // ordered by the event (1 us slack)
    backend.set_tracing(false);
    backend.submit(0, {"untraced"}, [](Kernels&) {});
    backend.synchronize();
    CHECK(backend.take_trace().empty());
  }

  TEST_CASE("predict runs the pipeline forward on the GPU") {
    using namespace gpipe::test;
    const std::vector<float> x = random_inputs(9, Model3::in_features, 3);
    Backend backend(3);
    gpipe::Trainer<Model3, gpipe::MSELoss, Backend> trainer(backend, {.micro_batches = 4});
    gpipe::host::Backend host_backend(3);
    gpipe::Trainer<Model3, gpipe::MSELoss, gpipe::host::Backend> host(host_backend,
                                                                      {.micro_batches = 4});
    const std::vector<float> got = trainer.predict(x), want = host.predict(x);
    CHECK(relative_error(std::vector<double>(got.begin(), got.end()),
                         std::vector<double>(want.begin(), want.end())) < 1e-5);
  }
}

TEST_SUITE("cuda backend, multi-GPU" * doctest::skip(gpipe::test::fewer_than_two_gpus())) {
  TEST_CASE("copy and receive move data between GPUs") {
    Backend backend(2, {.gpus = {0, 1}});
    const std::size_t n = gpipe::test::ordering_size(1 << 20);
    auto a = backend.allocate<float>(0, n);
    auto b = backend.allocate<float>(1, n);
    auto c = backend.allocate<float>(1, n);
    Backend::Event e;
    backend.submit(0, {"fill"}, [&](Kernels& k) { k.fill(n, 3.0f, a.data()); });
    backend.record(0, e);
    backend.wait(1, e);
    backend.submit(1, {"receive"}, [&](Kernels& k) {
      gpipe::transport::CudaHandOver::receive(k, a.data(), b.data(), n);
      k.copy(n, a.data(), c.data());
    });
    backend.synchronize();
    CHECK(download(backend, 1, b.data(), n) == std::vector<float>(n, 3.0f));
    CHECK(download(backend, 1, c.data(), n) == std::vector<float>(n, 3.0f));
  }

  // A CUDA event belongs to one GPU and may only be recorded there, so the backend makes a new
  // one when an Event moves.
  TEST_CASE("one event recorded on one GPU, then on the other, orders work both times") {
    Backend backend(2, {.gpus = {0, 1}});
    const std::size_t n = gpipe::test::ordering_size(1 << 20);
    auto a = backend.allocate<float>(0, n);
    auto b = backend.allocate<float>(1, n);
    Backend::Event e;
    backend.submit(0, {"fill a"}, [&](Kernels& k) { k.fill(n, 1.0f, a.data()); });
    backend.record(0, e);
    backend.wait(1, e);
    backend.submit(1, {"a to b"}, [&](Kernels& k) {
      gpipe::transport::CudaHandOver::receive(k, a.data(), b.data(), n);
    });
    backend.submit(1, {"double b"}, [&](Kernels& k) { k.add(n, b.data(), b.data(), b.data()); });
    backend.record(1, e);
    backend.wait(0, e);
    backend.submit(0, {"b to a"}, [&](Kernels& k) {
      gpipe::transport::CudaHandOver::receive(k, b.data(), a.data(), n);
    });
    backend.synchronize();
    CHECK(download(backend, 0, a.data(), n) == std::vector<float>(n, 2.0f));
  }
}
