// Optimizer steps on a pipeline equal PyTorch's update rules applied to the unpipelined model's
// gradients, on the host backend: the backend-conformance suite of
// tests/support/conformance_optimizers.hpp; a change of optimizer type restarting the state;
// gradient clipping against torch's clip_grad_norm_ on the double reference; the learning-rate
// schedule; hyperparameter checks; and a training step's wall time (Trainer::last_step_seconds).

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/error.hpp"
#include "gpipe/optim.hpp"
#include "support/conformance_optimizers.hpp"
#include "support/host_factory.hpp"

using gpipe::test::HostFactory;

TEST_CASE_TEMPLATE_INVOKE(conformance_sgd, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_momentum, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_nesterov, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_adamw, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_adamw_matrices, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_adamw_ranges, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_bf16_weights, HostFactory);

TEST_CASE("bad optimizer hyperparameters are a gpipe::Error") {
  using namespace gpipe;
  CHECK_THROWS_AS(optim::SGD({.lr = -1}), Error);
  CHECK_THROWS_AS(optim::SGD({.lr = 0.1, .nesterov = true}), Error);
  CHECK_THROWS_AS(optim::AdamW({.beta1 = 1.0}), Error);
  CHECK_THROWS_AS(optim::AdamW({.beta2 = -0.1}), Error);
  CHECK_THROWS_AS(optim::AdamW({.eps = -1}), Error);
}

TEST_CASE("a step with another optimizer type restarts the state; the same type keeps it") {
  // SGD with momentum twice, AdamW twice, SGD once more: each change of type starts that
  // optimizer's state afresh (its first update), as a new torch.optim object would.
  using namespace gpipe;
  using namespace gpipe::test;
  using conformance::AdamWReference;
  using conformance::SgdReference;
  const optim::SGDOptions sgd_options{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01};
  const optim::AdamWOptions adamw_options{.lr = 0.01};
  const std::vector<float> x = random_inputs(conformance::optimizer_rows, Model3::in_features, 31);
  const std::vector<std::int32_t> y =
      random_classes(conformance::optimizer_rows, L6::out_features, 32);
  host::Backend backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> trainer(backend,
                                                              {.micro_batches = 4, .seed = 5});
  NamedTensors expected = parameters_of(trainer);
  SgdReference sgd(sgd_options), sgd_again(sgd_options);
  AdamWReference adamw(adamw_options);
  // (optimizer, its step count since the state started)
  const struct {
    bool adamw;
    int t;
  } plan[] = {{false, 1}, {false, 2}, {true, 1}, {true, 2}, {false, 1}};
  for (std::size_t i = 0; i < std::size(plan); ++i) {
    CAPTURE(i);
    const ReferenceResult ref = reference_step<Model1, SoftmaxCrossEntropy>(expected, x, y);
    trainer.zero_grad();
    trainer.forward_backward(x, y);
    if (plan[i].adamw) {
      adamw.update(expected, ref.gradients, plan[i].t);
      trainer.step(optim::AdamW(adamw_options));
    } else {
      (i < 2 ? sgd : sgd_again).update(expected, ref.gradients, plan[i].t);
      trainer.step(optim::SGD(sgd_options));
    }
    const NamedTensors got = parameters_of(trainer);
    for (const auto& entry : expected) {
      const std::string& name = entry.first;
      CAPTURE(name);
      CHECK(relative_error(got.at(name), entry.second) < HostFactory::parameter_tolerance);
    }
  }
}

TEST_CASE("last_step_seconds: from a step's first forward_backward to the end of its step()") {
  using namespace gpipe;
  using namespace gpipe::test;
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const std::vector<float> x = random_inputs(8, Model3::in_features, 41);
  const std::vector<std::int32_t> y = random_classes(8, L6::out_features, 42);
  host::Backend backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = 4});
  CHECK_THROWS_WITH_AS((void)trainer.last_step_seconds(),
                       doctest::Contains("no training step has ended yet"), Error);
  const optim::SGD sgd({.lr = 0.01});
  // a pause between forward_backward and step() is in the step
  const Clock::time_point before = Clock::now();
  (void)trainer.forward_backward(x, y);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  trainer.step(sgd);
  const Clock::time_point after = Clock::now();
  const double first = trainer.last_step_seconds();
  CHECK(first >= 0.020);
  CHECK(first <= seconds(before, after));
  CHECK(first >= trainer.last_step().makespan_us / 1e6);
  CHECK(trainer.last_step_seconds() == first);  // asking again measures nothing new
  // zero_grad and a pause before the first forward_backward are not; a pause between two
  // forward_backward calls (gradient accumulation) and clipping are
  trainer.zero_grad();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const Clock::time_point again = Clock::now();
  (void)trainer.forward_backward(x, y);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  (void)trainer.forward_backward(x, y);
  (void)trainer.clip_grad_norm(1.0);
  trainer.step(sgd);
  const double second = trainer.last_step_seconds();
  CHECK(second >= 0.020);
  CHECK(second <= seconds(again, Clock::now()));
}

TEST_CASE("WarmupCosine: linear warmup, half a cosine, then the minimum") {
  using gpipe::optim::WarmupCosine;
  const WarmupCosine lr({.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .total_steps = 12});
  CHECK(lr(0) == doctest::Approx(0.25));  // (0 + 1) / 4 of the way up
  CHECK(lr(1) == doctest::Approx(0.5));
  CHECK(lr(3) == doctest::Approx(1.0));
  CHECK(lr(4) == doctest::Approx(1.0));   // the cosine starts at max_lr
  CHECK(lr(8) == doctest::Approx(0.55));  // half way: the mean of max_lr and min_lr
  CHECK(lr(12) == doctest::Approx(0.1));
  CHECK(lr(1000) == doctest::Approx(0.1));
  for (std::size_t s = 4; s < 12; ++s) CHECK(lr(s + 1) < lr(s));  // decreasing after warmup
  const WarmupCosine no_warmup({.max_lr = 2.0, .min_lr = 0.0, .total_steps = 10});
  CHECK(no_warmup(0) == doctest::Approx(2.0));
  CHECK(no_warmup(5) == doctest::Approx(1.0));
  CHECK_THROWS_AS(WarmupCosine({.max_lr = 0.1, .min_lr = 0.2}), gpipe::Error);
  CHECK_THROWS_AS(WarmupCosine({.warmup_steps = 5, .total_steps = 5}), gpipe::Error);
}

TEST_CASE(
    "clip_grad_norm is torch's clip_grad_norm_ over the whole model, the same for any split") {
  using namespace gpipe;
  using namespace gpipe::test;
  const std::vector<float> x = random_inputs(conformance::optimizer_rows, Model3::in_features, 41);
  const std::vector<std::int32_t> y =
      random_classes(conformance::optimizer_rows, L6::out_features, 42);
  host::Backend three(3), one(1);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> split(three, {.micro_batches = 4, .seed = 5});
  Trainer<Model1, SoftmaxCrossEntropy, host::Backend> whole(one, {.micro_batches = 4, .seed = 5});
  const ReferenceResult ref =
      reference_step<Model1, SoftmaxCrossEntropy>(parameters_of(whole), x, y);
  double squares = 0;
  for (const auto& [name, g] : ref.gradients)
    for (const double v : g) squares += v * v;
  const double ref_norm = std::sqrt(squares);
  split.forward_backward(x, y);
  whole.forward_backward(x, y);
  const NamedTensors before = gradients_of(split);
  REQUIRE(before == gradients_of(whole));  // the same gradients (bit for bit) ...

  // a max_norm above the norm: the norm, and nothing clipped
  const float norm = split.clip_grad_norm(1e30);
  CHECK(norm == doctest::Approx(ref_norm).epsilon(1e-5));
  CHECK(gradients_of(split) == before);
  CHECK(whole.clip_grad_norm(1e30) == norm);  // ... the same norm, whatever the split

  // half the norm: every gradient scaled by max_norm / (norm + 1e-6)
  const double max_norm = ref_norm / 2;
  CHECK(split.clip_grad_norm(max_norm) == norm);
  CHECK(whole.clip_grad_norm(max_norm) == norm);
  const double factor = max_norm / (ref_norm + 1e-6);
  const NamedTensors after = gradients_of(split);
  for (const auto& entry : ref.gradients) {
    const std::string& name = entry.first;
    CAPTURE(name);
    std::vector<double> clipped = entry.second;
    for (double& v : clipped) v *= factor;
    CHECK(relative_error(after.at(name), clipped) < 1e-5);
  }
  CHECK(after == gradients_of(whole));
  CHECK(split.clip_grad_norm(1e30) == doctest::Approx(max_norm).epsilon(1e-5));
  CHECK_THROWS_AS(split.clip_grad_norm(-1.0), Error);
}
