// Writes what tests/pytorch/check_llama.py needs to compare one pipelined gpipe step of a Llama
// with a float64 PyTorch implementation of Hugging Face's LlamaForCausalLM: for each model
// <name>, <dir>/params_<name>.safetensors (the model before the step, under Hugging Face's names:
// gpipe::hf_llama_names), <dir>/names_<name>.txt (lines "gpipe name, Hugging Face name"),
// <dir>/batch_<name>.safetensors (tokens x and targets y, as floats), and for every split
// K in {1, 2}, schedule (GPipe, 1F1B) and remat never / always, with M = 3 micro-batches,
// <dir>/grads_<name>_<K>_<schedule>_<remat>.safetensors (gpipe's names) and loss_<...>.txt.
// Models: "gqa" (8 heads on 2 key/value heads, RoPE base 10000) and "mqa" (4 heads on one, base
// 500000, Llama 3's). And one LlamaBlock alone in double (gpipe::testing::LayerRun) on packed
// documents: <dir>/block_documents.safetensors with its input x, the document ids (as floats), its
// parameters (Hugging Face's names within a layer), dy, and what it computed: y, dx and the
// parameters' gradients ("grad.<name>").
// Usage: pytorch_llama_dump_step <dir>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gpipe/gpipe.hpp>
#include <gpipe/testing/gradient_check.hpp>
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

// One LlamaBlock<D, 8, 2, F> on 3 samples of T tokens with documents, in double.
void dump_block_with_documents(const std::filesystem::path& dir) {
  using Block = gpipe::LlamaBlock<D, 8, 2, F>::with_tokens<T>;
  constexpr std::size_t rows = 3 * T;
  gpipe::testing::LayerRun<Block, double> run(rows);
  gpipe::Rng rng(41);
  run.x = gpipe::testing::uniform_values(rng, rows * D, -1.0f, 1.0f);
  run.params = gpipe::testing::perturbed_params<Block>(rng, 0.2f);
  run.dy = gpipe::testing::uniform_values(rng, rows * D, -1.0f, 1.0f);
  // runs of 5, 11 | 3, 3, 10 (the id of the run before again) | 16 (the last run's id again: a
  // sample border ends a run)
  const std::vector<std::int32_t> lengths{5, 11, 3, 3, 10, 16}, ids{1, 2, 3, 4, 3, 3};
  for (std::size_t k = 0; k < lengths.size(); ++k)
    run.document.insert(run.document.end(), static_cast<std::size_t>(lengths[k]), ids[k]);
  run.forward_backward();

  std::vector<std::vector<float>> keep;  // the tensors' floats, alive until the save
  std::vector<gpipe::io::TensorView> out;
  auto add = [&](std::string name, std::vector<std::size_t> shape, const double* p, std::size_t n) {
    keep.emplace_back(p, p + n);
    out.push_back({std::move(name), std::move(shape), keep.back()});
  };
  keep.reserve(32);
  const std::vector<double> document(run.document.begin(), run.document.end());
  add("x", {3, T, D}, run.x.data(), run.x.size());
  add("document", {3, T}, document.data(), document.size());
  add("dy", {3, T, D}, run.dy.data(), run.dy.size());
  add("y", {3, T, D}, run.y.data(), run.y.size());
  add("dx", {3, T, D}, run.dx.data(), run.dx.size());
  for (const gpipe::ParamSpec& spec : Block::param_specs()) {
    std::vector<std::size_t> shape(spec.shape.begin(), spec.shape.begin() + spec.rank);
    add(std::string(spec.name), shape, run.params.data() + spec.offset, spec.size());
    add("grad." + std::string(spec.name), shape, run.grads.data() + spec.offset, spec.size());
  }
  gpipe::io::save_safetensors(dir / "block_documents.safetensors", out);
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
  dump_block_with_documents(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
