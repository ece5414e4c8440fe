// Trainer::save / load / save_gradients: safetensors files with the contract's names and
// layouts, independent of how the model is split into stages.

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"
#include "support/temp_path.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

}  // namespace

TEST_CASE("parameters saved from one split load into another split unchanged") {
  TempPath file("gpipe_test_checkpoint_params");
  host::Backend backend(4);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend> two(backend, {.seed = 1});
  two.save(file.path());

  Trainer<Model4, SoftmaxCrossEntropy, host::Backend> four(backend, {.seed = 2});
  REQUIRE(parameters_of(four) != parameters_of(two));
  four.load(file.path());
  CHECK(parameters_of(four) == parameters_of(two));
}

TEST_CASE("a saved file holds every parameter with PyTorch's name, shape and row-major data") {
  TempPath file("gpipe_test_checkpoint_layout");
  host::Backend backend(3);
  Trainer<Model3, MSELoss, host::Backend> trainer(backend, {.seed = 5});
  trainer.save(file.path());
  const auto tensors = io::load_safetensors(file.path());

  const std::vector<std::pair<std::string, std::vector<std::size_t>>> expected{
      {"0.weight", {16, 6}},   {"0.bias", {16}},   {"2.weight", {16, 16}},  {"2.bias", {16}},
      {"4.weight", {16}},      {"4.bias", {16}},   {"5.0.weight", {8, 16}}, {"5.0.bias", {8}},
      {"5.2.weight", {16, 8}}, {"5.2.bias", {16}}, {"6.weight", {5, 16}},   {"6.bias", {5}}};
  CHECK(tensors.size() == expected.size());
  for (const auto& [name, shape] : expected) {
    CAPTURE(name);
    REQUIRE(tensors.count(name) == 1);
    CHECK(tensors.at(name).shape == shape);
    CHECK(tensors.at(name).data == trainer.parameter(name));
  }
  // LayerNorm starts as the identity affine map, as in PyTorch.
  for (float w : tensors.at("4.weight").data) CHECK(w == 1.0f);
  for (float b : tensors.at("4.bias").data) CHECK(b == 0.0f);
  // Linear(In, Out) starts in U(-1/sqrt(In), 1/sqrt(In)).
  for (float w : tensors.at("2.weight").data) CHECK(std::abs(w) <= 0.25f);
}

TEST_CASE("save_gradients writes the accumulated gradients") {
  TempPath file("gpipe_test_checkpoint_grads");
  host::Backend backend(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend> trainer(backend,
                                                              {.micro_batches = 3, .seed = 9});
  const std::vector<float> x = random_inputs(6, Model2::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(6, L6::out_features, 2);
  trainer.forward_backward(x, y);
  trainer.save_gradients(file.path());
  const auto tensors = io::load_safetensors(file.path());
  for (const ParameterInfo& info : trainer.parameter_info()) {
    CAPTURE(info.name);
    REQUIRE(tensors.count(info.name) == 1);
    CHECK(tensors.at(info.name).data == trainer.gradient(info.name));
    CHECK(tensors.at(info.name).shape == info.shape);
  }
}

TEST_CASE("set_parameter writes one tensor and training starts from it") {
  host::Backend backend(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.seed = 9});
  std::vector<float> bias(5);
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i);
  trainer.set_parameter("6.bias", bias);
  CHECK(trainer.parameter("6.bias") == bias);
}
