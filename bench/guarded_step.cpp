// What the long-run safeguards cost a healthy training step (issue 48: at most 1 %): a step of a
// small GPT-shaped model on the host backend with Trainer::Options::skip_non_finite and the
// loss-spike guards (gpipe::optim::SpikeGuard on the loss and the gradient norm, as
// examples/train_gpt's --skip-loss-z and --skip-norm-z) against the same step without them.
//   model   V = 4096, T = 128, D = 256, H = 4: embedding, 4 blocks, LayerNorm, head; batch 8
//           samples; K = 2 ([embedding, 3 blocks] [block, LayerNorm, head]), M = 4, 1F1B
//   step    zero_grad, forward_backward, then clip:1: clip_grad_norm(1.0) and step(AdamW), as a
//           training run does (skip_non_finite then reuses the clipping's norm); clip:0:
//           step(AdamW) alone (skip_non_finite then takes the norm itself: one more pass over
//           the gradients)
//   method  two trainers of the same model and seed on one backend, guarded and plain, on the
//           same batch; `rounds` rounds of `steps` steps each, the two in alternating order
//           (ABBA), so that drift of the machine's speed falls on both alike
// Counters: plain_ms and guarded_ms (mean step), ratio (guarded / plain, the median over the
// rounds), ratio_min and ratio_max (its spread over the rounds); norm_share: one pass of the
// gradient norm (clip_grad_norm(inf), which scales nothing) over plain_ms, timed apart: what
// skip_non_finite adds to a step without clipping, in theory.
// Flags: --rounds=N (10) and --steps=N (10 steps of each trainer per round).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gpipe/gpipe.hpp>
#include <vector>

namespace {

constexpr std::size_t V = 4096, T = 128, D = 256, H = 4, samples = 8, M = 4;
using Block = gpipe::TransformerBlock<D, H>;
using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Embedding<V, T, D>, Block, Block, Block>,
                              gpipe::Stage<Block, gpipe::LayerNorm<D>, gpipe::Linear<D, V>>>;
using Trainer = gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend>;

long rounds = 10, steps = 10;  // --rounds, --steps

struct Guards {
  gpipe::optim::SpikeGuard loss{{.window = 128, .threshold = 5}};
  gpipe::optim::SpikeGuard norm{{.window = 128, .threshold = 5}};
};

// One training step; with `guards`, as examples/train_gpt's loop with both spike guards on.
void train_step(Trainer& trainer, bool clip, Guards* guards, const std::vector<std::int32_t>& x,
                const std::vector<std::int32_t>& y, const gpipe::optim::AdamW& adamw) {
  trainer.zero_grad();
  const double loss = trainer.forward_backward(x, y);
  const double norm = clip ? trainer.clip_grad_norm(1.0) : 0.0;
  if (guards != nullptr && (guards->loss.z_score(loss) > 5 || guards->norm.z_score(norm) > 5)) {
    trainer.skip_step();
    return;
  }
  if (guards != nullptr) {
    guards->loss.add(loss);
    guards->norm.add(norm);
  }
  trainer.step(adamw);
}

void BM_GuardedStep(benchmark::State& state) {
  const bool clip = state.range(0) != 0;
  gpipe::host::Backend backend(2);
  gpipe::Rng rng(3);
  std::vector<std::int32_t> x(samples * T), y(samples * T);
  for (auto& t : x) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (auto& t : y) t = static_cast<std::int32_t>(rng.next_u64() % V);
  // a learning rate of 0: both trainers keep the same weights, so their steps stay alike
  const gpipe::optim::AdamW adamw({.lr = 0.0});
  Trainer plain(backend, {.micro_batches = M, .seed = 1});
  Trainer guarded(backend, {.micro_batches = M, .seed = 1, .skip_non_finite = true});
  Guards guards;
  for (int i = 0; i < 2; ++i) {  // warm-up: pages faulted in, the guards' windows started
    train_step(plain, clip, nullptr, x, y, adamw);
    train_step(guarded, clip, &guards, x, y, adamw);
  }
  using Clock = std::chrono::steady_clock;
  auto time = [&](bool with_guards) {
    const auto start = Clock::now();
    for (long i = 0; i < steps; ++i)
      train_step(with_guards ? guarded : plain, clip, with_guards ? &guards : nullptr, x, y, adamw);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  std::vector<double> ratios;
  double plain_s = 0, guarded_s = 0;
  for (auto _ : state) {
    for (long r = 0; r < rounds; ++r) {
      double p = 0, g = 0;
      if (r % 2 == 0) {
        p = time(false);
        g = time(true);
      } else {
        g = time(true);
        p = time(false);
      }
      plain_s += p;
      guarded_s += g;
      ratios.push_back(g / p);
    }
  }
  std::sort(ratios.begin(), ratios.end());
  const double n = static_cast<double>(ratios.size()) * static_cast<double>(steps);
  state.counters["plain_ms"] = 1e3 * plain_s / n;
  state.counters["guarded_ms"] = 1e3 * guarded_s / n;
  state.counters["ratio"] = ratios[ratios.size() / 2];
  state.counters["ratio_min"] = ratios.front();
  state.counters["ratio_max"] = ratios.back();
  state.counters["skipped"] = static_cast<double>(guarded.skipped_steps());
  const auto norm_start = Clock::now();
  for (int i = 0; i < 5; ++i) benchmark::DoNotOptimize(plain.clip_grad_norm(INFINITY));
  const double norm_ms = 1e3 / 5 * std::chrono::duration<double>(Clock::now() - norm_start).count();
  state.counters["norm_share"] = norm_ms / state.counters["plain_ms"];
}

BENCHMARK(BM_GuardedStep)
    ->ArgNames({"clip"})
    ->Args({1})
    ->Args({0})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

// --rounds=N and --steps=N (whole numbers >= 1), taken out of argv before Google Benchmark's.
extern "C" int gpipe_bench_preparse(int* argc, char** argv) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    long* value = std::strncmp(argv[i], "--rounds=", 9) == 0  ? &rounds
                  : std::strncmp(argv[i], "--steps=", 8) == 0 ? &steps
                                                              : nullptr;
    if (value == nullptr) {
      argv[out++] = argv[i];
      continue;
    }
    const char* text = std::strchr(argv[i], '=') + 1;
    char* end = nullptr;
    *value = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || *value < 1) {
      std::fprintf(stderr, "bench_guarded_step: %.*s needs a whole number >= 1\n",
                   static_cast<int>(text - argv[i] - 1), argv[i]);
      return 1;
    }
  }
  *argc = out;
  return 0;
}
