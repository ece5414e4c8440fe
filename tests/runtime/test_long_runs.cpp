// What keeps a long run alive: a step whose gradients are not finite skipped under
// Options::skip_non_finite (weights and optimizer state as if it never happened), the gradients
// that went bad named, clip_grad_norm leaving a non-finite norm's gradients alone, skip_step,
// and the SpikeGuard's z-scores.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/locate_non_finite.hpp"
#include "support/models.hpp"

using namespace gpipe;
using namespace gpipe::test;

namespace {

constexpr std::size_t rows = 12, m = 3;

std::vector<float> all_parameters(auto& trainer) {
  std::vector<float> out;
  for (const ParameterInfo& info : trainer.parameter_info())
    for (float v : trainer.parameter(info.name)) out.push_back(v);
  return out;
}

// y = x; its forward holds its device for stuck_ms while `stalled` is set: a device that stops
// sending without failing.
inline std::atomic<bool> stalled{false};
constexpr int stuck_ms = 1500;
struct Stalling : ParameterFree {
  static constexpr std::size_t in_features = 4, out_features = 4;
  static constexpr std::size_t stash_per_row = 0, grad_stash_per_row = 0;
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    if (stalled) std::this_thread::sleep_for(std::chrono::milliseconds(stuck_ms));
    ctx.copy(a.rows * 4, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 4, a.dy, a.dx);
  }
};
using StallingModel = Pipeline<Stage<Linear<4, 4>, Stalling>, Stage<Linear<4, 3>>>;

}  // namespace

TEST_CASE(
    "a device stuck in its work ends the step with an Error naming what the next one "
    "waited for, and the next step runs") {
  const std::vector<float> x = random_inputs(6, 4, 1);
  const std::vector<std::int32_t> y = random_classes(6, 3, 2);
  host::Backend backend(2, {.wait_timeout = std::chrono::milliseconds(200)});
  Trainer<StallingModel, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = 2});
  stalled = true;
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    trainer.forward_backward(x, y);
  } catch (const Error& e) {
    message = e.what();
  }
  stalled = false;
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(message.find("waited 200 ms for stage 0 (device 0), micro-batch 0, send_activation") !=
        std::string::npos);
  CHECK(message.find("wait_timeout") != std::string::npos);
  CHECK(message.find("device 1") != std::string::npos);  // the device that waited
  CHECK(waited >= std::chrono::milliseconds(stuck_ms));  // the stuck work returned first
  CHECK(std::isfinite(trainer.forward_backward(x, y)));
  CHECK_THROWS_AS(host::Backend(1, {.wait_timeout = std::chrono::milliseconds(0)}), Error);
}

TEST_CASE(
    "under skip_non_finite a step with a NaN gradient changes nothing, and the run goes on "
    "as if it never happened") {
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 2);
  std::vector<float> poisoned = x;
  poisoned[5] = std::numeric_limits<float>::quiet_NaN();
  optim::AdamW adamw(optim::AdamW::Options{.lr = 1e-2});

  // a: clean, clean
  host::Backend backend_a(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend, OneFOneB> a(
      backend_a, {.micro_batches = m, .seed = 7, .skip_non_finite = true});
  for (int i = 0; i < 2; ++i) {
    a.forward_backward(x, y);
    a.clip_grad_norm(1.0);
    a.step(adamw);
    a.zero_grad();
  }
  CHECK(a.skipped_steps() == 0);

  // b: clean, poisoned (skipped), clean: the same weights as a, bit for bit
  host::Backend backend_b(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend, OneFOneB> b(
      backend_b, {.micro_batches = m, .seed = 7, .skip_non_finite = true});
  b.forward_backward(x, y);
  b.step(adamw);  // without clip_grad_norm: step() takes the norm itself
  b.zero_grad();
  const std::vector<float> before = all_parameters(b);
  b.forward_backward(poisoned, y);  // the loss may stay finite (a ReLU maps NaN to 0)
  CHECK(std::isnan(b.clip_grad_norm(1.0)));
  const std::vector<std::string> bad = b.non_finite_gradients();
  CHECK_FALSE(bad.empty());
  CHECK(bad.front() == "0.weight");  // the first layer's weight sees the NaN input
  b.step(adamw);
  CHECK(b.last_step_skipped());
  CHECK(b.skipped_steps() == 1);
  CHECK(b.last_step_seconds() >= 0);
  CHECK(all_parameters(b) == before);
  b.zero_grad();
  CHECK(b.non_finite_gradients().empty());
  b.forward_backward(x, y);
  b.clip_grad_norm(1.0);
  b.step(adamw);
  CHECK_FALSE(b.last_step_skipped());
  // a's second step was clipped, b's first was not: compare b with a trainer that took the
  // same clean steps, clipping only the second
  host::Backend backend_c(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend, OneFOneB> c(backend_c,
                                                                  {.micro_batches = m, .seed = 7});
  c.forward_backward(x, y);
  c.step(adamw);
  c.zero_grad();
  c.forward_backward(x, y);
  c.clip_grad_norm(1.0);
  c.step(adamw);
  CHECK(all_parameters(b) == all_parameters(c));
}

TEST_CASE("without skip_non_finite a NaN gradient reaches the weights") {
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 2);
  std::vector<float> poisoned = x;
  poisoned[0] = std::numeric_limits<float>::quiet_NaN();
  host::Backend backend(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = m});
  trainer.forward_backward(poisoned, y);
  trainer.step(optim::SGD(optim::SGD::Options{.lr = 0.1}));
  CHECK_FALSE(trainer.last_step_skipped());
  bool any_nan = false;
  for (float v : trainer.parameter("0.weight")) any_nan = any_nan || std::isnan(v);
  CHECK(any_nan);
}

TEST_CASE("clip_grad_norm leaves the gradients alone when their norm is infinite") {
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 2);
  host::Backend backend(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = m});
  trainer.forward_backward(x, y);
  trainer.scale_gradients(1e30);
  trainer.scale_gradients(1e30);  // every gradient above 1e-22 is now inf in float
  const std::vector<float> huge = trainer.gradient("0.weight");
  const float norm = trainer.clip_grad_norm(1.0);
  CHECK(std::isinf(norm));
  const std::vector<float> after = trainer.gradient("0.weight");
  REQUIRE(after.size() == huge.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK_FALSE(std::isnan(after[i]));  // inf times the old factor 0 would be NaN
    CHECK(after[i] == huge[i]);
  }
  CHECK_FALSE(trainer.non_finite_gradients().empty());
}

TEST_CASE("skip_step ends a step without an update") {
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 2);
  host::Backend backend(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = m});
  const std::vector<float> before = all_parameters(trainer);
  trainer.forward_backward(x, y);
  trainer.skip_step();
  CHECK(trainer.skipped_steps() == 1);
  CHECK(trainer.last_step_skipped());
  CHECK(trainer.last_step_seconds() >= 0);
  CHECK(all_parameters(trainer) == before);
}

TEST_CASE("SpikeGuard: z-scores against the window, spikes kept out of it") {
  optim::SpikeGuard guard({.window = 4, .threshold = 3});
  CHECK(guard.z_score(100) == 0);  // the window is not full yet
  for (double v : {1.0, 2.0, 1.0, 2.0}) guard.add(v);
  // mean 1.5, standard deviation 0.5
  CHECK(guard.z_score(1.5) == doctest::Approx(0));
  CHECK(guard.z_score(3.0) == doctest::Approx(3));
  CHECK_FALSE(guard.is_spike(3.0));
  CHECK(guard.is_spike(3.01));
  CHECK(guard.is_spike(std::numeric_limits<double>::quiet_NaN()));
  CHECK(std::isinf(guard.z_score(std::numeric_limits<double>::infinity())));
  guard.add(std::numeric_limits<double>::quiet_NaN());  // ignored
  CHECK(guard.size() == 4);
  guard.add(1.0);  // the oldest (1.0) leaves: 2, 1, 2, 1
  CHECK(guard.size() == 4);
  CHECK(guard.z_score(1.5) == doctest::Approx(0));
  optim::SpikeGuard flat({.window = 2, .threshold = 1});
  flat.add(1);
  flat.add(1);
  CHECK(flat.z_score(5) == 0);  // no spread to judge by

  CHECK_THROWS_AS(optim::SpikeGuard({.window = 1, .threshold = 3}), Error);
  CHECK_THROWS_AS(optim::SpikeGuard({.window = 8, .threshold = 0}), Error);
  CHECK_THROWS_AS(
      optim::SpikeGuard({.window = 8, .threshold = std::numeric_limits<double>::infinity()}),
      Error);
}

TEST_CASE_TEMPLATE("locate_non_finite names the stage, tensor and micro-batch of the first NaN",
                   Precision, Fp32, MixedBf16) {
  check_locate_non_finite<GPipe, Precision, host::Backend>([] { return host::Backend(3); });
  check_locate_non_finite<OneFOneB, Precision, host::Backend>([] { return host::Backend(3); });
}
