#pragma once
// The executor: runs one forward-backward step of a Pipeline by walking a schedule and issuing
// each op to the stream of its stage's device. Written once for every backend, and compiled once
// per backend: it sees the model as its stages' programs (runtime/stage_program.hpp).
//
// Per (stage s, micro-batch mb) it keeps a Slot of device buffers (rows = the micro-batch's size)
// and the transport's mailboxes of its two messages (its output, its input gradient); which op
// allocates and frees which buffer, of what size and memory kind, is the table of
// runtime/slot_buffers.hpp, which predict_memory replays too.
// Each buffer is allocated and freed by work on the streams, so device memory follows the
// schedule's order of execution. Every send, receive, gradient sum and the step's end go through
// the backend's transport (transport/transport.hpp), the same calls for every backend; a process
// issues only the ops of its own devices (all of them, with one process). Activation forward_only
// schedule (schedule/inference.hpp) is predict's program: the same walk, no loss, the last stage's
// outputs downloaded into the caller's array.
//
// Under gpipe::MixedBf16 every slot buffer and message holds bf16, the ops run on the device's
// bf16 context (Kernels::bf16_context()), and each local stage's parameters are cast to bf16 once
// per step before its ops (workspace until the step ends) for the GEMMs of all its micro-batches.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/micro_batch.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/slot_buffers.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/validator.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe::detail {

// Target: the loss's target type (std::int32_t class ids, or floats). Precision: Fp32, or
// MixedBf16, whose slots hold bf16 and whose ops run on the device's bf16 context.
template <class Backend, class Target, class Precision = Fp32>
class Executor {
 public:
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;
  using Kernels = typename Backend::Kernels;
  using Activation = typename Precision::activation_type;  // activations' element type
  // the context the stages' ops run on: the backend's (Kernels), or its bf16 one
  using OpContext = typename ActivationContext<Kernels, Activation>::type;
  using Transport = transport::Transport<Backend>;
  static_assert(transport::transport_interface<Transport, Backend>,
                "gpipe: transport::Transport<Backend> lacks a member of transport_interface "
                "(transport/transport.hpp)");
  using target_type = Target;

  struct Step {
    std::span<const float> x;        // (N, in_features), host memory
    std::span<const target_type> y;  // (N, targets per row), host memory; none for inference
    std::span<float> out = {};       // inference: (N, out_features), host memory, the last
                                     // stage's process writes it
    MicroBatchSplit split;
    Remat remat = Remat::never;
    // 1 / the loss's normalizer of the whole mini-batch (a data-parallel replica's step holds
    // part of it): the factor of every micro-batch's loss gradient
    float loss_scale = 1;
    // With data-parallel replicas: the step's gradients are summed over them, each stage's as
    // soon as its last backward_weight is done; the gradients accumulated before the step are
    // set aside meanwhile and added back after it.
    bool sum_over_replicas = false;
  };

  // stages[s]: stage s's program; loss: the last stage's. params[s], grads[s]: stage s's flat
  // parameter and gradient arrays on its device. order: issue_order(schedule), computed once by
  // the owner. All of them outlive the executor.
  // token_input: stage 0's rows are token ids (with bf16 activations they travel as the 16 bits
  // of a bf16, which hold ids exactly; a bf16 value holds integers only up to 256).
  Executor(Backend& backend, const Schedule& schedule, std::span<const OpPlace> order,
           std::span<const StageProgram<OpContext>> stages,
           const LossProgram<OpContext, Target>& loss, std::span<Buffer<float>> params,
           std::span<Buffer<float>> grads, bool token_input = false)
      : backend_(backend),
        transport_(backend),
        schedule_(schedule),
        order_(order),
        stages_(stages),
        loss_program_(loss),
        num_stages_(stages.size()),
        params_(params),
        grads_(grads),
        token_input_(token_input) {}

  // Runs the step (with a forward_only schedule: the inference into step.out); returns the summed
  // loss of every micro-batch (0 for inference). Throws (from the backend's
  // synchronize) the first failure of any stream, naming its stage, device and micro-batch.
  double run(const Step& step) {
    step_ = &step;
    const std::size_t M = step.split.micro_batches;
    slots_ = std::vector<Slot>(num_stages_ * M);
    std::vector<float> losses(M);
    const std::size_t last_device = schedule_.device_of_stage(num_stages_ - 1);
    const bool has_loss = !schedule_.forward_only && transport_.is_local(last_device);
    try {
      if (step.sum_over_replicas) prepare_gradient_sums();
      cast_weights();
      if (has_loss)
        loss_ = backend_.template allocate<float>(last_device, M, MemoryKind::workspace);
      // Every record is issued before the waits for it: a CUDA stream that waits on an event
      // not yet recorded does not wait at all.
      for (const OpPlace& place : order_)
        if (transport_.is_local(place.device))
          issue(place.device, schedule_.ops[place.device][place.position]);
      if (has_loss)
        backend_.submit(last_device, {"read loss"}, [this, &losses, M](Kernels& k) {
          k.download(M, loss_.data(), losses.data());
        });
    } catch (...) {
      // Work already issued may wait for events that will now never be recorded: cancel it
      // before the slots it uses go away (and with several processes, end the step on all).
      abandon([this] { clear(); });
    }
    try {
      finish();
      add_back_earlier_gradients();
    } catch (...) {
      clear();
      throw;
    }
    clear();
    double total = 0;
    for (float l : losses) total += l;
    return total;
  }

  // Ends a training step whose inputs this process refused before issuing anything, from the
  // handler of the refusal: as a step whose issuing threw (abort_step: with several processes
  // all throw the same Error). With replicas the sums that the other replicas' ranks of this
  // device start are announced first, so that this rank starts them too (on gradients that are
  // unspecified after a failed step) and the replicas' collectives stay in step.
  [[noreturn]] void refuse(bool sum_over_replicas) {
    if (sum_over_replicas) transport_.begin_gradient_sums(gradient_sum_arrays());
    transport_.abort_step(std::current_exception());
  }

 private:
  struct Slot {
    std::array<Buffer<Activation>, num_slot_buffers> buffers;  // see runtime/slot_buffers.hpp
    typename Transport::Mailbox activation, gradient;  // of its output, of its input gradient
    Buffer<Activation>& operator[](SlotBuffer b) { return buffers[static_cast<std::size_t>(b)]; }
  };

  Slot& slot(std::size_t s, std::size_t mb) { return slots_[s * step_->split.micro_batches + mb]; }

  // What stage s's ops on micro-batch mb allocate and free depends on (slot_buffers.hpp).
  OpSituation situation(std::size_t s, std::size_t mb) const {
    return {.first_stage = s == 0,
            .last_stage = s + 1 == num_stages_,
            .forward_only = schedule_.forward_only,
            .recomputed = recomputes(step_->remat, mb, step_->split.micro_batches),
            .has_stash = stages_[s].stash_per_row > 0,
            .skips_input_gradient = stages_[s].skips_input_gradient};
  }
  // The elements per row of a slot buffer of stage s.
  std::size_t width(std::size_t s, SlotBuffer b) const {
    const StageProgram<OpContext>& stage = stages_[s];
    switch (width_of(b)) {
      case Width::in:
        return stage.in_features;
      case Width::out:
        return stage.out_features;
      case Width::stash:
        return stage.stash_per_row;
      case Width::grad_stash:
        return stage.grad_stash_per_row;
    }
    return 0;
  }
  // An op's allocations, and after its kernels its frees, on its slot (slot_buffers.hpp).
  void allocate(const OpBuffers& ops, std::size_t s, std::size_t device, std::size_t rows,
                Slot& here) {
    for (std::size_t i = 0; i < ops.num_allocates; ++i) {
      const Allocation& a = ops.allocates[i];
      here[a.buffer] =
          backend_.template allocate<Activation>(device, rows * width(s, a.buffer), a.kind);
    }
  }
  static void release(const OpBuffers& ops, Slot& here) {
    for (std::size_t i = 0; i < ops.num_frees; ++i) here[ops.frees[i]].reset();
  }

  void clear() {
    slots_.clear();
    weights_bf16_.clear();
    loss_ = {};
    earlier_.clear();
    weights_done_.clear();
    step_ = nullptr;
  }

  // The start of a data-parallel step: tells the transport which gradient sums the step starts
  // and in what order (the order of each stage's last backward_weight on its device), sets the
  // gradients accumulated so far aside (on the devices' streams, before the step's work) and
  // zeroes them, so that the sums add only this step's.
  void prepare_gradient_sums() {
    transport_.begin_gradient_sums(gradient_sum_arrays());
    weights_done_.assign(num_stages_, 0);
    earlier_.resize(num_stages_);
    for (std::size_t s = 0; s < num_stages_; ++s) {
      const std::size_t d = schedule_.device_of_stage(s);
      if (!transport_.is_local(d)) continue;
      const std::size_t n = grads_[s].size();
      earlier_[s] = backend_.template allocate<float>(d, n, MemoryKind::gradients);
      backend_.submit(d, {"set gradients aside", s},
                      [n, g = grads_[s].data(), e = earlier_[s].data()](Kernels& k) {
                        k.copy(n, g, e);
                        k.fill(n, 0.0f, g);
                      });
    }
  }
  // The gradient arrays of this process's stages whose sums over the replicas a step starts, in
  // the order it starts them.
  std::vector<std::span<float>> gradient_sum_arrays() const {
    std::vector<std::span<float>> sums;
    for (std::size_t d = 0; d < schedule_.num_devices; ++d) {
      if (!transport_.is_local(d)) continue;
      // the stages of d in the order of their last backward_weight: the first W of each stage
      // met walking the list backwards, reversed
      std::vector<std::size_t> order;
      const auto& ops = schedule_.ops[d];
      for (auto op = ops.rbegin(); op != ops.rend(); ++op) {
        if (op->kind != OpKind::backward_weight) continue;
        const std::size_t s = schedule_.stage_of(d, op->chunk);
        if (std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
      }
      for (auto s = order.rbegin(); s != order.rend(); ++s)
        sums.emplace_back(grads_[*s].data(), grads_[*s].size());
    }
    return sums;
  }
  // After stage s's backward_weight is issued: its sum over the replicas starts after the last.
  void after_backward_weight(std::size_t device, std::size_t s) {
    if (weights_done_.empty() || ++weights_done_[s] != step_->split.micro_batches) return;
    transport_.start_gradient_sum(device, {"sum gradients over replicas", s});
  }
  // After the sums: the gradients set aside before the step, added back.
  void add_back_earlier_gradients() {
    if (earlier_.empty()) return;
    for (std::size_t s = 0; s < num_stages_; ++s) {
      if (earlier_[s].size() == 0) continue;
      backend_.submit(schedule_.device_of_stage(s), {"add earlier gradients", s},
                      [n = grads_[s].size(), g = grads_[s].data(),
                       e = earlier_[s].data()](Kernels& k) { k.accumulate(n, e, g); });
    }
    backend_.synchronize();
  }

  // Issuing the step threw: the transport cancels what was issued (and with several processes
  // tells the others, so that every process throws the same Error), then `cleanup()`, then the
  // failure is rethrown.
  template <class Cleanup>
  [[noreturn]] void abandon(Cleanup cleanup) {
    try {
      transport_.abort_step(std::current_exception());
    } catch (...) {
      cleanup();
      throw;
    }
  }

  // Waits for the step's work; with several processes, they agree whether any failed.
  void finish() { transport_.finish_step(); }

  // Stage s's message for micro-batch mb (of M): its output for stage s + 1, or its input
  // gradient for stage s - 1.
  transport::Message message(std::size_t s, std::size_t mb, std::size_t M, bool gradient) const {
    return {.stage = s,
            .micro_batch = mb,
            .micro_batches = M,
            .gradient = gradient,
            .from = schedule_.device_of_stage(s),
            .to = schedule_.device_of_stage(gradient ? s - 1 : s + 1)};
  }

  // Activation send or receive of stage s's slot, through the transport: a send hands over the
  // buffer the table frees, a receive fills the one it allocates.
  void issue_transfer(const Op& op, std::size_t s, WorkLabel label) {
    const std::size_t mb = op.micro_batch, M = step_->split.micro_batches;
    const OpBuffers ops = buffers_of(op.kind, situation(s, mb));
    Slot& here = slot(s, mb);
    switch (op.kind) {
      case OpKind::send_activation:
        return transport_.send(label, message(s, mb, M, false), here[ops.frees[0]],
                               here.activation);
      case OpKind::send_gradient:
        return transport_.send(label, message(s, mb, M, true), here[ops.frees[0]], here.gradient);
      case OpKind::recv_activation:
      case OpKind::recv_gradient: {
        const bool gradient = op.kind == OpKind::recv_gradient;
        const std::size_t from = gradient ? s + 1 : s - 1;
        const Allocation& a = ops.allocates[0];
        return transport_.receive(label, message(from, mb, M, gradient), here[a.buffer],
                                  step_->split.size(mb) * width(s, a.buffer), a.kind,
                                  gradient ? slot(from, mb).gradient : slot(from, mb).activation);
      }
      default:
        return;
    }
  }

  void issue(std::size_t device, const Op& op) {
    const std::size_t s = schedule_.stage_of(device, op.chunk);
    const std::size_t mb = op.micro_batch;
    const WorkLabel label{
        .what = to_string(op.kind), .stage = s, .micro_batch = mb, .compute = is_compute(op.kind)};
    switch (op.kind) {
      case OpKind::forward:
      case OpKind::backward_input:
        return submit_compute(op.kind, s, device, label, mb);
      case OpKind::backward_weight:
        submit_compute(op.kind, s, device, label, mb);
        return after_backward_weight(device, s);
      case OpKind::send_activation:
      case OpKind::send_gradient:
      case OpKind::recv_activation:
      case OpKind::recv_gradient:
        return issue_transfer(op, s, label);
    }
  }

  static constexpr bool mixed = !std::is_same_v<Activation, float>;

  // MixedBf16: every local stage's parameters rounded to bf16 once, on its device before the
  // step's ops, for the GEMMs of all its micro-batches (a copy per use costs a sizeable share
  // of a micro-batch's GEMM: BENCHMARKS.md); counted as workspace while the step runs.
  void cast_weights() {
    if constexpr (mixed) {
      weights_bf16_.resize(num_stages_);
      for (std::size_t s = 0; s < num_stages_; ++s) {
        const std::size_t d = schedule_.device_of_stage(s);
        if (!transport_.is_local(d)) continue;
        weights_bf16_[s] =
            backend_.template allocate<Activation>(d, params_[s].size(), MemoryKind::workspace);
        backend_.submit(
            d, {"weights to bf16", s},
            [n = params_[s].size(), p = params_[s].data(), w = weights_bf16_[s].data()](
                Kernels& k) { ActivationContext<Kernels, Activation>::of(k).convert(n, p, w); });
      }
    }
  }

  // The context stage s's ops run on, its bf16 weights registered (MixedBf16).
  OpContext& context(Kernels& k, std::size_t s) {
    OpContext& c = ActivationContext<Kernels, Activation>::of(k);
    if constexpr (mixed)
      c.use_weights(params_[s].data(), weights_bf16_[s].data(), params_[s].size());
    return c;
  }

  // Stage 0's rows (n values at x, host memory) into its input buffer on the device.
  void upload_input(OpContext& c, std::size_t n, const float* x, Activation* dst) const {
    if constexpr (mixed) {
      if (token_input_) {  // ids in a bf16's 16 bits (the Trainer checked them against V)
        std::vector<Activation> ids(n);
        for (std::size_t i = 0; i < n; ++i)
          ids[i] = Activation::from_bits(static_cast<std::uint16_t>(x[i]));
        return c.upload(n, ids.data(), dst);
      }
    }
    c.upload(n, x, dst);
  }

  // Submits the compute op `kind` of stage s on micro-batch mb to `device`: the slot's buffers
  // the table allocates, the op's scratch, its kernels, then the table's frees.
  void submit_compute(OpKind kind, std::size_t s, std::size_t device, WorkLabel label,
                      std::size_t mb) {
    backend_.submit(device, label, [this, kind, s, device, mb](Kernels& kernels) {
      OpContext& k = context(kernels, s);
      const std::size_t rows = step_->split.size(mb);
      const OpSituation at = situation(s, mb);
      const OpBuffers ops = buffers_of(kind, at);
      Slot& here = slot(s, mb);
      allocate(ops, s, device, rows, here);
      if (kind == OpKind::forward)
        forward(k, s, device, mb, rows, here);
      else if (kind == OpKind::backward_input)
        backward_input(k, s, device, rows, at, here);
      else
        backward_weight(k, s, device, rows, here);
      release(ops, here);
    });
  }

  // The stage's scratch for one op (empty when it needs none).
  Buffer<Activation> workspace(const StageProgram<OpContext>& stage, std::size_t device,
                               std::size_t rows) {
    return backend_.template allocate<Activation>(device, rows * stage.workspace_per_row,
                                                  MemoryKind::workspace);
  }

  // F: stage 0 first uploads its rows; the last stage then applies the loss (training) or
  // downloads its output (inference).
  void forward(OpContext& k, std::size_t s, std::size_t device, std::size_t mb, std::size_t rows,
               Slot& here) {
    const StageProgram<OpContext>& stage = stages_[s];
    const Step& step = *step_;
    if (s == 0)
      upload_input(k, rows * stage.in_features,
                   step.x.data() + step.split.begin(mb) * stage.in_features,
                   here[SlotBuffer::input].data());
    {
      Buffer<Activation> ws = workspace(stage, device, rows);
      stage.forward(k, ForwardArgs<Activation>{rows, here[SlotBuffer::input].data(),
                                               here[SlotBuffer::output].data(), params_[s].data(),
                                               here[SlotBuffer::stash].data(), ws.data()});
    }
    if (s + 1 < num_stages_) return;
    if (schedule_.forward_only)
      k.download(rows * stage.out_features, here[SlotBuffer::output].data(),
                 step.out.data() + step.split.begin(mb) * stage.out_features);
    else
      apply_loss(device, k, mb, rows, here);
  }

  // Last stage: loss of the micro-batch into loss_[mb]; gradient of the mean loss into
  // grad_output.
  void apply_loss(std::size_t device, OpContext& k, std::size_t mb, std::size_t rows, Slot& here) {
    const std::size_t out = stages_[num_stages_ - 1].out_features;
    const Step& step = *step_;
    const std::size_t per_row = loss_program_.targets_per_row(out);
    auto targets =
        backend_.template allocate<target_type>(device, rows * per_row, MemoryKind::workspace);
    k.upload(rows * per_row, step.y.data() + step.split.begin(mb) * per_row, targets.data());
    loss_program_.apply(k, rows, out, here[SlotBuffer::output].data(), targets.data(),
                        step.loss_scale, here[SlotBuffer::grad_output].data(), loss_.data() + mb);
  }

  // B: first, where remat dropped the stash, the stage's forward again from its kept input.
  void backward_input(OpContext& k, std::size_t s, std::size_t device, std::size_t rows,
                      const OpSituation& at, Slot& here) {
    const StageProgram<OpContext>& stage = stages_[s];
    Buffer<Activation> ws = workspace(stage, device, rows);
    if (at.recomputed && at.has_stash) {
      auto scratch = backend_.template allocate<Activation>(device, rows * stage.out_features,
                                                            MemoryKind::workspace);
      stage.forward(
          k, ForwardArgs<Activation>{rows, here[SlotBuffer::input].data(), scratch.data(),
                                     params_[s].data(), here[SlotBuffer::stash].data(), ws.data()});
    }
    stage.backward_input(
        k, BackwardInputArgs<Activation>{
               rows, here[SlotBuffer::input].data(), here[SlotBuffer::grad_output].data(),
               here[SlotBuffer::grad_input].data(), params_[s].data(),
               here[SlotBuffer::stash].data(), here[SlotBuffer::grad_stash].data(), ws.data()});
  }

  // W: the stage's parameter gradients accumulated into grads_[s].
  void backward_weight(OpContext& k, std::size_t s, std::size_t device, std::size_t rows,
                       Slot& here) {
    const StageProgram<OpContext>& stage = stages_[s];
    Buffer<Activation> ws = workspace(stage, device, rows);
    stage.backward_weight(
        k, BackwardWeightArgs<Activation>{
               rows, here[SlotBuffer::input].data(), here[SlotBuffer::grad_output].data(),
               params_[s].data(), here[SlotBuffer::stash].data(),
               here[SlotBuffer::grad_stash].data(), grads_[s].data(), ws.data()});
  }

  Backend& backend_;
  Transport transport_;
  const Schedule& schedule_;
  std::span<const OpPlace> order_;
  std::span<const StageProgram<OpContext>> stages_;
  const LossProgram<OpContext, Target>& loss_program_;
  const std::size_t num_stages_;
  std::span<Buffer<float>> params_, grads_;
  const Step* step_ = nullptr;
  std::vector<Slot> slots_;
  Buffer<float> loss_;
  std::vector<Buffer<float>> earlier_;     // per stage: gradients set aside (data parallel)
  std::vector<std::size_t> weights_done_;  // per stage: backward_weight ops issued
  bool token_input_ = false;
  std::vector<Buffer<Activation>> weights_bf16_;  // MixedBf16: per stage, its parameters in bf16
};

}  // namespace gpipe::detail
