// Trains a GPT-2-shaped model (token and position embeddings, pre-norm blocks, a final LayerNorm,
// an LM head tied to the token embedding), or with --model llama a Llama-shaped one (a token
// table, LlamaBlocks, RMSNorm, an untied head) on packed documents, in 4 pipeline stages: on 4
// host devices (threads), or, as example_train_gpt_mpi, on 4 x R MPI ranks (R data-parallel
// replicas); with --devices 2 two stages per device (2 threads, or 2 x R ranks). A training run as
// nanoGPT and llm.c do it: AdamW with nanoGPT's two groups (no weight decay on biases and
// LayerNorms), a linear warmup and a cosine learning rate, global-norm gradient clipping,
// gradient accumulation, validation every N steps, a checkpoint every N steps that --resume
// continues from (bit for bit: the same weights as a run never interrupted), a progress line per
// step, the loss curve as SVG and a text sample at the end.
//
// Data: text files, read as bytes (vocabulary 256; by default Debian's fortunes: apt-get install
// fortunes), or llm.c token shards (GPT-2 ids, vocabulary 50304 as llm.c pads it).
// Run `example_train_gpt --help` for the options.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/plan.hpp"
#include "train_gpt/data.hpp"
#include "train_gpt/faults.hpp"
#include "train_gpt/report.hpp"
#ifdef GPIPE_TRAIN_GPT_MPI
#include "gpipe/mpi.hpp"
#endif

namespace {

constexpr std::size_t T = 64, D = 128, H = 4;  // context, width, heads; 4 blocks
using Block = gpipe::TransformerBlock<D, H>;
// K = 4 stages: the embedding and the head (tied to it) cost about one block each.
template <std::size_t V>
using Gpt = gpipe::Pipeline<gpipe::Stage<gpipe::Embedding<V, T, D>, Block>, gpipe::Stage<Block>,
                            gpipe::Stage<Block>,
                            gpipe::Stage<Block, gpipe::LayerNorm<D>, gpipe::Linear<D, V, false>>>;
constexpr std::size_t head_layer = 6;  // Embedding, 4 blocks, LayerNorm, head

// Llama's shape at the same width: 4 query heads on 2 key/value heads, SwiGLU's F about 8/3 D.
constexpr std::size_t KVH = 2, F = 352;
using LlamaLayer = gpipe::LlamaBlock<D, H, KVH, F>;
template <std::size_t V>
using Llama =
    gpipe::Pipeline<gpipe::Stage<gpipe::TokenEmbedding<V, T, D>, LlamaLayer>,
                    gpipe::Stage<LlamaLayer>, gpipe::Stage<LlamaLayer>,
                    gpipe::Stage<LlamaLayer, gpipe::RMSNorm<D>, gpipe::Linear<D, V, false>>>;

// What a run needs to know of each model family: its pipeline for a vocabulary V, ties, file
// names and the parameters nanoGPT's FLOP estimate leaves out. (Llama trains on packed
// documents: main marks them in the corpus.)
struct GptFamily {
  template <std::size_t V>
  using model = Gpt<V>;
  static constexpr const char* name = "GPT";
  static constexpr const char* shape = "4 blocks";
  static std::vector<gpipe::Tie> ties() {
    return {{.parameter = std::to_string(head_layer) + ".weight", .to = "0.wte.weight"}};
  }
  template <class Model>
  static gpipe::NameMap names() {
    return gpipe::nanogpt_names<Model>();  // nanoGPT's
  }
  static constexpr std::size_t embedding_params(std::size_t V) { return (V + T) * D; }
};
struct LlamaFamily {
  template <std::size_t V>
  using model = Llama<V>;
  static constexpr const char* name = "Llama";
  static constexpr const char* shape = "4 LlamaBlocks, 4 heads on 2 key/value heads, F 352";
  static std::vector<gpipe::Tie> ties() { return {}; }
  template <class Model>
  static gpipe::NameMap names() {
    return gpipe::hf_llama_names<Model>();  // Hugging Face's
  }
  static constexpr std::size_t embedding_params(std::size_t V) { return V * D; }
};

#ifdef GPIPE_TRAIN_GPT_MPI
using Backend = gpipe::mpi::Backend;
constexpr bool mpi = true;
#else
using Backend = gpipe::host::Backend;
constexpr bool mpi = false;
#endif

struct Options {
  std::vector<std::filesystem::path> data;
  std::filesystem::path out = "train_gpt_out";
  std::size_t steps = 600, batch = 16, accumulate = 1, micro_batches = 4;
  std::size_t replicas = 0;  // 0: the MPI world's ranks / devices (1 in one process)
  std::size_t devices = 4;   // pipeline devices: 4 (a stage each) or 2 (two stages each)
  double lr = 2e-3, min_lr = 2e-4, weight_decay = 0.1, clip = 1.0;
  std::size_t warmup = 30, eval_every = 50, eval_batches = 4, checkpoint_every = 100;
  std::size_t sample = 300, seed = 1;
  double memory_limit_mib = 0;              // per device; 0: none
  double skip_loss_z = 0, skip_norm_z = 0;  // spike guards' thresholds; 0: off
  bool resume = false, quiet = false, bf16 = false, plan = false;
  bool llama = false;                 // --model llama
  std::string separator = "\\n%\\n";  // --separator, C escapes not yet read
};

const char* const usage = R"(usage: example_train_gpt [options]
  --data PATH            a text file (read as bytes) or an llm.c token shard; repeat for more
                         (default: Debian's fortunes, /usr/share/games/fortunes)
  --out DIR              log.csv, loss.svg, checkpoint/, model.safetensors (default train_gpt_out)
  --model gpt|llama      GPT-2's shape (gpt, the default) or Llama's (a token table, 4 LlamaBlocks
                         of 4 heads on 2 key/value heads, RMSNorm, an untied head; saved under
                         Hugging Face's names), which trains on packed documents: each sample's
                         tokens carry their document (attention and positions stay inside it)
                         and the targets across a border are ignored (-100)
  --separator TEXT       where a document of text ends (--model llama; escapes \n, \t, \\):
                         default "\n%\n", the line between fortune cookies; llm.c shards end
                         documents with GPT-2's <|endoftext|> (50256)
  --steps N              optimizer steps (600)
  --batch B              samples of 64 tokens per forward_backward (16)
  --accumulate A         forward_backward calls per step, gradients averaged (1)
  --micro-batches M      pipeline micro-batches per forward_backward (4)
  --lr LR --min-lr LR    cosine from lr down to min_lr (2e-3, 2e-4)
  --warmup N             steps of linear warmup (30)
  --weight-decay WD      AdamW's, on tensors of 2 or more dimensions only (0.1)
  --clip NORM            global gradient norm clipping, 0 = off (1.0)
  --eval-every N         validation loss every N steps, 0 = only at the end (50)
  --checkpoint-every N   a checkpoint every N steps, 0 = only at the end (100)
  --resume               continue from DIR/checkpoint when there is one
  --sample N             bytes (or tokens) generated at the end (300)
  --seed S               initialization and data order (1)
  --devices K            pipeline devices for the 4 stages: 4, a stage each (1F1B), or 2, two
                         stages each (Interleaved<2>; with --plan the two-chunk schedules) (4)
  --replicas R           data-parallel replicas (example_train_gpt_mpi: K x R ranks; default
                         the world's ranks / K, so that a restart on other ranks needs no edit)
  --quiet                no progress line per step (validation lines only)
  --bf16                 gpipe::MixedBf16: bf16 activations and GEMMs, fp32 master weights
  --plan                 let gpipe::plan choose schedule, micro-batches and remat (per stage)
                         from costs it measures first (under --memory-limit), among the schedules
                         of one stage per device, or of two with --devices 2; prints the plan and
                         why
  --memory-limit MIB     bytes each device may hold, in MiB (the host build also caps its
                         devices at it); 0 = none (0)
  --skip-loss-z Z        skip the update of a step whose loss scores a z-score above Z against
                         the last 128 steps' (llm.c's outlier detector); 0 = off (0)
  --skip-norm-z Z        the same for the gradient norm; 0 = off (0)
                         (a step whose gradients hold a NaN or an inf is always skipped)
A step whose forward_backward fails with a gpipe::Error (a layer that throws) is run again
once (example_train_gpt_mpi: the run ends; --resume continues it). The environment variable
GPIPE_TRAIN_GPT_INJECT injects faults for scripts/soak (testing only; see
examples/train_gpt/faults.hpp).
)";

Options parse(int argc, char** argv) {
  Options o;
  bool separator_given = false;
  const auto number = [](std::string_view flag, const char* text) {
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(v >= 0))
      throw gpipe::Error("train_gpt: " + std::string(flag) + " needs a number >= 0, got \"" + text +
                         "\"");
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (flag == "--resume" || flag == "--quiet" || flag == "--bf16" || flag == "--plan") {
      (flag == "--resume"  ? o.resume
       : flag == "--quiet" ? o.quiet
       : flag == "--bf16"  ? o.bf16
                           : o.plan) = true;
      continue;
    }
    if (i + 1 >= argc) throw gpipe::Error("train_gpt: " + std::string(flag) + " needs a value");
    const char* value = argv[++i];
    const auto count = [&] {
      const double v = number(flag, value);
      if (v != std::floor(v) || v > 0x1p53)
        throw gpipe::Error("train_gpt: " + std::string(flag) + " needs a whole number, got \"" +
                           value + "\"");
      return static_cast<std::size_t>(v);
    };
    if (flag == "--data")
      o.data.emplace_back(value);
    else if (flag == "--model") {
      if (std::string_view(value) != "gpt" && std::string_view(value) != "llama")
        throw gpipe::Error("train_gpt: --model is gpt or llama, got \"" + std::string(value) +
                           "\"");
      o.llama = std::string_view(value) == "llama";
    } else if (flag == "--separator") {
      o.separator = value;
      separator_given = true;
    } else if (flag == "--out")
      o.out = value;
    else if (flag == "--steps")
      o.steps = count();
    else if (flag == "--batch")
      o.batch = count();
    else if (flag == "--accumulate")
      o.accumulate = count();
    else if (flag == "--micro-batches")
      o.micro_batches = count();
    else if (flag == "--lr")
      o.lr = number(flag, value);
    else if (flag == "--min-lr")
      o.min_lr = number(flag, value);
    else if (flag == "--warmup")
      o.warmup = count();
    else if (flag == "--weight-decay")
      o.weight_decay = number(flag, value);
    else if (flag == "--clip")
      o.clip = number(flag, value);
    else if (flag == "--eval-every")
      o.eval_every = count();
    else if (flag == "--checkpoint-every")
      o.checkpoint_every = count();
    else if (flag == "--sample")
      o.sample = count();
    else if (flag == "--seed")
      o.seed = count();
    else if (flag == "--devices") {
      o.devices = count();
      if (o.devices != 4 && o.devices != 2)
        throw gpipe::Error(
            "train_gpt: --devices is 4 (a stage per device) or 2 (two stages per device), got " +
            std::string(value));
    } else if (flag == "--replicas") {
      o.replicas = count();
      if (o.replicas == 0) throw gpipe::Error("train_gpt: --replicas must be >= 1");
    } else if (flag == "--memory-limit")
      o.memory_limit_mib = number(flag, value);
    else if (flag == "--skip-loss-z")
      o.skip_loss_z = number(flag, value);
    else if (flag == "--skip-norm-z")
      o.skip_norm_z = number(flag, value);
    else
      throw gpipe::Error("train_gpt: unknown option " + std::string(flag) + "\n" + usage);
  }
  if (o.steps == 0 || o.batch == 0 || o.accumulate == 0)
    throw gpipe::Error("train_gpt: --steps, --batch and --accumulate must be >= 1");
  if (o.separator.empty()) throw gpipe::Error("train_gpt: --separator needs at least one byte");
  if (separator_given && !o.llama)
    throw gpipe::Error(
        "train_gpt: --separator packs documents for --model llama; the GPT trains "
        "on windows of the text as it is");
  if (o.data.empty()) o.data = train_gpt::fortune_files();
  return o;
}

// Mean cross-entropy of logits (rows, V) against the targets not ignored, in double.
double cross_entropy(const std::vector<float>& logits, const std::vector<std::int32_t>& targets,
                     std::size_t V) {
  double sum = 0;
  std::size_t counted = 0;
  for (std::size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == gpipe::ignore_index) continue;
    ++counted;
    const float* row = logits.data() + r * V;
    const float max = *std::max_element(row, row + V);
    double z = 0;
    for (std::size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v] - max));
    sum += std::log(z) - (row[targets[r]] - max);
  }
  return sum / static_cast<double>(counted);
}

template <class Family, class Trainer>
class Run {
 public:
  static constexpr std::size_t V = Trainer::model_type::vocab_size;

  // `plan`: gpipe::plan's choice of schedule, micro-batches and remat (else 1F1B, o's M).
  Run(Backend& backend, const Options& o, const train_gpt::Corpus& corpus, bool prints,
      const gpipe::Plan* plan)
      : o_(o),
        corpus_(corpus),
        prints_(prints),
        trainer_(backend, trainer_options(o, plan)),
        lr_({.max_lr = o.lr,
             .min_lr = std::min(o.min_lr, o.lr),
             .warmup_steps = std::min(o.warmup, o.steps - 1),
             .total_steps = o.steps}),
        adamw_({.beta1 = 0.9,
                .beta2 = 0.95,
                .weight_decay = o.weight_decay,
                .decay = gpipe::optim::Decay::matrices}) {}

  static typename Trainer::Options trainer_options(const Options& o, const gpipe::Plan* plan) {
    typename Trainer::Options options{};
    if (plan != nullptr)
      options = *plan;  // micro_batches, remat (per stage), schedule
    else
      options.micro_batches = o.micro_batches;
    options.seed = o.seed;
    options.skip_non_finite = true;
    options.ties = Family::ties();
    return options;
  }

  int train() {
    std::filesystem::create_directories(o_.out);
    const std::filesystem::path checkpoint = o_.out / "checkpoint", log = o_.out / "log.csv";
    std::size_t first = 0;
    if (o_.resume && std::filesystem::exists(checkpoint)) {
      first = std::stoul(trainer_.load_checkpoint(checkpoint).at("next_step"));
      say("resumed from %s at step %zu\n", checkpoint.c_str(), first);
    }
    rows_ = first > 0 ? train_gpt::read_log(log, first) : std::vector<train_gpt::LogRow>{};
    if (prints_) train_gpt::write_log(log, rows_);
    const double peak = peak_flops();
    const double first_validation = validation_loss();
    say("step %5zu  validation loss %.4f (a uniform guess: %.4f)\n", first, first_validation,
        std::log(static_cast<double>(V)));
    train_gpt::Batch batch;
    for (std::size_t step = first; step < o_.steps; ++step) {
      double loss = 0, bubble = 0;
      for (int attempt = 0;; ++attempt) {
        try {
          loss = bubble = 0;
          if (faults_.thrown.count(step + 1) > 0 && attempt == 0) inject_throw(step + 1);
          for (std::size_t a = 0; a < o_.accumulate; ++a) {
            train_gpt::training_batch(corpus_, o_.seed, step, a, o_.batch, T, batch);
            loss += batch.documents.empty()
                        ? trainer_.forward_backward(batch.x, batch.y)
                        : trainer_.forward_backward(batch.x, batch.y, batch.documents);
            bubble += trainer_.last_step().bubble_fraction;
          }
          break;
        } catch (const gpipe::Error& e) {
          // under MPI the failure ends every rank's run, resumed from the last checkpoint
          if (mpi || attempt > 0) throw;
          say("step %5zu failed, running it again: %s\n", step + 1, e.what());
          trainer_.zero_grad();  // a failed step leaves the gradients unspecified
        }
      }
      if (faults_.nan.count(step + 1) > 0) {  // overflow to inf, then inf * 0
        trainer_.scale_gradients(std::numeric_limits<float>::max());
        trainer_.scale_gradients(std::numeric_limits<float>::max());
        trainer_.scale_gradients(0.0);
      }
      const double accumulated = static_cast<double>(o_.accumulate);
      if (o_.accumulate > 1) trainer_.scale_gradients(1.0 / accumulated);
      const double norm = trainer_.clip_grad_norm(o_.clip > 0 ? o_.clip : INFINITY);
      adamw_.options.lr = lr_(step);
      const double mean_loss = loss / static_cast<double>(o_.accumulate);
      const bool spike = (o_.skip_loss_z > 0 && loss_guard_.z_score(mean_loss) > o_.skip_loss_z) ||
                         (o_.skip_norm_z > 0 && norm_guard_.z_score(norm) > o_.skip_norm_z);
      if (spike || faults_.skip.count(step + 1) > 0) {
        trainer_.skip_step();
      } else {
        loss_guard_.add(mean_loss);
        norm_guard_.add(norm);
        trainer_.step(adamw_);  // skips it where a gradient is not finite
      }
      if (trainer_.last_step_skipped())
        say("step %5zu: update skipped (loss z-score %.1f, norm z-score %.1f%s)\n", step + 1,
            loss_guard_.z_score(mean_loss), norm_guard_.z_score(norm),
            std::isfinite(norm) ? "" : ", a gradient is not finite");
      // the step over every rank: from the first forward_backward to the last rank's step()
      const double ms = 1e3 * trainer_.last_step_seconds();
      trainer_.zero_grad();
      train_gpt::LogRow row{.step = step,
                            .loss = loss / accumulated,
                            .lr = adamw_.options.lr,
                            .norm = norm,
                            .ms = ms,
                            .validation = NAN};
      const bool last = step + 1 == o_.steps;
      if (last || (o_.eval_every > 0 && (step + 1) % o_.eval_every == 0))
        row.validation = validation_loss();
      const double tokens = static_cast<double>(o_.accumulate * o_.batch * T);
      if (!o_.quiet || !std::isnan(row.validation))
        say("step %5zu/%zu | loss %.4f | lr %.2e | norm %.3f | %6.0f tok/s | %6.1f ms | bubble "
            "%2.0f%% | %4.1f%% of GEMM peak%s\n",
            step + 1, o_.steps, row.loss, row.lr, row.norm, tokens / ms * 1e3, ms,
            100 * bubble / accumulated, 100 * tokens * flops_per_token() / (ms * 1e-3) / peak,
            std::isnan(row.validation)
                ? ""
                : (" | validation " + std::to_string(row.validation).substr(0, 6)).c_str());
      rows_.push_back(row);
      if (prints_) std::ofstream(log, std::ios::app) << train_gpt::log_line(row);
      if (last || (o_.checkpoint_every > 0 && (step + 1) % o_.checkpoint_every == 0))
        trainer_.save_checkpoint(checkpoint, {{"next_step", std::to_string(step + 1)}});
    }
    trainer_.save(o_.out / "model.safetensors",
                  Family::template names<typename Trainer::model_type>());
    if (prints_) {
      train_gpt::write_loss_curve(
          o_.out / "loss.svg", rows_,
          "gpipe train_gpt: " + std::string(Family::name) + " loss per step (" +
              std::to_string(Trainer::model_type::num_params) + " parameters)");
      std::printf("wrote %s, %s and %s\n", log.c_str(), (o_.out / "loss.svg").c_str(),
                  (o_.out / "model.safetensors").c_str());
      if (trainer_.skipped_steps() > 0)
        std::printf("%zu of the updates skipped\n", trainer_.skipped_steps());
    }
    write_sample();
    // (a run resumed at its end has no step of its own; its log, if kept, has the last one)
    const double final_validation = rows_.empty() ? validation_loss() : rows_.back().validation;
    say("validation loss %.4f at step %zu, %.4f at the end: the validation loss is %s\n",
        first_validation, first, final_validation,
        final_validation < first_validation ? "lower" : "not lower");
    return 0;
  }

 private:
  template <class... Args>
  void say(const char* format, Args... args) const {
    if (!prints_) return;
    std::printf(format, args...);
    std::fflush(stdout);
  }

  // A fault for GPIPE_TRAIN_GPT_INJECT's throw@STEP: work on stage 1's device that throws before
  // the step's own work there (one process only, see train_gpt/faults.hpp).
  void inject_throw(std::size_t step) {
    const std::size_t device = trainer_.device_of_stage(1);
    const std::filesystem::path mark = o_.out / ("fault-thrown-" + std::to_string(step));
    if (std::filesystem::exists(mark)) return;
    std::ofstream{mark};
    trainer_.backend().submit(device,
                              {.what = "injected fault (GPIPE_TRAIN_GPT_INJECT)", .stage = 1},
                              [](auto&) { throw std::runtime_error("a layer threw"); });
  }

  // nanoGPT's estimate: 6 N + 12 L D T per token, N without the embeddings (GPT's tied head's
  // GEMM is counted once, as N holds the head's copy of the tensor).
  static double flops_per_token() {
    const double n =
        static_cast<double>(Trainer::model_type::num_params - Family::embedding_params(V));
    return 6 * n + 12.0 * 4 * D * T;
  }
  // The GEMM peak of the cores this run uses. Threads: one thread's measured rate times the
  // devices (at most the machine's cores). Ranks: the sum of the rates all ranks measure at once
  // (ranks that share a core share its rate).
  double peak_flops() const {
#ifdef GPIPE_TRAIN_GPT_MPI
    MPI_Barrier(MPI_COMM_WORLD);
    const double mine = train_gpt::measure_gemm_flops();
    double total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    say("GEMM peak: %.1f GFLOP/s, the sum of the %zu ranks' measured rates\n", total * 1e-9,
        trainer_.backend().world_size());
    return total;
#else
    const double one = train_gpt::measure_gemm_flops();
    const std::size_t cores =
        std::min<std::size_t>(o_.devices, std::max(1u, std::thread::hardware_concurrency()));
    say("GEMM peak: %.1f GFLOP/s per core (measured) x %zu cores\n", one * 1e-9, cores);
    return one * static_cast<double>(cores);
#endif
  }

  // Mean loss on eval_batches fixed batches of the held-out tokens (forward only).
  double validation_loss() {
    gpipe::Rng rng(o_.seed + 12345);
    train_gpt::Batch b;
    double sum = 0;
    for (std::size_t i = 0; i < o_.eval_batches; ++i) {
      train_gpt::draw_batch(corpus_.validation, corpus_.validation_documents,
                            std::min<std::size_t>(o_.batch, 8), T, rng, b);
      sum += cross_entropy(
          b.documents.empty() ? trainer_.predict(b.x) : trainer_.predict(b.x, b.documents), b.y, V);
    }
    return sum / static_cast<double>(o_.eval_batches);
  }

  // o_.sample tokens after a T-token prompt of held-out text, each drawn from softmax(logits /
  // 0.8) at the last position. With documents the prompt is the first half of a held-out
  // document (the context's earlier tokens are other documents, which attention does not see),
  // and the model writes until it ends that document with a separator: a document's first token
  // is never a target, so what would follow one is not learned.
  void write_sample() {
    if (o_.sample == 0) return;
    const std::vector<std::int32_t>& held_out = corpus_.validation;
    const std::vector<std::int32_t>& held_out_documents = corpus_.validation_documents;
    std::size_t end = T, begin = 0;  // the prompt, held_out[begin, end)
    if (!held_out_documents.empty()) {
      // the first document with T tokens before it: its first half (at least one token)
      begin = static_cast<std::size_t>(
          std::find_if(held_out_documents.begin() + static_cast<std::ptrdiff_t>(T),
                       held_out_documents.end(), [&](std::int32_t d) { return d > 0; }) -
          held_out_documents.begin());
      begin = std::max<std::size_t>(T, begin);
      if (begin >= held_out.size()) begin = T;  // (one document: the held-out text's middle)
      std::size_t length = 1;
      while (begin + length < held_out.size() &&
             held_out_documents[begin + length] == held_out_documents[begin])
        ++length;
      end = begin + std::max<std::size_t>(1, length / 2);
    }
    const auto at = [&](std::size_t i) {
      return held_out.begin() + static_cast<std::ptrdiff_t>(i);
    };
    std::vector<std::int32_t> context(at(end - T), at(end));
    const std::vector<std::int32_t> prompt(at(begin), at(end));
    std::vector<std::int32_t> documents;  // the context's
    if (!held_out_documents.empty())
      documents.assign(held_out_documents.begin() + static_cast<std::ptrdiff_t>(end - T),
                       held_out_documents.begin() + static_cast<std::ptrdiff_t>(end));
    std::vector<std::int32_t> written = prompt;  // the document: the prompt, then the model's
    gpipe::Rng rng(o_.seed + 99);
    std::vector<std::int32_t> out;
    std::vector<double> p(V);
    for (std::size_t i = 0; i < o_.sample; ++i) {
      const std::vector<float> logits =
          documents.empty() ? trainer_.predict(context) : trainer_.predict(context, documents);
      const float* row = logits.data() + (T - 1) * V;
      const float max = *std::max_element(row, row + V);
      double z = 0;
      for (std::size_t v = 0; v < V; ++v) z += p[v] = std::exp((row[v] - max) / 0.8);
      double u = rng.uniform(0, 1) * z;
      std::size_t next = 0;
      while (next + 1 < V && (u -= p[next]) > 0) ++next;
      out.push_back(static_cast<std::int32_t>(next));
      context.erase(context.begin());
      context.push_back(static_cast<std::int32_t>(next));
      if (documents.empty()) continue;
      written.push_back(static_cast<std::int32_t>(next));
      if (train_gpt::ends_with(written, written.size(), corpus_.separator)) break;  // its end
      documents.erase(documents.begin());
      documents.push_back(documents.back());
    }
    if (!prints_) return;
    const auto text = [&](const std::vector<std::int32_t>& ids) {
      std::string s;
      for (const std::int32_t id : ids)
        s += corpus_.bytes ? std::string(1, static_cast<char>(id)) : std::to_string(id) + " ";
      return s;
    };
    std::printf("\n--- prompt (held-out %s) ---\n%s\n--- the model goes on ---\n%s\n",
                corpus_.bytes ? "text" : "token ids", text(prompt).c_str(), text(out).c_str());
  }

  const Options& o_;
  const train_gpt::Corpus& corpus_;
  bool prints_;
  Trainer trainer_;
  gpipe::optim::WarmupCosine lr_;
  gpipe::optim::AdamW adamw_;
  // the last 128 updates' losses and norms, for --skip-loss-z and --skip-norm-z
  gpipe::optim::SpikeGuard loss_guard_{{.window = 128, .threshold = 5}};
  gpipe::optim::SpikeGuard norm_guard_{{.window = 128, .threshold = 5}};
  std::vector<train_gpt::LogRow> rows_;
  train_gpt::Faults faults_ = train_gpt::Faults::from_environment(mpi);
};

template <class Family, std::size_t V, class Precision>
int train(Backend& backend, const Options& o, const train_gpt::Corpus& corpus, bool prints) {
  using Loss = gpipe::SoftmaxCrossEntropy;
  using Model = typename Family::template model<V>;
  // two stages per device: PlannedSchedule<2> runs a plan's schedule, and without one
  // Interleaved<2>'s (one Trainer type for both, which keeps the compile time down)
  using TwoPerDevice = gpipe::Trainer<Model, Loss, Backend, gpipe::PlannedSchedule<2>, Precision>;
  const auto limit = static_cast<std::size_t>(o.memory_limit_mib * (1 << 20));
  const std::string stages = o.devices == 4 ? "4 stages" : "4 stages on 2 devices (two each)";
  if (!o.plan) {
    if (prints)
      std::printf(
          "%s: %zu parameters (vocabulary %zu, T %zu, D %zu, %s), %s, %s, M = %zu, %zu x %zu "
          "samples per step, %s\n",
          Family::name, Model::num_params, V, T, D, Family::shape, stages.c_str(),
          o.devices == 4 ? "1F1B" : "Interleaved<2>", o.micro_batches, o.accumulate, o.batch,
          std::string(Precision::name).c_str());
    if (o.devices == 2)
      return Run<Family, TwoPerDevice>(backend, o, corpus, prints, nullptr).train();
    using Trainer = gpipe::Trainer<Model, Loss, Backend, gpipe::OneFOneB, Precision>;
    return Run<Family, Trainer>(backend, o, corpus, prints, nullptr).train();
  }
  // the plan, from costs measured on a batch of the training data; every rank gets the same
  train_gpt::Batch batch;
  train_gpt::training_batch(corpus, o.seed, 0, 0, o.batch, T, batch);
  gpipe::PlanOptions options{.optimizer_state_per_param = 2};  // AdamW
  if (limit > 0) options.device_limit = {limit};
  const gpipe::Plan plan = gpipe::plan<Model, Loss, Precision>(backend, batch.x, batch.y, options);
  if (prints) {
    std::printf(
        "%s: %zu parameters (vocabulary %zu, T %zu, D %zu, %s), %s, %zu x %zu samples per step, "
        "%s\n",
        Family::name, Model::num_params, V, T, D, Family::shape, stages.c_str(), o.accumulate,
        o.batch, std::string(Precision::name).c_str());
    // the choice and the ten fastest candidates, with why each was not chosen
    const std::string text = plan.describe();
    std::size_t end = 0;
    for (int line = 0; line < 12 && end != std::string::npos; ++line)
      end = text.find('\n', end == 0 ? 0 : end + 1);
    std::printf("%s\n  ... %zu candidates in all\n", text.substr(0, end).c_str(),
                plan.candidates.size());
  }
  if (plan.chunks_per_device() == 2)
    return Run<Family, TwoPerDevice>(backend, o, corpus, prints, &plan).train();
  using Trainer = gpipe::Trainer<Model, Loss, Backend, gpipe::SearchedSchedule, Precision>;
  return Run<Family, Trainer>(backend, o, corpus, prints, &plan).train();
}

template <std::size_t V>
int train(Backend& backend, const Options& o, const train_gpt::Corpus& corpus, bool prints) {
  if (o.llama)
    return o.bf16 ? train<LlamaFamily, V, gpipe::MixedBf16>(backend, o, corpus, prints)
                  : train<LlamaFamily, V, gpipe::Fp32>(backend, o, corpus, prints);
  return o.bf16 ? train<GptFamily, V, gpipe::MixedBf16>(backend, o, corpus, prints)
                : train<GptFamily, V, gpipe::Fp32>(backend, o, corpus, prints);
}

}  // namespace

int main(int argc, char** argv) try {
  Options o = parse(argc, argv);
#ifdef GPIPE_TRAIN_GPT_MPI
  gpipe::mpi::Session session(argc, argv);  // the world's size before the backend's layout
  if (o.replicas == 0) {
    int ranks = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    o.replicas = std::max<std::size_t>(1, static_cast<std::size_t>(ranks) / o.devices);
  }
  Backend backend(argc, argv, {.data_parallel = o.replicas});
  if (backend.num_devices() != o.devices)
    throw gpipe::Error("train_gpt: --devices " + std::to_string(o.devices) + " and " +
                       std::to_string(o.replicas) + " replica(s) need " +
                       std::to_string(o.devices * o.replicas) + " ranks, got " +
                       std::to_string(backend.world_size()));
  const bool prints = backend.rank() == 0;
#else
  if (o.replicas > 1)
    throw gpipe::Error("train_gpt: --replicas needs MPI: run example_train_gpt_mpi under mpirun");
  Backend backend(o.devices,
                  {.device_capacity = static_cast<std::size_t>(o.memory_limit_mib * (1 << 20))});
  const bool prints = true;
#endif
  train_gpt::Corpus corpus = train_gpt::load_corpus(o.data, T + 1);
  if (prints)
    std::printf("%zu training and %zu held-out tokens from %zu files (%s)\n", corpus.train.size(),
                corpus.validation.size(), corpus.files,
                corpus.bytes ? "text, as bytes" : "llm.c token shards");
  if (o.llama) {
    constexpr std::int32_t end_of_text = 50256;  // GPT-2's <|endoftext|>
    train_gpt::mark_documents(corpus, corpus.bytes ? train_gpt::separator_bytes(o.separator)
                                                   : std::vector<std::int32_t>{end_of_text});
    if (prints)
      std::printf("packed documents: %d training and %d held-out ones, ended by %s\n",
                  corpus.train_documents.back() + 1, corpus.validation_documents.back() + 1,
                  corpus.bytes ? ("\"" + o.separator + "\"").c_str() : "<|endoftext|> (50256)");
  }
  return corpus.bytes ? train<256>(backend, o, corpus, prints)
                      : train<50304>(backend, o, corpus, prints);
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
