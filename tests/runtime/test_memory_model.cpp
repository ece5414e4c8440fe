// The memory model against the host backend's byte counts: measured peak activation bytes equal
// the prediction exactly on every device; the total peak stays within the predicted bound;
// `always` cuts a deep stage's activations by the factor GPipe's formula gives; Checkpoint
// recomputes only its segment and changes no gradient; attention's stash does not grow with T.

#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/memory_model.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

constexpr std::size_t width = 16;
constexpr std::size_t depth = 6;  // layers of the deep stage
// Stage 0: `depth` Linear layers of equal width; stage 1: the classifier.
using DeepModel =
    Pipeline<repeat_stage_t<Linear<width, width>, depth>, Stage<ReLU, Linear<width, 4>>>;
// The same layers with the middle of stage 0 checkpointed.
using CheckpointedModel = Pipeline<Stage<Linear<width, width>,
                                         Checkpoint<Linear<width, width>, Linear<width, width>,
                                                    Linear<width, width>, Linear<width, width>>,
                                         Linear<width, width>>,
                                   Stage<ReLU, Linear<width, 4>>>;

// Each stage s under stage_remat[s] (Trainer::Options::stage_remat).
template <class Model, class Schedule = GPipe>
void check_prediction(std::size_t rows, std::size_t m, const std::vector<Remat>& stage_remat) {
  CAPTURE(rows);
  CAPTURE(m);
  std::string policies;
  for (const Remat r : stage_remat) policies += std::string(to_string(r)) + " ";
  CAPTURE(policies);
  const std::vector<float> x = random_inputs(rows, Model::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 2);
  host::Backend backend(Model::num_stages / Schedule::chunks_per_device);
  Trainer<Model, SoftmaxCrossEntropy, host::Backend, Schedule> trainer(
      backend, {.micro_batches = m, .stage_remat = stage_remat});
  const auto predicted = predict_memory<Model>(trainer.schedule(), rows, stage_remat);
  backend.reset_peak();
  trainer.forward_backward(x, y);
  for (std::size_t d = 0; d < backend.num_devices(); ++d) {
    CAPTURE(d);
    const MemoryStats stats = backend.memory_stats(d);
    CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
    CHECK(stats.current_of(MemoryKind::parameters) == predicted[d].parameters);
    CHECK(stats.current_of(MemoryKind::gradients) == predicted[d].gradients);
    CHECK(stats.current_of(MemoryKind::activations) == 0);
    CHECK(stats.current_of(MemoryKind::workspace) == 0);
    CHECK(stats.peak <= predicted[d].total_bound());
    CHECK(stats.peak >=
          predicted[d].parameters + predicted[d].gradients + predicted[d].activations_peak);
  }
}

template <class Model, class Schedule = GPipe>
void check_prediction(std::size_t rows, std::size_t m, Remat remat) {
  check_prediction<Model, Schedule>(rows, m, std::vector<Remat>(Model::num_stages, remat));
}

// predict() runs the inference program of the trainer's schedule: its measured activations peak
// equals predict_memory's replay of that program, and nothing stays allocated.
template <class Model, class Schedule = GPipe>
void check_inference_prediction(std::size_t rows, std::size_t m) {
  CAPTURE(rows);
  CAPTURE(m);
  const std::vector<float> x = random_inputs(rows, Model::in_features, 1);
  host::Backend backend(Model::num_stages / Schedule::chunks_per_device);
  Trainer<Model, SoftmaxCrossEntropy, host::Backend, Schedule> trainer(backend,
                                                                       {.micro_batches = m});
  const auto predicted =
      predict_memory<Model>(inference_schedule_for(trainer.schedule(), m), rows, Remat::never);
  backend.reset_peak();
  (void)trainer.predict(x);
  for (std::size_t d = 0; d < backend.num_devices(); ++d) {
    CAPTURE(d);
    const MemoryStats stats = backend.memory_stats(d);
    CHECK(predicted[d].activations_peak > 0);
    CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
    CHECK(stats.current_of(MemoryKind::activations) == 0);
    CHECK(stats.current_of(MemoryKind::workspace) == 0);
  }
}

}  // namespace

TEST_CASE("the executor and predict_memory read one table of what each op allocates and frees") {
  using detail::OpBuffers;
  using detail::SlotBuffer;
  // every buffer a training op allocates is freed by a later op of the same slot (or by the op
  // itself), whatever the stage's position and remat
  for (const bool first : {false, true})
    for (const bool last : {false, true})
      for (const Remat remat : {Remat::never, Remat::always, Remat::selective}) {
        const detail::OpSituation at{.first_stage = first,
                                     .last_stage = last,
                                     .recomputed = recomputes(remat, 0, 2),
                                     .cheap_recomputed = recomputes_cheap_part(remat, 0, 2),
                                     .has_stash = true,
                                     .has_cheap_stash = true,
                                     .skips_input_gradient = true};
        int live[detail::num_slot_buffers] = {};
        for (const OpKind kind : {OpKind::recv_activation, OpKind::forward, OpKind::send_activation,
                                  OpKind::recv_gradient, OpKind::backward_input,
                                  OpKind::send_gradient, OpKind::backward_weight}) {
          if ((kind == OpKind::recv_activation || kind == OpKind::send_gradient) && first) continue;
          if ((kind == OpKind::send_activation || kind == OpKind::recv_gradient) && last) continue;
          const OpBuffers b = detail::buffers_of(kind, at);
          for (std::size_t i = 0; i < b.num_allocates; ++i)
            CHECK(++live[static_cast<std::size_t>(b.allocates[i].buffer)] == 1);
          for (std::size_t i = 0; i < b.num_frees; ++i)
            live[static_cast<std::size_t>(b.frees[i])] = 0;
        }
        for (const int l : live) CHECK(l == 0);
      }
  // an inference forward leaves only the output on its way on
  const OpBuffers f =
      detail::buffers_of(OpKind::forward, {.first_stage = true, .forward_only = true});
  CHECK(f.num_allocates == 4);
  CHECK(f.num_frees == 3);
}

TEST_CASE("predict's measured activations equal the memory model of its inference program") {
  for (std::size_t m : {1u, 3u, 8u}) {
    check_inference_prediction<Model2>(12, m);
    check_inference_prediction<Model4>(12, m);
    check_inference_prediction<DeepModel>(16, m);
  }
}

TEST_CASE("measured peak activation bytes equal the memory model on every device") {
  for (Remat remat : {Remat::never, Remat::always, Remat::except_last, Remat::selective}) {
    for (std::size_t m : {1u, 3u, 8u}) {
      check_prediction<Model2>(12, m, remat);
      check_prediction<Model4>(12, m, remat);
      check_prediction<DeepModel>(16, m, remat);
      check_prediction<CheckpointedModel>(16, m, remat);
    }
  }
}

TEST_CASE("a remat policy per stage: measured peaks equal the memory model on every device") {
  // 1F1B's stage d holds K - d micro-batches' stashes: the first stages recompute, the last keeps
  // everything. Each device's peak depends on its own stages' policies only.
  const std::vector<Remat> mix = {Remat::always, Remat::selective, Remat::never};
  for (std::size_t m : {1u, 3u, 6u}) {
    check_prediction<Model3, OneFOneB>(12, m, mix);
    check_prediction<Model3, GPipe>(12, m, {Remat::never, Remat::except_last, Remat::selective});
    check_prediction<Model4, ZeroBubbleH1>(
        16, m, {Remat::selective, Remat::always, Remat::never, Remat::except_last});
    check_prediction<Model4, Interleaved<2>>(
        16, m, {Remat::always, Remat::never, Remat::selective, Remat::never});
  }
  // the mix's prediction is each device's under its own stage's uniform policy
  const Schedule schedule = OneFOneB::make(3, 6);
  const auto mixed = predict_memory<Model3>(schedule, 12, mix);
  for (std::size_t d = 0; d < 3; ++d) {
    CAPTURE(d);
    const auto uniform = predict_memory<Model3>(schedule, 12, mix[d]);
    CHECK(mixed[d].activations_peak == uniform[d].activations_peak);
    CHECK(mixed[d].total_bound() == uniform[d].total_bound());
  }
}

TEST_CASE("a remat policy per stage: a wrong length or a second policy beside it is an Error") {
  host::Backend backend(3);
  using T3 = Trainer<Model3, SoftmaxCrossEntropy, host::Backend, OneFOneB>;
  const auto message = [&](T3::Options options) {
    try {
      T3 trainer(backend, std::move(options));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string length =
      message({.micro_batches = 2, .stage_remat = {Remat::always, Remat::never}});
  CAPTURE(length);
  CHECK(length.find("stage_remat has 2 policies, expected one per stage: 3") != std::string::npos);
  const std::string both = message({.micro_batches = 2,
                                    .remat = Remat::always,
                                    .stage_remat = {Remat::never, Remat::never, Remat::never}});
  CAPTURE(both);
  CHECK(both.find("remat is always") != std::string::npos);
  CHECK_THROWS_AS(predict_memory<Model3>(OneFOneB::make(3, 2), 12, std::vector<Remat>(2)), Error);
  // a stage under offload on a backend without a copy stream
  const std::string offload =
      message({.micro_batches = 2, .stage_remat = {Remat::never, Remat::offload, Remat::never}});
  CAPTURE(offload);
  CHECK(offload.find("host backend has none") != std::string::npos);
}

TEST_CASE("the bound holds where backward_weight runs long after B (zero-bubble schedules)") {
  // ZB-H1 and ZB-H2 keep each micro-batch's gradient stash and received gradient from B to a
  // late W: workspace that lives across ops, which the bound must replay, not take per op.
  for (Remat remat : {Remat::never, Remat::always, Remat::selective}) {
    for (std::size_t m : {4u, 8u}) {
      check_prediction<Model4, ZeroBubbleH1>(16, m, remat);
      check_prediction<Model4, ZeroBubbleH2>(16, m, remat);
      check_prediction<DeepModel, ZeroBubbleH1>(16, m, remat);
    }
  }
}

TEST_CASE("remat always keeps (M + L - 1) / (M L) of never's activations on a deep stage") {
  // Stage 0 keeps per micro-batch of n rows: its input (n d) and, without recompute, the outputs
  // of its first L - 1 layers ((L - 1) n d). With M micro-batches of N / M rows:
  //   never  = N L d,   always = N d + (N / M)(L - 1) d   (one stash while recomputing)
  constexpr std::size_t rows = 64;
  for (std::size_t m : {1u, 2u, 4u, 8u, 16u}) {
    CAPTURE(m);
    std::size_t peak[2] = {};
    for (Remat remat : {Remat::never, Remat::always}) {
      host::Backend backend(2);
      Trainer<DeepModel, SoftmaxCrossEntropy, host::Backend> trainer(
          backend, {.micro_batches = m, .remat = remat});
      const std::vector<float> x = random_inputs(rows, width, 1);
      const std::vector<std::int32_t> y = random_classes(rows, 4, 2);
      trainer.forward_backward(x, y);
      peak[remat == Remat::always] = backend.memory_stats(0).peak_of(MemoryKind::activations);
    }
    const double n = rows / static_cast<double>(m), d = width * sizeof(float);
    CHECK(peak[0] == rows * depth * d);
    CHECK(peak[1] == rows * d + n * (depth - 1) * d);
    CHECK(static_cast<double>(peak[1]) / static_cast<double>(peak[0]) ==
          doctest::Approx((m + depth - 1.0) / (m * static_cast<double>(depth))));
  }
}

TEST_CASE("Checkpoint keeps its layers' sequential names and changes no gradient") {
  using Plain = DeepModel;
  static_assert(CheckpointedModel::num_params == Plain::num_params);
  CHECK(CheckpointedModel::parameters().size() == Plain::parameters().size());
  for (std::size_t i = 0; i < Plain::parameters().size(); ++i) {
    CHECK(CheckpointedModel::parameters()[i].name == Plain::parameters()[i].name);
    CHECK(CheckpointedModel::parameters()[i].shape == Plain::parameters()[i].shape);
  }

  const std::vector<float> x = random_inputs(10, width, 5);
  const std::vector<std::int32_t> y = random_classes(10, 4, 6);
  host::Backend backend(2);
  Trainer<Plain, SoftmaxCrossEntropy, host::Backend> plain(backend,
                                                           {.micro_batches = 3, .seed = 4});
  Trainer<CheckpointedModel, SoftmaxCrossEntropy, host::Backend> checkpointed(
      backend, {.micro_batches = 3, .seed = 4});
  REQUIRE(parameters_of(plain) == parameters_of(checkpointed));
  CHECK(plain.forward_backward(x, y) == doctest::Approx(checkpointed.forward_backward(x, y)));
  const ReferenceResult ref =
      reference_step<Plain, SoftmaxCrossEntropy>(parameters_of(plain), x, y);
  const NamedTensors a = gradients_of(plain), b = gradients_of(checkpointed);
  for (const auto& [name, g] : a) {
    CAPTURE(name);
    CHECK(relative_error(b.at(name), g) < 2e-6);
    CHECK(relative_error(b.at(name), ref.gradients.at(name)) < 2e-6);
  }
}

TEST_CASE("Checkpoint under remat never keeps only its segment's input") {
  constexpr std::size_t rows = 32;
  const std::vector<float> x = random_inputs(rows, width, 1);
  const std::vector<std::int32_t> y = random_classes(rows, 4, 2);
  std::size_t peak[2] = {};
  {
    host::Backend backend(2);
    Trainer<DeepModel, SoftmaxCrossEntropy, host::Backend> t(backend, {.micro_batches = 4});
    t.forward_backward(x, y);
    peak[0] = backend.memory_stats(0).peak_of(MemoryKind::activations);
  }
  {
    host::Backend backend(2);
    Trainer<CheckpointedModel, SoftmaxCrossEntropy, host::Backend> t(backend, {.micro_batches = 4});
    t.forward_backward(x, y);
    peak[1] = backend.memory_stats(0).peak_of(MemoryKind::activations);
  }
  // Plain: input + 5 intermediate outputs per row. Checkpointed: input, the first Linear's
  // output (the segment's input) and the segment's output: 3 per row.
  const std::size_t d = width * sizeof(float);
  CHECK(peak[0] == rows * 6 * d);
  CHECK(peak[1] == rows * 3 * d);
}

namespace {
// SoftmaxCrossEntropy that does not say it takes dy == y: the last stage keeps its output and its
// gradient apart, as for a user's loss.
struct CopyingCrossEntropy : SoftmaxCrossEntropy {
  static constexpr bool in_place = false;
};
static_assert(loss_in_place<SoftmaxCrossEntropy> && loss_in_place<MSELoss>);
static_assert(!loss_in_place<CopyingCrossEntropy>);
}  // namespace

TEST_CASE("an in-place loss holds one (rows, classes) buffer where another holds two") {
  // A wide classifier, so that the loss's moment is the last device's peak: its logits of a
  // micro-batch (rows / M) x classes floats are saved whole, and predict_memory knows which loss
  // ran.
  constexpr std::size_t classes = 1024, rows = 32, m = 2;
  using Wide = Pipeline<Stage<Linear<width, width>>, Stage<ReLU, Linear<width, classes>>>;
  const std::vector<float> x = random_inputs(rows, width, 1);
  const std::vector<std::int32_t> y = random_classes(rows, classes, 2);
  auto measure = [&]<class Loss>(Loss) {
    host::Backend backend(2);
    Trainer<Wide, Loss, host::Backend> trainer(backend, {.micro_batches = m});
    const auto predicted =
        predict_memory<Wide>(trainer.schedule(), rows, Remat::never, 0, 4, loss_in_place<Loss>);
    backend.reset_peak();
    const float loss = trainer.forward_backward(x, y);
    const MemoryStats stats = backend.memory_stats(1);
    CHECK(stats.peak_of(MemoryKind::activations) == predicted[1].activations_peak);
    CHECK(stats.peak <= predicted[1].total_bound());
    return std::pair{stats.peak, loss};
  };
  const auto [in_place_peak, in_place_loss] = measure(SoftmaxCrossEntropy{});
  const auto [copying_peak, copying_loss] = measure(CopyingCrossEntropy{});
  CHECK(in_place_loss == copying_loss);
  // The copying run peaks at its loss (logits and their gradient); the in-place run's peak moves
  // to its last backward_input (the logits' gradient beside dx and the grad stash, a few KiB
  // above its loss's moment): the saving is the logits less those KiB.
  const std::size_t logits = rows / m * classes * sizeof(float);
  CHECK(copying_peak - in_place_peak <= logits);
  CHECK(copying_peak - in_place_peak > logits * 9 / 10);
}

TEST_CASE(
    "attention keeps 4D + 2H per row whatever T: a GPT's peak at T 1024 is its peak at T 64") {
  // Per row, CausalSelfAttention keeps qkv (3D) and o (D), and each head's log-sum-exp (H floats
  // in 2H elements), never the (T, T) probabilities: 2048 tokens cost as much in samples of 1024
  // as in samples of 64, measured and predicted.
  constexpr std::size_t V = 16, D = 16, H = 2, tokens = 2048;
  static_assert(detail::bound_layer_t<CausalSelfAttention<D, H>, D, 64>::stash_per_row ==
                4 * D + 2 * H);
  static_assert(detail::bound_layer_t<CausalSelfAttention<D, H>, D, 1024>::stash_per_row ==
                4 * D + 2 * H);
  auto peak = [&]<std::size_t T>() {
    CAPTURE(T);
    using Gpt = Pipeline<Stage<Embedding<V, T, D>, TransformerBlock<D, H>>,
                         Stage<LayerNorm<D>, Linear<D, V>>>;
    Rng rng(3);
    std::vector<std::int32_t> x(tokens), y(tokens);
    for (std::int32_t& t : x) t = static_cast<std::int32_t>(rng.next_u64() % V);
    for (std::int32_t& t : y) t = static_cast<std::int32_t>(rng.next_u64() % V);
    host::Backend backend(2);
    Trainer<Gpt, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = 2});
    const auto predicted = predict_memory<Gpt>(trainer.schedule(), tokens, Remat::never);
    backend.reset_peak();
    trainer.forward_backward(x, y);
    const std::size_t measured = backend.memory_stats(0).peak_of(MemoryKind::activations);
    CHECK(measured == predicted[0].activations_peak);
    return measured;
  };
  CHECK(peak.template operator()<64>() == peak.template operator()<1024>());
}

TEST_CASE("remat selective keeps a GPT's GEMM outputs: N (1 + kept) + (N / M) cheap per device") {
  // Stage 0 = Embedding, two TransformerBlocks: per row it keeps its input (a token id), the two
  // hand-overs inside it (2 D) and each block's stash, of which selective drops 6 D + 4 (ln_1's,
  // ln_2's and GELU's outputs, the norms' statistics) and keeps 9 D + 2 H. Fill-drain runs every
  // forward first, then B and W of one micro-batch at a time, each B rebuilding the dropped part
  // of its micro-batch's stash (N / M rows) and its W freeing it: the peak is at the first B.
  constexpr std::size_t V = 16, T = 8, D = 16, H = 2, samples = 8, rows = samples * T;
  using Gpt = Pipeline<Stage<Embedding<V, T, D>, TransformerBlock<D, H>, TransformerBlock<D, H>>,
                       Stage<LayerNorm<D>, Linear<D, V>>>;
  using S0 = Gpt::stage_t<0>;
  constexpr std::size_t kept = 2 * D + 2 * (9 * D + 2 * H), cheap = 2 * (6 * D + 4);
  static_assert(S0::stash_per_row == kept + cheap && S0::cheap_stash_per_row == cheap);
  Rng rng(3);
  std::vector<std::int32_t> x(rows), y(rows);
  for (std::int32_t& t : x) t = static_cast<std::int32_t>(rng.next_u64() % V);
  for (std::int32_t& t : y) t = static_cast<std::int32_t>(rng.next_u64() % V);
  auto run = [&]<class Precision, class Schedule>(Remat remat, std::size_t m) {
    CAPTURE(to_string(remat));
    CAPTURE(m);
    host::Backend backend(2);
    Trainer<Gpt, SoftmaxCrossEntropy, host::Backend, Schedule, Precision> trainer(
        backend, {.micro_batches = m, .remat = remat});
    const auto predicted = predict_memory<Gpt, Precision>(trainer.schedule(), rows, remat);
    backend.reset_peak();
    trainer.forward_backward(x, y);
    for (std::size_t d = 0; d < 2; ++d) {
      CAPTURE(d);
      const MemoryStats stats = backend.memory_stats(d);
      CHECK(stats.peak_of(MemoryKind::activations) == predicted[d].activations_peak);
      CHECK(stats.peak <= predicted[d].total_bound());
    }
    return backend.memory_stats(0).peak_of(MemoryKind::activations);
  };
  for (std::size_t m : {1u, 2u, 4u}) {
    const std::size_t n = rows / m, f = sizeof(float);
    const std::size_t never = run.template operator()<Fp32, GPipe>(Remat::never, m);
    const std::size_t selective = run.template operator()<Fp32, GPipe>(Remat::selective, m);
    const std::size_t always = run.template operator()<Fp32, GPipe>(Remat::always, m);
    CHECK(never == rows * (1 + kept + cheap) * f);
    CHECK(selective == (rows * (1 + kept) + n * cheap) * f);
    CHECK(always == (rows + n * (kept + cheap)) * f);
    // the bf16 stashes take half the bytes, as predicted; split B and W (the dropped part lives
    // from B to the late W) and 1F1B are predicted exactly too
    const std::size_t half = run.template operator()<MixedBf16, GPipe>(Remat::selective, m);
    CHECK(half == (rows * (1 + kept) + n * cheap) * sizeof(bf16));
    (void)run.template operator()<Fp32, ZeroBubbleH1>(Remat::selective, m);
    (void)run.template operator()<MixedBf16, OneFOneB>(Remat::selective, m);
  }
}

TEST_CASE("Remat::offload's plan: a slot goes when an op runs between its F and its B") {
  // GPipe, K 2, M 3 (offload.hpp's example): device 0 runs F0 F1 F2, then B W per micro-batch
  struct Sizes {
    std::size_t kept_stash_per_row = 1, cheap_stash_per_row = 0;
  };
  const std::vector<Sizes> stages(2);
  const Schedule gpipe = GPipe::make(2, 3);
  const detail::OffloadPlan plan = detail::offload_plan(gpipe, Remat::offload, stages);
  for (std::size_t s = 0; s < 2; ++s)
    for (std::size_t mb = 0; mb < 3; ++mb) CHECK(plan.offloads(s, mb) == (mb < 2));
  // each comes back ahead of the compute op before its B, once
  for (std::size_t d = 0; d < 2; ++d) {
    std::vector<std::size_t> fetched;
    for (std::size_t p = 0; p < gpipe.ops[d].size(); ++p)
      for (const std::size_t slot : plan.fetches(d, p)) {
        fetched.push_back(slot);
        const std::size_t mb = slot % 3;
        // the next compute op after the fetch is the last one before mb's B
        std::size_t q = p + 1;
        while (!is_compute(gpipe.ops[d][q].kind)) ++q;
        CHECK(gpipe.ops[d][q].kind == OpKind::backward_input);
        CHECK(gpipe.ops[d][q].micro_batch == mb);
        CHECK(is_compute(gpipe.ops[d][p].kind));
      }
    CHECK(fetched == std::vector<std::size_t>{d * 3 + 1, d * 3 + 0});
  }
  // 1F1B, K 2: the last stage runs each B right after its F, and stage 0 only F1 between F0 and
  // B0 (F1 B0 W0 F2 between F1 and B1): those stay; nor does anything under other policies, nor
  // in a stage without a stash
  const detail::OffloadPlan one =
      detail::offload_plan(OneFOneB::make(2, 4), Remat::offload, stages);
  for (std::size_t mb = 0; mb < 4; ++mb) CHECK(!one.offloads(1, mb));
  CHECK(!one.offloads(0, 0));
  CHECK(one.offloads(0, 1));
  CHECK(detail::offload_plan(gpipe, Remat::never, stages).empty());
  const std::vector<Sizes> bare(2, Sizes{0, 0});
  CHECK(!detail::offload_plan(gpipe, Remat::offload, bare).offloads(0, 0));
  // a policy per stage: only the stages under offload send their slots, each as it would alone
  const std::vector<Remat> second_only = {Remat::always, Remat::offload};
  const detail::OffloadPlan mixed =
      detail::offload_plan(gpipe, std::span<const Remat>(second_only), stages);
  for (std::size_t mb = 0; mb < 3; ++mb) {
    CHECK(!mixed.offloads(0, mb));
    CHECK(mixed.offloads(1, mb) == plan.offloads(1, mb));
  }
  for (std::size_t p = 0; p < gpipe.ops[0].size(); ++p) CHECK(mixed.fetches(0, p).empty());
}

TEST_CASE("Remat::offload: the device keeps about N d + 2 (N / M) L d, the host the rest") {
  // DeepModel's stage 0 under GPipe: never keeps every micro-batch's stash, offload two at most
  constexpr std::size_t rows = 16, M = 8;
  const Schedule gpipe = GPipe::make(2, M);
  const auto never = predict_memory<DeepModel>(gpipe, rows, Remat::never);
  const auto offload = predict_memory<DeepModel>(gpipe, rows, Remat::offload);
  using S0 = DeepModel::stage_t<0>;
  const std::size_t f = sizeof(float), n = rows / M;
  CHECK(never[0].activations_peak == rows * (S0::in_features + S0::stash_per_row) * f);
  CHECK(offload[0].activations_peak == (rows * S0::in_features + 2 * n * S0::stash_per_row) * f);
  // the host holds the stashes of the M - 1 micro-batches that go
  CHECK(offload[0].offloaded == (M - 1) * n * S0::stash_per_row * f);
  CHECK(never[0].offloaded == 0);
  CHECK(offload[0].total_bound() < never[0].total_bound());
}

TEST_CASE("Remat::offload on the host backend: a clear error") {
  host::Backend backend(2);
  const std::string message = [&] {
    try {
      Trainer<Model2, SoftmaxCrossEntropy, host::Backend> trainer(
          backend, {.micro_batches = 2, .remat = Remat::offload});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  CAPTURE(message);
  CHECK(message.find("Remat::offload") != std::string::npos);
  CHECK(message.find("host backend has none") != std::string::npos);
}
