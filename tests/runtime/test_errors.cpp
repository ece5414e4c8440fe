// Every way a Trainer can fail ends in a gpipe::Error on the caller's thread that says what was
// expected: bad inputs and targets, bad options, unknown parameters, bad files, device memory
// that is too small, and a user layer that throws inside a stream. Nothing hangs, device memory
// returns to the parameter + gradient baseline after every step, and after a failed step the
// trainer computes the same numbers as a fresh one.

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/error.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/linear.hpp"
#include "gpipe/model/loss.hpp"
#include "gpipe/model/pipeline.hpp"
#include "gpipe/model/stage.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "support/errors.hpp"
#include "support/faulty_layer.hpp"

namespace {

using gpipe::test::contains;
using gpipe::test::error_of;

namespace fs = std::filesystem;
using gpipe::host::Backend;

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 8>, gpipe::ReLU>,
                              gpipe::Stage<gpipe::Linear<8, 3>>>;
using Classifier = gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, Backend>;
using Regressor = gpipe::Trainer<Model, gpipe::MSELoss, Backend>;

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (float& v : out) v = dist(gen);
  return out;
}

std::vector<std::int32_t> random_classes(std::size_t n, std::int32_t classes, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, classes - 1);
  std::vector<std::int32_t> out(n);
  for (auto& v : out) v = dist(gen);
  return out;
}

// Current bytes on each device of the backend.
std::vector<std::size_t> current_bytes(const Backend& backend) {
  std::vector<std::size_t> out;
  for (std::size_t d = 0; d < backend.num_devices(); ++d)
    out.push_back(backend.memory_stats(d).current);
  return out;
}

// A unique path under the system temp directory, removed on destruction.
class TempFile {
 public:
  TempFile() {
    static std::atomic<unsigned> counter{0};
    path_ = fs::temp_directory_path() /
            ("gpipe_test_runtime_errors_" + std::to_string(std::random_device{}()) + "_" +
             std::to_string(counter++) + ".safetensors");
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

using gpipe::test::Fault;
using gpipe::test::faulty_batch;
using gpipe::test::faulty_micro_batches;
using gpipe::test::FaultyIdentity;
using gpipe::test::FaultyModel;
using gpipe::test::injected_fault;
static_assert(gpipe::layer_for<FaultyIdentity<8>, gpipe::host::Kernels<float>>);

using FaultyTrainer = gpipe::Trainer<FaultyModel, gpipe::SoftmaxCrossEntropy, Backend>;

// Every gradient of the trainer, in parameter_info() order.
template <class T>
std::vector<std::vector<float>> all_gradients(const T& trainer) {
  std::vector<std::vector<float>> out;
  for (const auto& info : trainer.parameter_info()) out.push_back(trainer.gradient(info.name));
  return out;
}

// Stage 1 is far larger than stage 0, so under one cap per device only device 1 runs out.
using Wide = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 4>>,
                             gpipe::Stage<gpipe::Linear<4, 64>, gpipe::ReLU, gpipe::Linear<64, 3>>>;
using WideTrainer = gpipe::Trainer<Wide, gpipe::SoftmaxCrossEntropy, Backend>;
// Bytes of stage 1's parameters and gradients.
constexpr std::size_t wide_stage1_bytes = 2 * sizeof(float) * Wide::stage_num_params[1];

// Resets injected_fault when a test case ends, however it ends.
struct FaultGuard {
  ~FaultGuard() { injected_fault = Fault::none; }
};

}  // namespace

TEST_SUITE("runtime errors") {
  TEST_CASE("inputs of the wrong size are rejected with what was expected") {
    Backend backend(2);
    Classifier trainer(backend, {.micro_batches = 2});
    const auto baseline = current_bytes(backend);
    const auto x = random_floats(4 * 4, 1);
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

  TEST_CASE("MSE targets of the wrong length are rejected with the expected count") {
    Backend backend(2);
    Regressor trainer(backend, {.micro_batches = 2});
    const auto x = random_floats(2 * 4, 3);
    const auto y = random_floats(2 * 3, 4);
    CHECK(std::isfinite(trainer.forward_backward(x, y)));
    const std::string short_y =
        error_of([&] { trainer.forward_backward(x, std::span(y).first(5)); });
    CHECK(contains(short_y, "y has 5 targets, expected 6 (2 rows x 3)"));
    const std::vector<float> long_y(7, 0.0f);
    const std::string long_message = error_of([&] { trainer.forward_backward(x, long_y); });
    CHECK(contains(long_message, "y has 7 targets, expected 6"));
  }

  TEST_CASE("bad options and a backend too small for the model are rejected at construction") {
    SUBCASE("zero micro-batches") {
      Backend backend(2);
      const std::string message =
          error_of([&] { Classifier trainer(backend, {.micro_batches = 0}); });
      CHECK(contains(message, "micro_batches"));
      CHECK(contains(message, "at least 1"));
      CHECK(current_bytes(backend) == std::vector<std::size_t>{0, 0});
    }
    SUBCASE("fewer devices than stages") {
      Backend backend(1);
      const std::string message = error_of([&] { Classifier trainer(backend, {}); });
      CHECK(contains(message, "2 stages"));
      CHECK(contains(message, "only 1"));
      CHECK(backend.memory_stats(0).current == 0);
    }
  }

  TEST_CASE("unknown parameter names and wrong sizes are rejected by name") {
    Backend backend(2);
    Classifier trainer(backend, {});
    const std::vector<float> values(3, 1.0f);
    for (const std::string name : {"9.weight", "1.weight", "0.weights", ""}) {
      CAPTURE(name);
      CHECK(contains(error_of([&] { (void)trainer.parameter(name); }),
                     "no parameter \"" + name + "\""));
      CHECK(contains(error_of([&] { (void)trainer.gradient(name); }),
                     "no parameter \"" + name + "\""));
      CHECK(contains(error_of([&] { trainer.set_parameter(name, values); }),
                     "no parameter \"" + name + "\""));
    }
    const auto before = trainer.parameter("0.weight");
    const std::string message = error_of([&] { trainer.set_parameter("0.weight", values); });
    CHECK(contains(message, "\"0.weight\" has 32 elements, got 3"));
    CHECK(trainer.parameter("0.weight") == before);
  }

  TEST_CASE("load() rejects a bad file and leaves the parameters as they were") {
    Backend backend(2);
    Classifier trainer(backend, {.seed = 7});
    Classifier source(backend, {.seed = 8});  // different values, same names and shapes
    const auto before = trainer.parameter("2.weight");
    TempFile file;

    SUBCASE("a missing file") {
      const std::string message = error_of([&] { trainer.load(file.path()); });
      CHECK(contains(message, file.path().string()));
      CHECK(contains(message, "no such file"));
    }
    SUBCASE("a file lacking a tensor") {
      const auto w0 = source.parameter("0.weight"), b0 = source.parameter("0.bias"),
                 w2 = source.parameter("2.weight");
      const std::vector<gpipe::io::TensorView> tensors = {
          {"0.weight", {8, 4}, w0}, {"0.bias", {8}, b0}, {"2.weight", {3, 8}, w2}};
      gpipe::io::save_safetensors(file.path(), tensors);
      const std::string message = error_of([&] { trainer.load(file.path()); });
      CHECK(contains(message, file.path().string()));
      CHECK(contains(message, "no tensor \"2.bias\""));
    }
    SUBCASE("a tensor of the wrong shape") {
      const auto w0 = source.parameter("0.weight"), b0 = source.parameter("0.bias"),
                 w2 = source.parameter("2.weight"), b2 = source.parameter("2.bias");
      const std::vector<gpipe::io::TensorView> tensors = {{"0.weight", {4, 8}, w0},
                                                          {"0.bias", {8}, b0},
                                                          {"2.weight", {3, 8}, w2},
                                                          {"2.bias", {3}, b2}};
      gpipe::io::save_safetensors(file.path(), tensors);
      const std::string message = error_of([&] { trainer.load(file.path()); });
      CHECK(contains(message, "\"0.weight\" has shape [4, 8], the model expects [8, 4]"));
    }
    SUBCASE("an extra tensor") {
      source.save(file.path());
      auto tensors = gpipe::io::load_safetensors(file.path());
      std::vector<gpipe::io::TensorView> views;
      for (const auto& [name, tensor] : tensors) views.push_back({name, tensor.shape, tensor.data});
      const std::vector<float> extra = {1.0f, 2.0f};
      views.push_back({"4.weight", {2}, extra});
      gpipe::io::save_safetensors(file.path(), views);
      const std::string message = error_of([&] { trainer.load(file.path()); });
      CHECK(contains(message, "tensor \"4.weight\" that the model does not have"));
    }
    CHECK(trainer.parameter("2.weight") == before);

    // And a good file loads.
    source.save(file.path());
    trainer.load(file.path());
    CHECK(trainer.parameter("2.weight") == source.parameter("2.weight"));
  }

  TEST_CASE("a device too small for the parameters is OutOfMemory at construction") {
    Backend backend(2, {.device_capacity = 64});  // stage 0 alone has 40 floats = 160 bytes
    const std::string message =
        error_of<gpipe::OutOfMemory>([&] { Classifier trainer(backend, {}); });
    CHECK(contains(message, "device 0"));
    CHECK(contains(message, "capacity of 64 bytes"));
    CHECK(current_bytes(backend) == std::vector<std::size_t>{0, 0});
  }

  TEST_CASE("a device too small for the activations is OutOfMemory naming the stage and device") {
    constexpr std::size_t micro_batches = 2;
    // Parameters and gradients of stage 1, the loss of each micro-batch, 8 bytes to spare.
    constexpr std::size_t capacity = wide_stage1_bytes + 4 * micro_batches + 8;
    Backend backend(2, {.device_capacity = capacity});
    WideTrainer trainer(backend, {.micro_batches = micro_batches});
    const auto baseline = current_bytes(backend);
    const auto x = random_floats(4 * 4, 5);
    const auto y = random_classes(4, 3, 6);
    for (int attempt = 0; attempt < 2; ++attempt) {
      const std::string message =
          error_of<gpipe::OutOfMemory>([&] { trainer.forward_backward(x, y); });
      CHECK(contains(message, "stage 1 (device 1), micro-batch 0"));
      CHECK(contains(message, "out of memory on device 1"));
      CHECK(contains(message, "capacity of " + std::to_string(capacity) + " bytes"));
      CHECK(current_bytes(backend) == baseline);
    }
  }

  TEST_CASE("a device too small for the step's losses is OutOfMemory before any work is issued") {
    // Device 1 is exactly full with its parameters and gradients.
    Backend backend(2, {.device_capacity = wide_stage1_bytes});
    WideTrainer trainer(backend, {.micro_batches = 2});
    const auto baseline = current_bytes(backend);
    const auto x = random_floats(4 * 4, 7);
    const auto y = random_classes(4, 3, 8);
    const std::string message =
        error_of<gpipe::OutOfMemory>([&] { trainer.forward_backward(x, y); });
    CHECK(contains(message, "out of memory on device 1"));
    CHECK(current_bytes(backend) == baseline);
    trainer.zero_grad();  // the backend still runs work
    for (const auto& g : all_gradients(trainer))
      for (float v : g) CHECK(v == 0.0f);
  }

  TEST_CASE(
      "a user layer that throws in a stream fails the step naming stage, device, micro-batch") {
    FaultGuard guard;
    const auto x = random_floats(faulty_batch * 4, 11);
    const auto y = random_classes(faulty_batch, 3, 12);
    for (const gpipe::Remat remat :
         {gpipe::Remat::never, gpipe::Remat::always, gpipe::Remat::except_last}) {
      for (const Fault fault : {Fault::forward, Fault::backward_input}) {
        CAPTURE(gpipe::to_string(remat));
        CAPTURE(fault == Fault::forward ? "forward" : "backward_input");
        const FaultyTrainer::Options options{
            .micro_batches = faulty_micro_batches, .remat = remat, .seed = 3};
        Backend backend(3);
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

        Backend fresh_backend(3);
        FaultyTrainer fresh(fresh_backend, options);
        CHECK(fresh.forward_backward(x, y) == loss);
        CHECK(all_gradients(trainer) == all_gradients(fresh));
      }
    }
  }

  TEST_CASE("a user layer that throws during predict() fails naming stage and micro-batch") {
    FaultGuard guard;
    const FaultyTrainer::Options options{.micro_batches = faulty_micro_batches, .seed = 5};
    Backend backend(3);
    FaultyTrainer trainer(backend, options);
    const auto baseline = current_bytes(backend);
    const auto x = random_floats(faulty_batch * 4, 31);

    injected_fault = Fault::forward;
    const std::string message = error_of([&] { (void)trainer.predict(x); });
    CHECK(contains(message, "stage 1 (device 1), micro-batch 2"));
    CHECK(contains(message, "injected forward failure"));
    CHECK(current_bytes(backend) == baseline);

    injected_fault = Fault::none;
    const auto out = trainer.predict(x);
    CHECK(current_bytes(backend) == baseline);
    Backend fresh_backend(3);
    FaultyTrainer fresh(fresh_backend, options);
    CHECK(out == fresh.predict(x));

    const std::string empty = error_of([&] { (void)trainer.predict({}); });
    CHECK(contains(empty, "x has 0 floats"));
  }

  TEST_CASE("a failure in a stream leaves memory peak and current where a step leaves them") {
    FaultGuard guard;
    Backend backend(3);
    FaultyTrainer trainer(backend, {.micro_batches = faulty_micro_batches});
    const auto baseline = current_bytes(backend);
    const auto x = random_floats(faulty_batch * 4, 21);
    const auto y = random_classes(faulty_batch, 3, 22);
    for (int step = 0; step < 20; ++step) {
      injected_fault = step % 2 == 0 ? Fault::forward : Fault::backward_input;
      CHECK_THROWS_AS(trainer.forward_backward(x, y), gpipe::Error);
      CHECK(current_bytes(backend) == baseline);
      injected_fault = Fault::none;
      CHECK(std::isfinite(trainer.forward_backward(x, y)));
      CHECK(current_bytes(backend) == baseline);
    }
  }
}
