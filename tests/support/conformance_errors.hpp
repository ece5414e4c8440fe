#pragma once
// Backend conformance, part 4: every way a Trainer can fail ends in a gpipe::Error on the
// caller's thread that says what was expected: bad inputs and targets, bad options, unknown
// parameters, bad files, device memory that is too small, and a user layer that throws inside a
// stream. Nothing hangs, device memory returns to the parameter + gradient baseline after every
// step, and after a failed step the trainer computes the same numbers as a fresh one.
//
// Written once, instantiated per backend with a factory (tests/runtime/test_errors.cpp for the
// host backend, tests/cuda/test_errors.cu for the CUDA backend):
//
//   struct Factory {
//     using backend_type = ...;
//     static backend_type make(std::size_t devices);
//     static backend_type make_capped(std::size_t devices, std::size_t bytes_per_device);
//   };
//   GPIPE_CONFORMANCE_ERRORS(::Factory);   // at global scope: invokes every case below

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/model.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "support/errors.hpp"
#include "support/faulty_layer.hpp"
#include "support/models.hpp"
#include "support/temp_path.hpp"

namespace gpipe::test::conformance::errors {

using Model = Pipeline<Stage<Linear<4, 8>, ReLU>, Stage<Linear<8, 3>>>;

// Stage 1 is far larger than stage 0, so under one cap per device only device 1 runs out.
using Wide = Pipeline<Stage<Linear<4, 4>>, Stage<Linear<4, 64>, ReLU, Linear<64, 3>>>;
// Bytes of stage 1's parameters and gradients.
inline constexpr std::size_t wide_stage1_bytes = 2 * sizeof(float) * Wide::stage_num_params[1];

// The trainers of the cases, on the factory's backend.
template <class Factory>
struct Types {
  using Backend = typename Factory::backend_type;
  using Classifier = Trainer<Model, SoftmaxCrossEntropy, Backend>;
  using Regressor = Trainer<Model, MSELoss, Backend>;
  using WideTrainer = Trainer<Wide, SoftmaxCrossEntropy, Backend>;
  using FaultyTrainer = Trainer<FaultyModel, SoftmaxCrossEntropy, Backend>;
};

// Current bytes on each device of the backend.
template <class Backend>
std::vector<std::size_t> current_bytes(const Backend& backend) {
  std::vector<std::size_t> out;
  for (std::size_t d = 0; d < backend.num_devices(); ++d)
    out.push_back(backend.memory_stats(d).current);
  return out;
}

// Every gradient of the trainer, in parameter_info() order.
template <class T>
std::vector<std::vector<float>> all_gradients(const T& trainer) {
  std::vector<std::vector<float>> out;
  for (const auto& info : trainer.parameter_info()) out.push_back(trainer.gradient(info.name));
  return out;
}

// Resets injected_fault when a test case ends, however it ends.
struct FaultGuard {
  ~FaultGuard() { injected_fault = Fault::none; }
};

TEST_CASE_TEMPLATE_DEFINE("inputs of the wrong size are rejected with what was expected", Factory,
                          conformance_errors_inputs) {
  auto backend = Factory::make(2);
  typename Types<Factory>::Classifier trainer(backend, {.micro_batches = 2});
  const auto baseline = current_bytes(backend);
  const auto x = random_inputs(4, 4, 1);
  const auto y = random_classes(4, 3, 2);

  SUBCASE("x whose length is not a multiple of in_features") {
    const std::string message =
        error_of([&] { trainer.forward_backward(std::span(x).first(7), y); });
    CHECK(contains(message, "x has 7 floats"));
    CHECK(contains(message, "in_features = 4"));
  }
  SUBCASE("a batch smaller than micro_batches") {
    const std::string message =
        error_of([&] { trainer.forward_backward(std::span(x).first(4), std::span(y).first(1)); });
    CHECK(contains(message, "1 rows"));
    CHECK(contains(message, "micro_batches = 2"));
  }
  SUBCASE("an empty batch") {
    const std::string message =
        error_of([&] { trainer.forward_backward({}, std::span<const std::int32_t>{}); });
    CHECK(contains(message, "0 rows"));
  }
  SUBCASE("class ids of the wrong length") {
    const std::string message =
        error_of([&] { trainer.forward_backward(x, std::span(y).first(3)); });
    CHECK(contains(message, "y has 3 targets, expected 4"));
  }
  SUBCASE("a negative class id") {
    auto bad = y;
    bad[1] = -1;
    const std::string message = error_of([&] { trainer.forward_backward(x, bad); });
    CHECK(contains(message, "target 1 is -1"));
    CHECK(contains(message, "[0, 3)"));
  }
  SUBCASE("a class id equal to the number of classes") {
    auto bad = y;
    bad[3] = 3;
    const std::string message = error_of([&] { trainer.forward_backward(x, bad); });
    CHECK(contains(message, "target 3 is 3"));
    CHECK(contains(message, "[0, 3)"));
  }
  // A rejected call issues nothing: no memory held and no gradient accumulated.
  CHECK(current_bytes(backend) == baseline);
  for (const auto& g : all_gradients(trainer))
    for (float v : g) CHECK(v == 0.0f);
}

TEST_CASE_TEMPLATE_DEFINE("MSE targets of the wrong length are rejected with the expected count",
                          Factory, conformance_errors_mse_targets) {
  auto backend = Factory::make(2);
  typename Types<Factory>::Regressor trainer(backend, {.micro_batches = 2});
  const auto x = random_inputs(2, 4, 3);
  const auto y = random_inputs(2, 3, 4);
  CHECK(std::isfinite(trainer.forward_backward(x, y)));
  const std::string short_y = error_of([&] { trainer.forward_backward(x, std::span(y).first(5)); });
  CHECK(contains(short_y, "y has 5 targets, expected 6 (2 rows x 3)"));
  const std::vector<float> long_y(7, 0.0f);
  const std::string long_message = error_of([&] { trainer.forward_backward(x, long_y); });
  CHECK(contains(long_message, "y has 7 targets, expected 6"));
}

TEST_CASE_TEMPLATE_DEFINE(
    "bad options and a backend too small for the model are rejected at construction", Factory,
    conformance_errors_construction) {
  using Classifier = typename Types<Factory>::Classifier;
  SUBCASE("zero micro-batches") {
    auto backend = Factory::make(2);
    const std::string message =
        error_of([&] { Classifier trainer(backend, {.micro_batches = 0}); });
    CHECK(contains(message, "micro_batches"));
    CHECK(contains(message, "at least 1"));
    CHECK(current_bytes(backend) == std::vector<std::size_t>{0, 0});
  }
  SUBCASE("fewer devices than stages") {
    auto backend = Factory::make(1);
    const std::string message = error_of([&] { Classifier trainer(backend, {}); });
    CHECK(contains(message, "2 stages"));
    CHECK(contains(message, "only 1"));
    CHECK(backend.memory_stats(0).current == 0);
  }
}

TEST_CASE_TEMPLATE_DEFINE("unknown parameter names and wrong sizes are rejected by name", Factory,
                          conformance_errors_parameter_names) {
  auto backend = Factory::make(2);
  typename Types<Factory>::Classifier trainer(backend, {});
  const std::vector<float> values(3, 1.0f);
  for (const std::string name : {"9.weight", "1.weight", "0.weights", ""}) {
    CAPTURE(name);
    CHECK(contains(error_of([&] { (void)trainer.parameter(name); }),
                   "no parameter \"" + name + "\""));
    CHECK(
        contains(error_of([&] { (void)trainer.gradient(name); }), "no parameter \"" + name + "\""));
    CHECK(contains(error_of([&] { trainer.set_parameter(name, values); }),
                   "no parameter \"" + name + "\""));
  }
  const auto before = trainer.parameter("0.weight");
  const std::string message = error_of([&] { trainer.set_parameter("0.weight", values); });
  CHECK(contains(message, "\"0.weight\" has 32 elements, got 3"));
  CHECK(trainer.parameter("0.weight") == before);
}

TEST_CASE_TEMPLATE_DEFINE("load() rejects a bad file and leaves the parameters as they were",
                          Factory, conformance_errors_load) {
  auto backend = Factory::make(2);
  typename Types<Factory>::Classifier trainer(backend, {.seed = 7});
  typename Types<Factory>::Classifier source(backend, {.seed = 8});  // same names and shapes
  const auto before = trainer.parameter("2.weight");
  TempPath file("gpipe_test_errors");

  SUBCASE("a missing file") {
    const std::string message = error_of([&] { trainer.load(file.path()); });
    CHECK(contains(message, file.path().string()));
    CHECK(contains(message, "no such file"));
  }
  SUBCASE("a file lacking a tensor") {
    const auto w0 = source.parameter("0.weight"), b0 = source.parameter("0.bias"),
               w2 = source.parameter("2.weight");
    const std::vector<io::TensorView> tensors = {
        {"0.weight", {8, 4}, w0}, {"0.bias", {8}, b0}, {"2.weight", {3, 8}, w2}};
    io::save_safetensors(file.path(), tensors);
    const std::string message = error_of([&] { trainer.load(file.path()); });
    CHECK(contains(message, file.path().string()));
    CHECK(contains(message, "no tensor \"2.bias\""));
  }
  SUBCASE("a tensor of the wrong shape") {
    const auto w0 = source.parameter("0.weight"), b0 = source.parameter("0.bias"),
               w2 = source.parameter("2.weight"), b2 = source.parameter("2.bias");
    const std::vector<io::TensorView> tensors = {{"0.weight", {4, 8}, w0},
                                                 {"0.bias", {8}, b0},
                                                 {"2.weight", {3, 8}, w2},
                                                 {"2.bias", {3}, b2}};
    io::save_safetensors(file.path(), tensors);
    const std::string message = error_of([&] { trainer.load(file.path()); });
    CHECK(contains(message, "\"0.weight\" has shape [4, 8], the model expects [8, 4]"));
  }
  SUBCASE("an extra tensor") {
    source.save(file.path());
    auto tensors = io::load_safetensors(file.path());
    std::vector<io::TensorView> views;
    for (const auto& [name, tensor] : tensors) views.push_back({name, tensor.shape, tensor.data});
    const std::vector<float> extra = {1.0f, 2.0f};
    views.push_back({"4.weight", {2}, extra});
    io::save_safetensors(file.path(), views);
    const std::string message = error_of([&] { trainer.load(file.path()); });
    CHECK(contains(message, "tensor \"4.weight\" that the model does not have"));
  }
  CHECK(trainer.parameter("2.weight") == before);

  // And a good file loads.
  source.save(file.path());
  trainer.load(file.path());
  CHECK(trainer.parameter("2.weight") == source.parameter("2.weight"));
}

TEST_CASE_TEMPLATE_DEFINE("a device too small for the parameters is OutOfMemory at construction",
                          Factory, conformance_errors_oom_parameters) {
  auto backend = Factory::make_capped(2, 64);  // stage 0 alone has 40 floats = 160 bytes
  const std::string message =
      error_of<OutOfMemory>([&] { typename Types<Factory>::Classifier trainer(backend, {}); });
  CHECK(contains(message, "device 0"));
  CHECK(contains(message, "capacity of 64 bytes"));
  CHECK(current_bytes(backend) == std::vector<std::size_t>{0, 0});
}

TEST_CASE_TEMPLATE_DEFINE(
    "a device too small for the activations is OutOfMemory naming the stage and device", Factory,
    conformance_errors_oom_activations) {
  constexpr std::size_t micro_batches = 2;
  // Parameters and gradients of stage 1, the loss of each micro-batch, 8 bytes to spare.
  constexpr std::size_t capacity = wide_stage1_bytes + 4 * micro_batches + 8;
  auto backend = Factory::make_capped(2, capacity);
  typename Types<Factory>::WideTrainer trainer(backend, {.micro_batches = micro_batches});
  const auto baseline = current_bytes(backend);
  const auto x = random_inputs(4, 4, 5);
  const auto y = random_classes(4, 3, 6);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::string message = error_of<OutOfMemory>([&] { trainer.forward_backward(x, y); });
    CHECK(contains(message, "stage 1 (device 1), micro-batch 0"));
    CHECK(contains(message, "out of memory on device 1"));
    CHECK(contains(message, "capacity of " + std::to_string(capacity) + " bytes"));
    CHECK(current_bytes(backend) == baseline);
  }
}

TEST_CASE_TEMPLATE_DEFINE(
    "a device too small for the step's losses is OutOfMemory before any work is issued", Factory,
    conformance_errors_oom_losses) {
  // Device 1 is exactly full with its parameters and gradients.
  auto backend = Factory::make_capped(2, wide_stage1_bytes);
  typename Types<Factory>::WideTrainer trainer(backend, {.micro_batches = 2});
  const auto baseline = current_bytes(backend);
  const auto x = random_inputs(4, 4, 7);
  const auto y = random_classes(4, 3, 8);
  const std::string message = error_of<OutOfMemory>([&] { trainer.forward_backward(x, y); });
  CHECK(contains(message, "out of memory on device 1"));
  CHECK(current_bytes(backend) == baseline);
  trainer.zero_grad();  // the backend still runs work
  for (const auto& g : all_gradients(trainer))
    for (float v : g) CHECK(v == 0.0f);
}

TEST_CASE_TEMPLATE_DEFINE(
    "a user layer that throws in a stream fails the step naming stage, device, micro-batch",
    Factory, conformance_errors_user_layer_step) {
  using FaultyTrainer = typename Types<Factory>::FaultyTrainer;
  FaultGuard guard;
  const auto x = random_inputs(faulty_batch, 4, 11);
  const auto y = random_classes(faulty_batch, 3, 12);
  for (const Remat remat : {Remat::never, Remat::always, Remat::except_last}) {
    for (const Fault fault : {Fault::forward, Fault::backward_input}) {
      CAPTURE(to_string(remat));
      CAPTURE(fault == Fault::forward ? "forward" : "backward_input");
      const typename FaultyTrainer::Options options{
          .micro_batches = faulty_micro_batches, .remat = remat, .seed = 3};
      auto backend = Factory::make(3);
      FaultyTrainer trainer(backend, options);
      const auto baseline = current_bytes(backend);

      // A good step first: memory returns to the baseline after success too.
      injected_fault = Fault::none;
      CHECK(std::isfinite(trainer.forward_backward(x, y)));
      CHECK(current_bytes(backend) == baseline);

      injected_fault = fault;
      const std::string message = error_of([&] { trainer.forward_backward(x, y); });
      CHECK(contains(message, "stage 1 (device 1), micro-batch 2"));
      if (fault == Fault::forward) {
        CHECK(contains(message, "forward: injected forward failure"));
      } else {
        CHECK(contains(message, "backward_input: injected backward failure"));
      }
      CHECK(current_bytes(backend) == baseline);

      // Recovery: the same numbers as a fresh trainer with the same seed.
      injected_fault = Fault::none;
      trainer.zero_grad();
      const float loss = trainer.forward_backward(x, y);
      CHECK(std::isfinite(loss));
      CHECK(current_bytes(backend) == baseline);

      auto fresh_backend = Factory::make(3);
      FaultyTrainer fresh(fresh_backend, options);
      CHECK(fresh.forward_backward(x, y) == loss);
      CHECK(all_gradients(trainer) == all_gradients(fresh));
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE(
    "a user layer that throws during predict() fails naming stage and micro-batch", Factory,
    conformance_errors_user_layer_predict) {
  using FaultyTrainer = typename Types<Factory>::FaultyTrainer;
  FaultGuard guard;
  const typename FaultyTrainer::Options options{.micro_batches = faulty_micro_batches, .seed = 5};
  auto backend = Factory::make(3);
  FaultyTrainer trainer(backend, options);
  const auto baseline = current_bytes(backend);
  const auto x = random_inputs(faulty_batch, 4, 31);

  injected_fault = Fault::forward;
  const std::string message = error_of([&] { (void)trainer.predict(x); });
  CHECK(contains(message, "stage 1 (device 1), micro-batch 2"));
  CHECK(contains(message, "injected forward failure"));
  CHECK(current_bytes(backend) == baseline);

  injected_fault = Fault::none;
  const auto out = trainer.predict(x);
  CHECK(current_bytes(backend) == baseline);
  auto fresh_backend = Factory::make(3);
  FaultyTrainer fresh(fresh_backend, options);
  CHECK(out == fresh.predict(x));

  const std::string empty = error_of([&] { (void)trainer.predict({}); });
  CHECK(contains(empty, "x has 0 floats"));
}

TEST_CASE_TEMPLATE_DEFINE(
    "a failure in a stream leaves memory peak and current where a step leaves them", Factory,
    conformance_errors_failure_memory) {
  FaultGuard guard;
  auto backend = Factory::make(3);
  typename Types<Factory>::FaultyTrainer trainer(backend, {.micro_batches = faulty_micro_batches});
  const auto baseline = current_bytes(backend);
  const auto x = random_inputs(faulty_batch, 4, 21);
  const auto y = random_classes(faulty_batch, 3, 22);
  for (int step = 0; step < 20; ++step) {
    injected_fault = step % 2 == 0 ? Fault::forward : Fault::backward_input;
    CHECK_THROWS_AS(trainer.forward_backward(x, y), Error);
    CHECK(current_bytes(backend) == baseline);
    injected_fault = Fault::none;
    CHECK(std::isfinite(trainer.forward_backward(x, y)));
    CHECK(current_bytes(backend) == baseline);
  }
}

}  // namespace gpipe::test::conformance::errors

// Every case above for one backend factory (named from the global namespace), at namespace
// scope. The invocations sit in the namespace of the definitions, where doctest's names are.
#define GPIPE_CONFORMANCE_ERRORS(Factory)                                    \
  namespace gpipe::test::conformance::errors {                               \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_inputs, Factory);             \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_mse_targets, Factory);        \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_construction, Factory);       \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_parameter_names, Factory);    \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_load, Factory);               \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_oom_parameters, Factory);     \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_oom_activations, Factory);    \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_oom_losses, Factory);         \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_user_layer_step, Factory);    \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_user_layer_predict, Factory); \
  TEST_CASE_TEMPLATE_INVOKE(conformance_errors_failure_memory, Factory);     \
  }                                                                          \
  static_assert(true, "a semicolon after GPIPE_CONFORMANCE_ERRORS(...)")
