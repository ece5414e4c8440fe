// Writes what an outside check needs to compare one pipelined gpipe step with PyTorch:
// <dir>/params_<name>.safetensors (the model before the step), <dir>/batch_<name>.safetensors
// (x, and y as floats), <dir>/grads_<name>.safetensors (the gradients after forward_backward) and
// <dir>/loss_<name>.txt, and the parameters after two optimizer steps in
// <dir>/stepped_<name>.safetensors (AdamW for the first model, SGD with Nesterov momentum and
// weight decay for the second), for a cross-entropy model with Residual and LayerNorm on 3 stages
// and an MSE model on 2 stages, both with micro-batches that do not divide the batch and remat
// always. For a GPT (Embedding, TransformerBlock, LayerNorm, Linear head) it writes
// params_gpt.safetensors, batch_gpt.safetensors (tokens x and targets y, as floats) and, for every
// split K in {1, 2, 4}, schedule, M in {1, 2, 3} and remat never / always,
// grads_gpt_<K>_<schedule>_<M>_<remat>.safetensors and loss_gpt_<...>.txt, and
// stepped_gpt.safetensors after two AdamW steps (K = 4, 1F1B, M = 3, remat always); and the same
// for a GPT whose bias-free LM head is tied to the token embedding (*_tied_gpt.*), with two SGD
// steps. With packed documents and ignored (-100) targets, from params_gpt.safetensors:
// batch_packed_gpt.safetensors (x, y and the document ids d, as floats) and, for K in {1, 2, 4},
// 1F1B and ZB-H1, M in {1, 3} and remat never / always, grads_packed_gpt_<...>.safetensors and
// loss_packed_gpt_<...>.txt.
// Usage: pytorch_dump_step <dir>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gpipe/gpipe.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using CrossEntropyModel = gpipe::Pipeline<
    gpipe::Stage<gpipe::Linear<12, 32>, gpipe::ReLU>,
    gpipe::Stage<gpipe::Linear<32, 32>, gpipe::GELU, gpipe::LayerNorm<32>>,
    gpipe::Stage<gpipe::Residual<gpipe::Linear<32, 16>, gpipe::GELU, gpipe::Linear<16, 32>>,
                 gpipe::Linear<32, 7>>>;
using MseModel = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<12, 24>, gpipe::GELU>,
                                 gpipe::Stage<gpipe::LayerNorm<24>, gpipe::Linear<24, 5>>>;

constexpr std::size_t V = 11, T = 5, D = 12, H = 3, samples = 4;
using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Gpt1 = gpipe::Pipeline<
    gpipe::Stage<Emb, Block, Block, Block, gpipe::LayerNorm<D>, gpipe::Linear<D, V>>>;
using Gpt2 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block>,
                             gpipe::Stage<Block, gpipe::LayerNorm<D>, gpipe::Linear<D, V>>>;
using Gpt4 = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block>, gpipe::Stage<Block>,
                             gpipe::Stage<gpipe::LayerNorm<D>, gpipe::Linear<D, V>>>;

void write_loss(const std::filesystem::path& path, float loss) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(loss));
  std::ofstream(path) << text;
}

// documents: empty, or each token's document id (then the files are named packed_gpt_...).
template <class Model, class Schedule>
void dump_gpt_step(const std::filesystem::path& dir, const std::vector<std::int32_t>& tokens,
                   const std::vector<std::int32_t>& targets, const char* schedule,
                   const std::vector<std::int32_t>& documents = {}) {
  const bool packed = !documents.empty();
  for (std::size_t m :
       packed ? std::vector<std::size_t>{1, 3} : std::vector<std::size_t>{1, 2, 3}) {
    for (gpipe::Remat remat : {gpipe::Remat::never, gpipe::Remat::always}) {
      gpipe::host::Backend backend(Model::num_stages);
      gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, Schedule> trainer(
          backend, {.micro_batches = m, .remat = remat, .seed = 13});
      const float loss = packed ? trainer.forward_backward(tokens, targets, documents)
                                : trainer.forward_backward(tokens, targets);
      const std::string tag = std::string(packed ? "packed_gpt_" : "gpt_") +
                              std::to_string(Model::num_stages) + "_" + schedule + "_" +
                              std::to_string(m) + "_" + std::string(gpipe::to_string(remat));
      trainer.save_gradients(dir / ("grads_" + tag + ".safetensors"));
      write_loss(dir / ("loss_" + tag + ".txt"), loss);
    }
  }
}

template <class Model>
void dump_gpt_schedules(const std::filesystem::path& dir, const std::vector<std::int32_t>& tokens,
                        const std::vector<std::int32_t>& targets) {
  dump_gpt_step<Model, gpipe::GPipe>(dir, tokens, targets, "gpipe");
  dump_gpt_step<Model, gpipe::OneFOneB>(dir, tokens, targets, "1f1b");
  dump_gpt_step<Model, gpipe::ZeroBubbleH1>(dir, tokens, targets, "zbh1");
}

// GPT-2's weight tying: the bias-free LM head is the token embedding (first and last stage).
using TiedGpt4 = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block>, gpipe::Stage<Block>,
                                 gpipe::Stage<gpipe::LayerNorm<D>, gpipe::Linear<D, V, false>>>;

void dump_tied_gpt(const std::filesystem::path& dir, const std::vector<std::int32_t>& tokens,
                   const std::vector<std::int32_t>& targets) {
  gpipe::host::Backend backend(4);
  gpipe::Trainer<TiedGpt4, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, gpipe::OneFOneB>
      trainer(backend, {.micro_batches = 3,
                        .remat = gpipe::Remat::always,
                        .seed = 13,
                        .ties = {{.parameter = "5.weight", .to = "0.wte.weight"}}});
  trainer.save(dir / "params_tied_gpt.safetensors");
  write_loss(dir / "loss_tied_gpt.txt", trainer.forward_backward(tokens, targets));
  trainer.save_gradients(dir / "grads_tied_gpt.safetensors");
  // SGD here: its update is linear in the gradient, so two steps compare as closely as the
  // gradients do (AdamW's g / sqrt(v) gives each element the relative error of its own gradient,
  // large where a gradient is small; the untied GPT above checks AdamW).
  const gpipe::optim::SGD sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  trainer.step(sgd);
  trainer.zero_grad();
  trainer.forward_backward(tokens, targets);
  trainer.step(sgd);
  trainer.save(dir / "stepped_tied_gpt.safetensors");
}

// Packed documents (runs that end inside a sample, an id back after another, a run across a
// sample border) and targets of which every fourth and all of sample 0 are ignored.
void dump_packed_gpt(const std::filesystem::path& dir, const std::vector<std::int32_t>& tokens,
                     std::vector<std::int32_t> targets) {
  gpipe::Rng rng(19);
  std::vector<std::int32_t> documents(tokens.size());
  std::int32_t id = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (rng.next_u64() % 3 == 0) id = static_cast<std::int32_t>(rng.next_u64() % 3);
    documents[i] = id;
    if (i < T || i % 4 == 1) targets[i] = gpipe::ignore_index;
  }
  const std::vector<float> x(tokens.begin(), tokens.end()), y(targets.begin(), targets.end()),
      d(documents.begin(), documents.end());
  const std::vector<gpipe::io::TensorView> batch{
      {"x", {samples, T}, x}, {"y", {samples, T}, y}, {"d", {samples, T}, d}};
  gpipe::io::save_safetensors(dir / "batch_packed_gpt.safetensors", batch);
  for (const char* schedule : {"1f1b", "zbh1"}) {
    const bool zb = std::string(schedule) == "zbh1";
    auto dump = [&]<class Model>(Model*) {
      if (zb)
        dump_gpt_step<Model, gpipe::ZeroBubbleH1>(dir, tokens, targets, schedule, documents);
      else
        dump_gpt_step<Model, gpipe::OneFOneB>(dir, tokens, targets, schedule, documents);
    };
    dump(static_cast<Gpt1*>(nullptr));
    dump(static_cast<Gpt2*>(nullptr));
    dump(static_cast<Gpt4*>(nullptr));
  }
}

void dump_gpt(const std::filesystem::path& dir) {
  gpipe::Rng rng(17);
  std::vector<std::int32_t> tokens(samples * T), targets(samples * T);
  for (std::int32_t& t : tokens) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (std::int32_t& t : targets) t = static_cast<std::int32_t>(rng.next_u64() % V);
  const std::vector<float> x(tokens.begin(), tokens.end()), y(targets.begin(), targets.end());
  const std::vector<gpipe::io::TensorView> batch{{"x", {samples, T}, x}, {"y", {samples, T}, y}};
  gpipe::io::save_safetensors(dir / "batch_gpt.safetensors", batch);
  dump_gpt_schedules<Gpt1>(dir, tokens, targets);
  dump_gpt_schedules<Gpt2>(dir, tokens, targets);
  dump_gpt_schedules<Gpt4>(dir, tokens, targets);
  dump_packed_gpt(dir, tokens, targets);

  gpipe::host::Backend backend(4);
  gpipe::Trainer<Gpt4, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, gpipe::OneFOneB> trainer(
      backend, {.micro_batches = 3, .remat = gpipe::Remat::always, .seed = 13});
  trainer.save(dir / "params_gpt.safetensors");
  const gpipe::optim::AdamW adamw({.lr = 1e-2, .weight_decay = 0.1});
  trainer.forward_backward(tokens, targets);
  trainer.step(adamw);
  trainer.zero_grad();
  trainer.forward_backward(tokens, targets);
  trainer.step(adamw);
  trainer.save(dir / "stepped_gpt.safetensors");
  dump_tied_gpt(dir, tokens, targets);
}

template <class Model, class Loss, class Optimizer>
void dump(const std::filesystem::path& dir, const std::string& name, std::size_t rows,
          const Optimizer& optimizer) {
  gpipe::host::Backend backend(Model::num_stages);
  gpipe::Trainer<Model, Loss, gpipe::host::Backend> trainer(
      backend, {.micro_batches = 3, .remat = gpipe::Remat::always, .seed = 11});
  gpipe::Rng rng(5);
  std::vector<float> x(rows * Model::in_features);
  for (float& v : x) v = rng.uniform(-2, 2);
  std::vector<typename Loss::target_type> y(rows * Loss::targets_per_row(Model::out_features));
  std::vector<float> y_float(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    if constexpr (std::is_same_v<typename Loss::target_type, float>) {
      y[i] = rng.uniform(-1, 1);
    } else {
      y[i] = static_cast<std::int32_t>(rng.next_u64() % Model::out_features);
    }
    y_float[i] = static_cast<float>(y[i]);
  }
  trainer.save(dir / ("params_" + name + ".safetensors"));
  const std::vector<gpipe::io::TensorView> batch{{"x", {rows, Model::in_features}, x},
                                                 {"y", {rows, y.size() / rows}, y_float}};
  gpipe::io::save_safetensors(dir / ("batch_" + name + ".safetensors"), batch);
  const float loss = trainer.forward_backward(x, y);
  trainer.save_gradients(dir / ("grads_" + name + ".safetensors"));
  write_loss(dir / ("loss_" + name + ".txt"), loss);
  // Two optimizer steps from here: the first on these gradients, the second on fresh ones.
  trainer.step(optimizer);
  trainer.zero_grad();
  trainer.forward_backward(x, y);
  trainer.step(optimizer);
  trainer.save(dir / ("stepped_" + name + ".safetensors"));
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  dump<CrossEntropyModel, gpipe::SoftmaxCrossEntropy>(
      dir, "cross_entropy", 10, gpipe::optim::AdamW({.lr = 1e-2, .weight_decay = 0.1}));
  dump<MseModel, gpipe::MSELoss>(
      dir, "mse", 11,
      gpipe::optim::SGD({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}));
  dump_gpt(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
