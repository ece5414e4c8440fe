// Trainer::save / load / save_gradients: safetensors files with the contract's names and
// layouts, independent of how the model is split into stages. Trainer::save_checkpoint /
// load_checkpoint: resuming bit for bit, into another split, every bad checkpoint an Error that
// leaves the trainer as it was, and a process killed while saving never leaving a partial one.

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"
#include "support/relative_error.hpp"
#include "support/temp_path.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

const optim::AdamW adamw({.lr = 1e-2, .weight_decay = 0.1, .decay = optim::Decay::matrices});

// k AdamW steps of `trainer` on fixed data (the same for every trainer here).
template <class T>
void train(T& trainer, int k) {
  const std::vector<float> x = random_inputs(12, Model3::in_features, 51);
  const std::vector<std::int32_t> y = random_classes(12, L6::out_features, 52);
  for (int i = 0; i < k; ++i) {
    trainer.zero_grad();
    trainer.forward_backward(x, y);
    trainer.step(adamw);
  }
}

// The message of what f throws as a gpipe::Error ("" if it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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

TEST_CASE("a checkpoint resumes training bit for bit, and loads into another split") {
  TempPath root("gpipe_test_ckpt", "");
  const std::filesystem::path dir = root.path() / "run";
  std::filesystem::create_directories(root.path());
  host::Backend three(3), one(1);
  using Three = Trainer<Model3, SoftmaxCrossEntropy, host::Backend>;
  Three trainer(three, {.micro_batches = 4, .seed = 1});
  train(trainer, 2);
  trainer.save_checkpoint(dir, {{"data_position", "123456"}, {"note", "two steps"}});
  const NamedTensors saved = parameters_of(trainer);
  train(trainer, 2);  // the run as if never interrupted

  Three resumed(three, {.micro_batches = 4, .seed = 7});
  const auto user = resumed.load_checkpoint(dir);
  CHECK(user ==
        std::map<std::string, std::string>{{"data_position", "123456"}, {"note", "two steps"}});
  CHECK(parameters_of(resumed) == saved);
  train(resumed, 2);
  CHECK(parameters_of(resumed) == parameters_of(trainer));  // moments and step count restored

  // another K and M: the same parameters, and the next steps follow the same path
  Trainer<Model1, SoftmaxCrossEntropy, host::Backend> single(one, {.micro_batches = 2, .seed = 8});
  single.load_checkpoint(dir);
  CHECK(parameters_of(single) == saved);
  train(single, 2);
  for (const auto& [name, p] : parameters_of(trainer)) {
    CAPTURE(name);
    CHECK(relative_error(parameters_of(single).at(name), p) < 1e-5);
  }
  // the optimizer kind is the checkpoint's: another one is an Error
  Three other(three, {.micro_batches = 4, .seed = 9});
  other.load_checkpoint(dir);
  CHECK(error_of([&] { other.step(optim::SGD({.lr = 0.1})); }).find("AdamW") != std::string::npos);

  // a second save writes the other version and moves the link; the first stays loadable
  resumed.save_checkpoint(dir);
  CHECK(std::filesystem::is_symlink(dir));
  CHECK(std::filesystem::read_symlink(dir).filename() == "run.b");
  Three again(three, {.micro_batches = 4, .seed = 10});
  CHECK(again.load_checkpoint(dir).empty());
  CHECK(parameters_of(again) == parameters_of(resumed));
}

TEST_CASE("a bad checkpoint is an Error naming file and tensor, and changes nothing") {
  TempPath root("gpipe_test_ckpt_bad", "");
  std::filesystem::create_directories(root.path());
  host::Backend backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.seed = 1});
  train(trainer, 1);
  const std::filesystem::path good = root.path() / "good";
  trainer.save_checkpoint(good);
  const auto damaged = [&](const std::string& name) {
    const std::filesystem::path dir = root.path() / name;
    std::filesystem::copy(std::filesystem::canonical(good), dir);
    return dir;
  };
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> target(backend, {.seed = 2});
  const NamedTensors before = parameters_of(target);
  const auto fails_with = [&](const std::filesystem::path& dir, const std::string& expected) {
    const std::string message = error_of([&] { target.load_checkpoint(dir); });
    CAPTURE(message);
    CHECK(message.find(expected) != std::string::npos);
    CHECK(parameters_of(target) == before);
  };

  fails_with(root.path() / "missing", "model.safetensors.index.json");
  const std::filesystem::path no_shard = damaged("no_shard");
  std::filesystem::remove(no_shard / "model-00002-of-00003.safetensors");
  fails_with(no_shard, "model-00002-of-00003.safetensors");
  const std::filesystem::path truncated = damaged("truncated");
  const std::filesystem::path shard = truncated / "model-00003-of-00003.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 7);
  fails_with(truncated, "model-00003-of-00003.safetensors");
  // an index that lost a tensor
  const std::filesystem::path lost = damaged("lost");
  {
    std::ifstream in(lost / "model.safetensors.index.json");
    std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const std::string entry = "\"2.bias.exp_avg\": \"model-00002-of-00003.safetensors\",\n    ";
    REQUIRE(text.find(entry) != std::string::npos);
    text.erase(text.find(entry), entry.size());
    std::ofstream(lost / "model.safetensors.index.json") << text;
  }
  fails_with(lost, "2.bias.exp_avg");
  // another format (a later gpipe's)
  const std::filesystem::path later = damaged("later");
  {
    std::ifstream in(later / "model.safetensors.index.json");
    std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const std::string format = "\"format\": \"gpipe checkpoint 1\"";
    REQUIRE(text.find(format) != std::string::npos);
    text.replace(text.find(format), format.size(), "\"format\": \"gpipe checkpoint 2\"");
    std::ofstream(later / "model.safetensors.index.json") << text;
  }
  fails_with(later,
             "metadata.gpipe.format is \"gpipe checkpoint 2\"; this gpipe reads \"gpipe "
             "checkpoint 1\" only");
  // an index whose shard lies outside the checkpoint (a valid shard there, so only the path is
  // wrong)
  for (const std::string& outside :
       {std::string("../good/model-00002-of-00003.safetensors"),
        (std::filesystem::canonical(good) / "model-00002-of-00003.safetensors").string(),
        std::string(".."), std::string("")}) {
    CAPTURE(outside);
    const std::filesystem::path escapes = damaged("escapes");
    {
      std::ifstream in(escapes / "model.safetensors.index.json");
      std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      const std::string entry = "\"2.bias\": \"model-00002-of-00003.safetensors\"";
      REQUIRE(text.find(entry) != std::string::npos);
      text.replace(text.find(entry), entry.size(), "\"2.bias\": " + detail::json_quote(outside));
      std::ofstream(escapes / "model.safetensors.index.json") << text;
    }
    fails_with(escapes, "weight_map.2.bias is " + detail::json_quote(outside) +
                            ", not the name of a file in the checkpoint's directory");
    std::filesystem::remove_all(escapes);
  }
  // another model: same names, other widths
  using Wider = Pipeline<Stage<Linear<6, 17>, ReLU>, Stage<Linear<17, 16>, GELU, LayerNorm<16>>,
                         Stage<Linear<16, 16>, ReLU, Linear<16, 5>>>;
  Trainer<Wider, SoftmaxCrossEntropy, host::Backend> wider(backend, {.seed = 3});
  const std::filesystem::path other = root.path() / "other";
  wider.save_checkpoint(other);
  fails_with(other, "tensor \"0.bias\" has shape [17], the model's is [16]");
}

TEST_CASE("a process killed while it saves leaves the previous checkpoint or the new one") {
  TempPath root("gpipe_test_ckpt_kill", "");
  std::filesystem::create_directories(root.path());
  const std::filesystem::path dir = root.path() / "run";
  using Three = Trainer<Model3, SoftmaxCrossEntropy, host::Backend>;
  // The parameters after k steps, from an uninterrupted run.
  std::vector<NamedTensors> after(1);
  {
    host::Backend backend(3);
    Three trainer(backend, {.micro_batches = 4, .seed = 1});
    after[0] = parameters_of(trainer);
    for (int k = 1; k <= 40; ++k) {
      train(trainer, 1);
      after.push_back(parameters_of(trainer));
    }
  }
  for (const int delay_ms : {3, 11, 23, 41, 67}) {
    CAPTURE(delay_ms);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // saves after every step until killed
      host::Backend backend(3);
      Three trainer(backend, {.micro_batches = 4, .seed = 1});
      for (int k = 1; k <= 40; ++k) {
        train(trainer, 1);
        trainer.save_checkpoint(dir, {{"step", std::to_string(k)}});
      }
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    if (!std::filesystem::exists(dir)) continue;  // killed before the first save finished
    host::Backend backend(3);
    Three loaded(backend, {.micro_batches = 4, .seed = 2});
    const auto user = loaded.load_checkpoint(dir);
    const int step = std::stoi(user.at("step"));
    CAPTURE(step);
    CHECK(parameters_of(loaded) == after.at(static_cast<std::size_t>(step)));
    std::filesystem::remove_all(root.path());
    std::filesystem::create_directories(root.path());
  }
}
