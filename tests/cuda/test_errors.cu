// Every way a Trainer can fail ends in a gpipe::Error that says what was expected, nothing
// hangs, and device memory and the numbers recover, on the CUDA backend: the backend-conformance
// suite of tests/support/conformance_errors.hpp, with K virtual devices (K streams of one GPU,
// or spread over several); then work stuck on the GPU against BackendOptions::wait_timeout, which
// bounds every wait of the backend.

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpipe/cuda.cuh"
#include "support/conformance_errors.hpp"
#include "support/cuda_factory.cuh"
#include "support/errors.hpp"
#include "support/faulty_layer.hpp"
#include "support/locate_non_finite.hpp"
#include "support/models.hpp"
#include "support/stuck_gpu.cuh"

static_assert(gpipe::layer_for<gpipe::test::FaultyIdentity<8>, gpipe::cuda::Kernels>);

TEST_SUITE_BEGIN("cuda errors");
GPIPE_CONFORMANCE_ERRORS(::gpipe::test::CudaFactory);
TEST_SUITE_END();

TEST_CASE_TEMPLATE(
    "locate_non_finite names the stage, tensor and micro-batch of the first NaN on the CUDA "
    "backend",
    Precision, gpipe::Fp32, gpipe::MixedBf16) {
  gpipe::test::check_locate_non_finite<gpipe::OneFOneB, Precision, gpipe::cuda::Backend>(
      [] { return gpipe::cuda::Backend(3); });
}

namespace gpipe::test::stuck {

using Model = Pipeline<Stage<Linear<4, 8>, HoldingIdentity<8>, ReLU>, Stage<Linear<8, 3>>>;
using StuckTrainer = Trainer<Model, SoftmaxCrossEntropy, cuda::Backend>;

constexpr std::chrono::milliseconds timeout{500};

TEST_CASE(
    "work stuck on the GPU fails synchronize after wait_timeout naming the device, stage and "
    "micro-batch, and once it ends the next step equals a fresh trainer's") {
  const auto x = random_inputs(faulty_batch, 4, 41);
  const auto y = random_classes(faulty_batch, 3, 42);
  const StuckTrainer::Options options{.micro_batches = faulty_micro_batches, .seed = 9};
  for (const bool graphs : {false, true}) {
    CAPTURE(graphs);
    HoldGuard guard;
    cuda::Backend backend(2, {.graphs = graphs, .wait_timeout = timeout});
    StuckTrainer trainer(backend, options);
    // with graphs, the step's first run is issued op by op, its second captured: the third,
    // the held one, replays the graph
    for (int i = 0; i < 2; ++i) {
      CHECK(std::isfinite(trainer.forward_backward(x, y)));
      trainer.zero_grad();
    }
    const std::size_t launches = backend.graph_launches();

    armed = true;
    const auto start = std::chrono::steady_clock::now();
    const std::string message = error_of([&] { trainer.forward_backward(x, y); });
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(held);
    CHECK(contains(message, "within 500 ms (cuda::BackendOptions::wait_timeout)"));
    CHECK(contains(message,
                   "stage 0 (device 0), micro-batch 2, forward has started and not "
                   "finished"));
    CHECK(contains(message, "(device 1)"));  // waits for device 0's hand-over
    CHECK(waited >= timeout);
    if (graphs) CHECK(backend.graph_launches() == launches + 1);

    // The held work runs on once released, before anything submitted later.
    armed = false;
    released = true;
    trainer.zero_grad();
    const float loss = trainer.forward_backward(x, y);
    cuda::Backend fresh_backend(2, {.graphs = graphs});
    StuckTrainer fresh(fresh_backend, options);
    CHECK(fresh.forward_backward(x, y) == loss);
    CHECK(conformance::errors::all_gradients(trainer) == conformance::errors::all_gradients(fresh));
  }
}

TEST_CASE(
    "a backend whose GPU work never ends is destroyed after wait_timeout without waiting for "
    "it") {
  HoldGuard guard;
  const auto x = random_inputs(faulty_batch, 4, 43);
  const auto y = random_classes(faulty_batch, 3, 44);
  {
    cuda::Backend backend(2, {.wait_timeout = timeout});
    StuckTrainer trainer(backend, {.micro_batches = faulty_micro_batches});
    armed = true;
    CHECK_THROWS_AS(trainer.forward_backward(x, y), Error);
    CHECK(held);
  }  // the work is still held: its resources are left to it
  CHECK(!released);
}

// Ends the hold after `after`, so that a wait without a deadline fails the checks of its time
// instead of hanging the test.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds after = std::chrono::seconds(20))
      : thread_([after](std::stop_token stop) {
          const auto until = std::chrono::steady_clock::now() + after;
          while (!stop.stop_requested() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          if (!stop.stop_requested()) released = true;
        }) {}

 private:
  std::jthread thread_;
};

constexpr std::chrono::milliseconds short_timeout{300};
constexpr std::chrono::seconds well_under_watchdog{10};

// How long f() took.
template <class F>
std::chrono::steady_clock::duration time_of(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::steady_clock::now() - start;
}

TEST_CASE(
    "while work is stuck on the GPU take_trace and take_timing fail after wait_timeout naming it, "
    "cancel returns after it, and once it ends the next step equals a fresh trainer's") {
  const auto x = random_inputs(faulty_batch, 4, 45);
  const auto y = random_classes(faulty_batch, 3, 46);
  const StuckTrainer::Options options{.micro_batches = faulty_micro_batches, .seed = 9};
  for (const bool graphs : {false, true}) {
    CAPTURE(graphs);
    HoldGuard guard;
    cuda::Backend backend(2, {.graphs = graphs, .wait_timeout = short_timeout});
    backend.set_tracing(true);
    StuckTrainer trainer(backend, options);
    for (int i = 0; i < 2; ++i) {  // with graphs, the held step replays the second one's graph
      CHECK(std::isfinite(trainer.forward_backward(x, y)));
      trainer.zero_grad();
    }
    (void)backend.take_trace();
    armed = true;
    CHECK_THROWS_AS(trainer.forward_backward(x, y), Error);
    REQUIRE(held);

    Watchdog watchdog;
    for (const std::string_view member : {"take_trace", "take_timing"}) {
      CAPTURE(member);
      std::string message;
      const auto waited = time_of([&] {
        message = error_of([&] {
          if (member == "take_trace")
            (void)backend.take_trace();
          else
            (void)backend.take_timing();
        });
      });
      CHECK(contains(message, std::string(member) +
                                  ": the GPUs have not finished their work within 300 ms "
                                  "(cuda::BackendOptions::wait_timeout)"));
      CHECK(contains(message,
                     "stage 0 (device 0), micro-batch 2, forward has started and not finished"));
      CHECK(waited >= short_timeout);
      CHECK(waited < well_under_watchdog);
    }
    const auto cancelled = time_of([&] { backend.cancel(); });
    CHECK(cancelled >= short_timeout);
    CHECK(cancelled < well_under_watchdog);
    // the next step fails too, at its first wait (the timing it restarts)
    const auto failed = time_of([&] {
      CHECK(contains(error_of([&] { trainer.forward_backward(x, y); }), "within 300 ms"));
    });
    CHECK(failed < well_under_watchdog);
    CHECK(!released);  // every wait ended at its own deadline, not the watchdog's

    armed = false;
    released = true;
    CHECK(!backend.take_trace().empty());  // the held step's ops, now finished
    trainer.zero_grad();
    const float loss = trainer.forward_backward(x, y);
    cuda::Backend fresh_backend(2, {.graphs = graphs});
    StuckTrainer fresh(fresh_backend, options);
    CHECK(fresh.forward_backward(x, y) == loss);
    CHECK(conformance::errors::all_gradients(trainer) == conformance::errors::all_gradients(fresh));
  }
}

TEST_CASE(
    "an upload that waits for a pinned staging block behind work stuck on the GPU fails after "
    "wait_timeout") {
  HoldGuard guard;
  Watchdog watchdog;
  cuda::Backend backend(1, {.graphs = false, .wait_timeout = short_timeout});
  // one more staging block's worth than there are blocks: the last chunk waits for the first's
  const std::size_t n = (cuda::detail::HostStaging::max_blocks + 1) *
                        cuda::detail::HostStaging::block_bytes / sizeof(float);
  const std::vector<float> host(n, 1.0f);
  auto device = backend.allocate<float>(0, n);
  armed = true;
  std::string message;
  const auto waited = time_of([&] {
    backend.submit(0, {.what = "hold"}, [](cuda::Kernels& k) {
      GPIPE_CUDA_CHECK(cudaLaunchHostFunc(k.stream(), &hold, nullptr));
    });
    backend.submit(0, {.what = "upload", .stage = 0, .micro_batch = 1},
                   [&](cuda::Kernels& k) { k.upload(n, host.data(), device.data()); });
    message = error_of([&] { backend.synchronize(); });
  });
  CHECK(held);
  CHECK(contains(message, "stage 0 (device 0), micro-batch 1, upload"));
  CHECK(contains(message,
                 "every pinned staging block of the device is still in use after 300 ms "
                 "(cuda::BackendOptions::wait_timeout)"));
  CHECK(waited >= short_timeout);
  CHECK(waited < well_under_watchdog);
  CHECK(!released);
  armed = false;
  released = true;
  backend.synchronize();  // the failure was taken: the backend goes on
}

TEST_CASE("a wait_timeout that is not positive is an Error") {
  const std::string message =
      error_of([] { cuda::Backend backend(1, {.wait_timeout = std::chrono::milliseconds(0)}); });
  CHECK(contains(message, "wait_timeout must be positive, got 0 ms"));
}

}  // namespace gpipe::test::stuck
