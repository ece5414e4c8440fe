#pragma once
// What a stage's compute ops do on their slot's buffers, on a device's context: F (stage 0 first
// uploads its rows, every stage its micro-batch's document ids where the step has them; the last
// stage then applies the loss, or in inference downloads its output),
// B (first, where remat dropped the stash, the forward again from the kept input; where it
// dropped only the cheap stash, the stage's recompute of it), W; each with
// the stage's scratch for that op. The executor issues them in the schedule's order and
// allocates and frees the slot's buffers around them (runtime/slot_buffers.hpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/bf16_weights.hpp"
#include "gpipe/runtime/micro_batch.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/slot_buffers.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe::detail {

// The inputs of one step (or of one inference, whose y is empty and whose outputs go to out).
template <class Target>
struct StepInput {
  std::span<const float> x;   // (N, in_features), host memory
  std::span<const Target> y;  // (N, targets per row), host memory; none for inference
  std::span<float> out = {};  // inference: (N, out_features), host memory, the last
                              // stage's process writes it
  // (N) each row's document id (packed documents: the layers' Args::document), host memory;
  // empty: one document per sample, and the layers get nullptr
  std::span<const std::int32_t> document = {};
  // (N) under MixedBf16 with token rows: x's ids as the 16 bits of a bf16 (StageOps), host memory
  std::span<const bf16> token_bits = {};
  MicroBatchSplit split;
  // [stage] each stage's remat policy (outliving the step); empty: Remat::never for every stage
  std::span<const Remat> remat = {};
  // 1 / the loss's normalizer of the whole mini-batch (a data-parallel replica's step holds
  // part of it): the factor of every micro-batch's loss gradient
  float loss_scale = 1;
  // With data-parallel replicas: the step's gradients are summed over them, each stage's as
  // soon as its last backward_weight is done; the gradients accumulated before the step are
  // set aside meanwhile and added back after it.
  bool sum_over_replicas = false;
};

// Where one compute op runs: stage, device, micro-batch and its rows.
struct OpPosition {
  std::size_t stage = 0, device = 0, micro_batch = 0, rows = 0;
};

// The compute ops of a model's stages on Backend, in Precision (MixedBf16: on the device's bf16
// context, with each stage's weights in bf16: the store's copy, rounded again only where it is
// not current).
template <class Backend, class Target, class Precision>
class StageOps {
 public:
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;
  using Kernels = typename Backend::Kernels;
  using Activation = typename Precision::activation_type;
  using OpContext = typename ActivationContext<Kernels, Activation>::type;
  using Buffers = SlotBuffers<Buffer<Activation>>;
  using Step = StepInput<Target>;

  // The stages' programs and the loss's, the stages' parameter and gradient arrays and their
  // bf16 copies (kept under MixedBf16), all outliving this. token_input: stage 0's rows are token
  // ids (with bf16 activations they travel as the 16 bits of a bf16, which hold ids exactly; a
  // bf16 value holds integers only up to 256).
  StageOps(Backend& backend, std::span<const StageProgram<OpContext>> stages,
           const LossProgram<OpContext, Target>& loss, std::span<Buffer<float>> params,
           std::span<Buffer<float>> grads, Bf16Weights<Backend>& weights_bf16, bool token_input)
      : backend_(backend),
        stages_(stages),
        loss_program_(loss),
        params_(params),
        grads_(grads),
        weights_bf16_(weights_bf16),
        token_input_(token_input) {}

  // Before a step's ops, for each stage of this process: under MixedBf16 its parameters in bf16
  // for the GEMMs of all its micro-batches (a copy per use costs a sizeable share of a
  // micro-batch's GEMM: BENCHMARKS.md): the stage's copy as it is where current (the optimizer's
  // fused update wrote it), else rounded now, on its device.
  void prepare_weights(std::size_t s, std::size_t d) {
    if constexpr (mixed) {
      if (weights_bf16_.current(s)) return;
      backend_.submit(
          d, {"weights to bf16", s},
          [n = params_[s].size(), p = params_[s].data(), w = weights_bf16_.data(s)](Kernels& k) {
            ActivationContext<Kernels, Activation>::of(k).convert(n, p, w);
          });
      rounded_.push_back(s);
    }
  }
  // A graph of the step's work rounds what prepare_weights would have: stage s's copy where it is
  // not current.
  void rounded_by_graph(std::size_t s) {
    if constexpr (mixed)
      if (!weights_bf16_.current(s)) rounded_.push_back(s);
  }
  // After the step's work has completed: the copies prepare_weights rounded are current.
  void commit_weights() {
    for (const std::size_t s : rounded_) weights_bf16_.mark_current(s);
    rounded_.clear();
  }
  // Forgets the step's roundings (a failed step leaves them not current) and frees its document
  // ids.
  void clear() {
    rounded_.clear();
    documents_.clear();
  }

  // Before a step's ops: room for the document ids of each of its (stage, micro-batch) slots.
  void begin(std::size_t num_stages, std::size_t micro_batches) {
    documents_ = std::vector<Buffer<std::int32_t>>(num_stages * micro_batches);
  }

  // Runs the compute op `kind` at `at` (situation `sit`) on the backend's context k, on the
  // slot's buffers `here`; the last stage's loss of micro-batch mb goes to loss[mb].
  void run(OpKind kind, Kernels& k, const OpPosition& at, const OpSituation& sit, Buffers& here,
           const Step& step, float* loss) {
    OpContext& c = ActivationContext<Kernels, Activation>::of(k);
    Buffer<std::int32_t>& ids = documents_[at.stage * step.split.micro_batches + at.micro_batch];
    if (kind == OpKind::forward) {
      if (!step.document.empty()) upload_document(c, at, step, ids);
      forward(c, at, sit, here, step, loss, ids.data());
      if (sit.forward_only) ids.reset();
    } else if (kind == OpKind::backward_input) {
      backward_input(c, at.stage, at.device, at.rows, sit, here, ids.data());
    } else {
      backward_weight(c, at.stage, at.device, at.rows, here, ids.data());
      ids.reset();  // W is the slot's last compute op
    }
  }

 private:
  // Stage s's parameters as its GEMMs read them (ForwardArgs::compute_params): the bf16 copy
  // under MixedBf16, the float master otherwise.
  const Activation* compute_params(std::size_t s) const {
    if constexpr (mixed)
      return weights_bf16_.data(s);
    else
      return params_[s].data();
  }

  // Stage 0's rows of micro-batch mb (n values) into its input buffer on the device: x's, or
  // with token ids under MixedBf16 the step's token_bits (ids in a bf16's 16 bits; the Trainer
  // checked them against V).
  void upload_input(OpContext& c, std::size_t n, const Step& step, std::size_t first,
                    Activation* dst) const {
    if constexpr (mixed) {
      if (token_input_) {
        return c.upload(n, step.token_bits.data() + first, dst);
      }
    }
    c.upload(n, step.x.data() + first, dst);
  }

  static constexpr bool mixed = !std::is_same_v<Activation, float>;

  // The micro-batch's document ids onto the stage's device, once per (stage, micro-batch): its
  // F uploads them, B (with remat's recompute) and W read the same buffer, which W frees. They
  // are counted as MemoryKind::other, 4 bytes a row (predict_memory's documents_peak).
  void upload_document(OpContext& c, const OpPosition& at, const Step& step,
                       Buffer<std::int32_t>& ids) {
    ids = backend_.template allocate<std::int32_t>(at.device, at.rows, MemoryKind::other);
    c.upload(at.rows, step.document.data() + step.split.begin(at.micro_batch), ids.data());
  }

  // The stage's scratch for one op (empty when it needs none).
  Buffer<Activation> workspace(const StageProgram<OpContext>& stage, std::size_t device,
                               std::size_t rows) {
    return backend_.template allocate<Activation>(device, rows * stage.workspace_per_row,
                                                  MemoryKind::workspace);
  }

  // F: stage 0 first uploads its rows; the last stage then applies the loss (training) or
  // downloads its output (inference). With an in-place loss the last stage's y goes straight
  // into grad_output, where the loss writes dy over it (slot_buffers.hpp).
  void forward(OpContext& k, const OpPosition& at, const OpSituation& sit, Buffers& here,
               const Step& step, float* loss, const std::int32_t* document) {
    const std::size_t s = at.stage, device = at.device, mb = at.micro_batch, rows = at.rows;
    const StageProgram<OpContext>& stage = stages_[s];
    const bool in_place = sit.last_stage && sit.in_place_loss && !sit.forward_only;
    Activation* y = here[in_place ? SlotBuffer::grad_output : SlotBuffer::output].data();
    if (s == 0)
      upload_input(k, rows * stage.in_features, step, step.split.begin(mb) * stage.in_features,
                   here[SlotBuffer::input].data());
    {
      Buffer<Activation> ws = workspace(stage, device, rows);
      stage.forward(
          k, ForwardArgs<Activation>{rows, here[SlotBuffer::input].data(), y, params_[s].data(),
                                     here[SlotBuffer::stash].data(), ws.data(), compute_params(s),
                                     document, here[SlotBuffer::cheap_stash].data()});
    }
    if (s + 1 < stages_.size()) return;
    if (sit.forward_only)
      k.download(rows * stage.out_features, y,
                 step.out.data() + step.split.begin(mb) * stage.out_features);
    else
      apply_loss(device, k, mb, rows, y, here, step, loss);
  }

  // Last stage: loss of the micro-batch into loss[mb] from its output y; gradient of the mean
  // loss into grad_output (which may be y).
  void apply_loss(std::size_t device, OpContext& k, std::size_t mb, std::size_t rows,
                  const Activation* y, Buffers& here, const Step& step, float* loss) {
    const std::size_t out = stages_.back().out_features;

    const std::size_t per_row = loss_program_.targets_per_row(out);
    auto targets =
        backend_.template allocate<Target>(device, rows * per_row, MemoryKind::workspace);
    k.upload(rows * per_row, step.y.data() + step.split.begin(mb) * per_row, targets.data());
    loss_program_.apply(k, rows, out, y, targets.data(), step.loss_scale,
                        here[SlotBuffer::grad_output].data(), loss + mb);
  }

  // B: first, where remat dropped the stash, the stage's forward again from its kept input, or
  // where it dropped only the cheap stash, the stage's recompute of it.
  void backward_input(OpContext& k, std::size_t s, std::size_t device, std::size_t rows,
                      const OpSituation& at, Buffers& here, const std::int32_t* document) {
    const StageProgram<OpContext>& stage = stages_[s];
    Buffer<Activation> ws = workspace(stage, device, rows);
    if (at.recomputed && at.has_stash) {
      auto scratch = backend_.template allocate<Activation>(device, rows * stage.out_features,
                                                            MemoryKind::workspace);
      stage.forward(k, ForwardArgs<Activation>{rows, here[SlotBuffer::input].data(), scratch.data(),
                                               params_[s].data(), here[SlotBuffer::stash].data(),
                                               ws.data(), compute_params(s), document,
                                               here[SlotBuffer::cheap_stash].data()});
    }
    if (at.cheap_recomputed && at.has_cheap_stash)
      stage.recompute(k, ForwardArgs<Activation>{rows, here[SlotBuffer::input].data(), nullptr,
                                                 params_[s].data(), here[SlotBuffer::stash].data(),
                                                 ws.data(), compute_params(s), document,
                                                 here[SlotBuffer::cheap_stash].data()});
    stage.backward_input(
        k, BackwardInputArgs<Activation>{
               rows, here[SlotBuffer::input].data(), here[SlotBuffer::grad_output].data(),
               here[SlotBuffer::grad_input].data(), params_[s].data(),
               here[SlotBuffer::stash].data(), here[SlotBuffer::grad_stash].data(), ws.data(),
               compute_params(s), nullptr, document, here[SlotBuffer::cheap_stash].data()});
  }

  // W: the stage's parameter gradients accumulated into grads_[s].
  void backward_weight(OpContext& k, std::size_t s, std::size_t device, std::size_t rows,
                       Buffers& here, const std::int32_t* document) {
    const StageProgram<OpContext>& stage = stages_[s];
    Buffer<Activation> ws = workspace(stage, device, rows);
    stage.backward_weight(
        k,
        BackwardWeightArgs<Activation>{
            rows, here[SlotBuffer::input].data(), here[SlotBuffer::grad_output].data(),
            params_[s].data(), here[SlotBuffer::stash].data(), here[SlotBuffer::grad_stash].data(),
            grads_[s].data(), ws.data(), document, here[SlotBuffer::cheap_stash].data()});
  }

  Backend& backend_;
  std::span<const StageProgram<OpContext>> stages_;
  const LossProgram<OpContext, Target>& loss_program_;
  std::span<Buffer<float>> params_, grads_;
  Bf16Weights<Backend>& weights_bf16_;  // MixedBf16: per stage, its parameters in bf16
  bool token_input_ = false;
  std::vector<std::size_t> rounded_;  // stages whose copy this step's prepare_weights rounds
  // per (stage s, micro-batch mb) at s M + mb: the step's document ids on s's device, from its F
  // to its W (empty without documents)
  std::vector<Buffer<std::int32_t>> documents_;
};

}  // namespace gpipe::detail
