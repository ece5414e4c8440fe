// The public contract, compiled as written and run once: the names and signatures that users
// and outside checks rely on.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <gpipe/gpipe.hpp>
#include <vector>

using Model =
    gpipe::Pipeline<gpipe::Stage<gpipe::Linear<64, 256>, gpipe::ReLU>,
                    gpipe::Stage<gpipe::Linear<256, 256>, gpipe::GELU, gpipe::LayerNorm<256>>,
                    gpipe::Stage<gpipe::Linear<256, 10>>>;
static_assert(Model::num_stages == 3);
static_assert(Model::in_features == 64 && Model::out_features == 10);

TEST_CASE("the public contract compiles as written and trains") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "gpipe_contract";
  std::filesystem::create_directories(dir);
  const std::filesystem::path model_file = dir / "model.safetensors";
  const std::filesystem::path grads_file = dir / "grads.safetensors";

  std::vector<float> x(16 * 64);
  std::vector<std::int32_t> y(16);
  gpipe::Rng rng(3);
  for (float& v : x) v = rng.uniform(-1, 1);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 10);
  {
    gpipe::host::Backend backend(3);
    gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend> trainer(
        backend, {.micro_batches = 8, .remat = gpipe::Remat::always});
    trainer.save(model_file);
  }

  gpipe::host::Backend backend(3, {.device_capacity = 256 << 20});
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend> trainer(
      backend, {.micro_batches = 8, .remat = gpipe::Remat::always});  // micro_batches: std::size_t

  trainer.load(model_file.string());
  float loss = trainer.forward_backward(x, y);
  trainer.save_gradients(grads_file.string());
  trainer.zero_grad();

  auto mem = backend.memory_stats(0);
  backend.reset_peak();

  CHECK(std::isfinite(loss));
  CHECK(loss > 0);
  CHECK(mem.peak >= mem.current);
  CHECK(mem.current > 0);
  CHECK(gpipe::io::load_safetensors(grads_file).size() == Model::parameters().size());
  std::filesystem::remove_all(dir);
}
