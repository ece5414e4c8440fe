// Three training steps of a nanoGPT-shaped GPT (the LM head tied to the token embedding), as a
// training run takes them, for tests/pytorch/check_training_run.py to compare with PyTorch:
// forward_backward, clip_grad_norm at a norm that clips, AdamW with nanoGPT's groups
// (Decay::matrices) and a warmup + cosine learning rate, zero_grad.
//
// Usage: pytorch_train_steps <dir> <K> <out> [--save-after-first <ckpt> | --resume <ckpt>]
//        [--bf16] (gpipe::MixedBf16, K = 2)
//        (built with GPIPE_TRAIN_STEPS_MPI, under mpirun: K = ranks / R, and R = the 5th argument)
// Reads <dir>/state_dict.safetensors (PyTorch's state dict of nanoGPT's GPT, both tied names and
// the causal-mask buffers, read with gpipe::nanogpt_names) and <dir>/batches.safetensors (x0, y0,
// x1, y1, x2, y2: tokens and targets as floats). Writes <out>/stepped.safetensors (nanoGPT's
// names) and <out>/steps.txt (per step: loss and norm before clipping). --save-after-first saves a
// checkpoint after the first step; --resume loads one and takes the steps after it.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/io/safetensors.hpp"
#ifdef GPIPE_TRAIN_STEPS_MPI
#include "gpipe/mpi.hpp"
#endif

namespace {

constexpr std::size_t V = 13, T = 6, D = 12, H = 3;
constexpr std::size_t steps = 3, micro_batches = 2;
constexpr double max_norm = 0.05;  // below every step's norm: clipping scales the gradients
using Emb = gpipe::Embedding<V, T, D>;
using Block = gpipe::TransformerBlock<D, H>;
using Head = gpipe::Linear<D, V, false>;
using Gpt1 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block, Block, gpipe::LayerNorm<D>, Head>>;
using Gpt2 = gpipe::Pipeline<gpipe::Stage<Emb, Block, Block>,
                             gpipe::Stage<Block, gpipe::LayerNorm<D>, Head>>;
using Gpt4 = gpipe::Pipeline<gpipe::Stage<Emb, Block>, gpipe::Stage<Block>, gpipe::Stage<Block>,
                             gpipe::Stage<gpipe::LayerNorm<D>, Head>>;

struct Run {
  std::filesystem::path dir, out, save_after_first, resume;
  bool bf16 = false;  ///< --bf16: gpipe::MixedBf16
};

#ifdef GPIPE_TRAIN_STEPS_MPI
bool first_rank(const gpipe::mpi::Backend& backend) { return backend.rank() == 0; }
#else
bool first_rank(const gpipe::host::Backend&) { return true; }
#endif

std::vector<std::int32_t> as_tokens(const gpipe::io::Tensor& tensor) {
  return {tensor.data.begin(), tensor.data.end()};
}

template <class Model, class Backend, class Precision = gpipe::Fp32>
void train(Backend& backend, const Run& run) {
  gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, Backend, gpipe::OneFOneB, Precision> trainer(
      backend, {.micro_batches = micro_batches,
                .seed = 1,
                .ties = {{.parameter = "5.weight", .to = "0.wte.weight"}}});
  const gpipe::NameMap names = gpipe::nanogpt_names<Model>();
  trainer.load(run.dir / "state_dict.safetensors", names);
  const auto batches = gpipe::io::load_safetensors(run.dir / "batches.safetensors");
  const gpipe::optim::WarmupCosine lr(
      {.max_lr = 1e-2, .min_lr = 1e-3, .warmup_steps = 1, .total_steps = steps});
  gpipe::optim::AdamW adamw(
      {.beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1, .decay = gpipe::optim::Decay::matrices});
  std::size_t first = 0;
  if (!run.resume.empty()) first = std::stoul(trainer.load_checkpoint(run.resume).at("next_step"));
  std::string log;
  for (std::size_t s = first; s < steps; ++s) {
    const float loss = trainer.forward_backward(as_tokens(batches.at("x" + std::to_string(s))),
                                                as_tokens(batches.at("y" + std::to_string(s))));
    const double norm = trainer.clip_grad_norm(max_norm);
    adamw.options.lr = lr(s);
    trainer.step(adamw);
    trainer.zero_grad();
    char line[96];
    std::snprintf(line, sizeof line, "%zu %.9g %.17g\n", s, static_cast<double>(loss), norm);
    log += line;
    if (s == 0 && !run.save_after_first.empty())
      trainer.save_checkpoint(run.save_after_first, {{"next_step", "1"}});
  }
  trainer.save(run.out / "stepped.safetensors", names);
  if (first_rank(backend)) std::ofstream(run.out / "steps.txt") << log;
}

template <class Backend>
void train_split(Backend& backend, std::size_t k, const Run& run) {
  if (run.bf16) {
    if (k == 2) return train<Gpt2, Backend, gpipe::MixedBf16>(backend, run);
    throw gpipe::Error("gpipe: pytorch_train_steps: --bf16 runs K = 2 only");
  }
  if (k == 1) return train<Gpt1>(backend, run);
  if (k == 2) return train<Gpt2>(backend, run);
  if (k == 4) return train<Gpt4>(backend, run);
  throw gpipe::Error("gpipe: pytorch_train_steps: K must be 1, 2 or 4, got " + std::to_string(k));
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <dir> <K> <out> [--save-after-first|--resume <ckpt>]\n",
                 argv[0]);
    return 2;
  }
  Run run{.dir = argv[1], .out = argv[3], .save_after_first = {}, .resume = {}};
  for (int i = 4; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--bf16") run.bf16 = true;
    if (flag == "--save-after-first" && i + 1 < argc) run.save_after_first = argv[++i];
    if (flag == "--resume" && i + 1 < argc) run.resume = argv[++i];
  }
  std::filesystem::create_directories(run.out);
  const std::size_t k = std::strtoull(argv[2], nullptr, 10);
#ifdef GPIPE_TRAIN_STEPS_MPI
  const char* replicas = std::getenv("GPIPE_REPLICAS");
  gpipe::mpi::Backend backend(
      argc, argv, {.data_parallel = replicas ? std::strtoull(replicas, nullptr, 10) : 1});
#else
  gpipe::host::Backend backend(k);
#endif
  train_split(backend, k, run);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
