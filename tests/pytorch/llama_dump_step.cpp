// Writes what tests/pytorch/check_llama.py needs to compare one pipelined gpipe step of a Llama
// with a float64 PyTorch implementation of Hugging Face's LlamaForCausalLM: for each model
// <name>, <dir>/params_<name>.safetensors (the model before the step, under Hugging Face's names:
// gpipe::hf_llama_names), <dir>/names_<name>.txt (lines "gpipe name, Hugging Face name"),
// <dir>/batch_<name>.safetensors (tokens x and targets y, as floats), and for every split
// K in {1, 2}, schedule (GPipe, 1F1B) and remat never / always, with M = 3 micro-batches,
// <dir>/grads_<name>_<K>_<schedule>_<remat>.safetensors (gpipe's names) and loss_<...>.txt.
// Models: "gqa" (8 heads on 2 key/value heads, RoPE base 10000) and "mqa" (4 heads on one, base
// 500000, Llama 3's).
// Usage: pytorch_llama_dump_step <dir>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gpipe/gpipe.hpp>
#include <string>
#include <vector>

namespace {

constexpr std::size_t V = 13, T = 16, D = 32, F = 40, samples = 4;

template <std::size_t H, std::size_t KVH, std::size_t Base>
struct Llama {
  using Emb = gpipe::TokenEmbedding<V, T, D>;
  using Block = gpipe::LlamaBlock<D, H, KVH, F, Base>;
  using Head = gpipe::Linear<D, V, false>;
  using K1 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, gpipe::RMSNorm<D>, Head>>;
  using K2 =
      gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block, gpipe::RMSNorm<D>, Head>>;
};

void write_loss(const std::filesystem::path& path, float loss) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(loss));
  std::ofstream(path) << text;
}

template <class Model, class Schedule>
void dump_step(const std::filesystem::path& dir, const std::string& name,
               const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
               const char* schedule) {
  for (gpipe::Remat remat : {gpipe::Remat::never, gpipe::Remat::always}) {
    gpipe::host::Backend backend(Model::num_stages);
    gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, Schedule> trainer(
        backend, {.micro_batches = 3, .remat = remat, .seed = 21});
    const float loss = trainer.forward_backward(tokens, targets);
    const std::string tag = name + "_" + std::to_string(Model::num_stages) + "_" + schedule + "_" +
                            std::string(gpipe::to_string(remat));
    trainer.save_gradients(dir / ("grads_" + tag + ".safetensors"));
    write_loss(dir / ("loss_" + tag + ".txt"), loss);
  }
}

template <class L>
void dump(const std::filesystem::path& dir, const std::string& name, std::uint64_t seed) {
  gpipe::Rng rng(seed);
  std::vector<std::int32_t> tokens(samples * T), targets(samples * T);
  for (std::int32_t& t : tokens) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (std::int32_t& t : targets) t = static_cast<std::int32_t>(rng.next_u64() % V);
  const std::vector<float> x(tokens.begin(), tokens.end()), y(targets.begin(), targets.end());
  const std::vector<gpipe::io::TensorView> batch{{"x", {samples, T}, x}, {"y", {samples, T}, y}};
  gpipe::io::save_safetensors(dir / ("batch_" + name + ".safetensors"), batch);

  // Every split starts from the same parameters (one seed, the same names): K = 1's are saved.
  const gpipe::NameMap names = gpipe::hf_llama_names<typename L::K1>();
  gpipe::host::Backend backend(1);
  gpipe::Trainer<typename L::K1, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend> trainer(
      backend, {.seed = 21});
  trainer.save(dir / ("params_" + name + ".safetensors"), names);
  std::ofstream list(dir / ("names_" + name + ".txt"));
  for (const auto& [model_name, file_name] : names.renames())
    list << model_name << ", " << file_name << "\n";

  dump_step<typename L::K1, gpipe::GPipe>(dir, name, tokens, targets, "gpipe");
  dump_step<typename L::K1, gpipe::OneFOneB>(dir, name, tokens, targets, "1f1b");
  dump_step<typename L::K2, gpipe::GPipe>(dir, name, tokens, targets, "gpipe");
  dump_step<typename L::K2, gpipe::OneFOneB>(dir, name, tokens, targets, "1f1b");
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  dump<Llama<8, 2, 10000>>(dir, "gqa", 31);
  dump<Llama<4, 1, 500000>>(dir, "mqa", 32);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
