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
// issues only the ops of its own devices (all of them, with one process). A forward_only
// schedule (schedule/inference.hpp) is predict's program: the same walk, no loss, the last stage's
// outputs downloaded into the caller's array.
//
// Under gpipe::MixedBf16 every slot buffer and message holds bf16, the ops run on the device's
// bf16 context (Kernels::bf16_context()), and the GEMMs of all micro-batches read each local
// stage's bf16 copy of its parameters (runtime/bf16_weights.hpp), rounded before the step's ops
// where the optimizer's update did not write it.
//
// With a StepGraphs (runtime/step_graphs.hpp; the Trainer's steps have one, predict does not) a
// backend may capture a step's work into a graph and launch it for later steps with the same key
// (key_of): the step's host arrays are then where the graph copies from and to, and a capture
// that fails is issued again op by op.
//
// Under Remat::offload (with an Offload of a backend that supports it: runtime/offload.hpp) an
// offloaded slot's stash goes to host memory right after its F, comes back ahead of the op
// before its B, and its B waits for it; the OffloadPlan says which slots and when.
//
// With a NonFiniteProbe (runtime/non_finite.hpp; Trainer::locate_non_finite) each compute op's
// work also checks what it wrote, and the step is issued op by op.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/gradient_sums.hpp"
#include "gpipe/runtime/micro_batch.hpp"
#include "gpipe/runtime/non_finite.hpp"
#include "gpipe/runtime/offload.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/slot_buffers.hpp"
#include "gpipe/runtime/stage_ops.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/runtime/step_graphs.hpp"
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

  using Step = StepInput<Target>;

  // stages[s]: stage s's program; loss: the last stage's. params[s], grads[s]: stage s's flat
  // parameter and gradient arrays on its device; bf16: their bf16 copies (MixedBf16). order:
  // issue_order(schedule), computed once by the owner. All of them outlive the executor.
  // token_input: stage 0's rows are token ids (StageOps's constructor says how they travel).
  // graphs: the owner's StepGraphs, which outlives the executor; null: every step issued op by op.
  // offload: the owner's Offload (Remat::offload), which outlives the executor; null: none.
  // probe: the owner's NonFiniteProbe, which outlives the executor; null: no checks.
  Executor(Backend& backend, const Schedule& schedule, std::span<const OpPlace> order,
           std::span<const StageProgram<OpContext>> stages,
           const LossProgram<OpContext, Target>& loss, std::span<Buffer<float>> params,
           std::span<Buffer<float>> grads, Bf16Weights<Backend>& bf16, bool token_input = false,
           StepGraphs<Backend>* graphs = nullptr, Offload<Backend>* offload = nullptr,
           NonFiniteProbe<Backend, Activation>* probe = nullptr)
      : backend_(backend),
        transport_(backend),
        schedule_(schedule),
        order_(order),
        stages_(stages),
        loss_program_(loss),
        num_stages_(stages.size()),
        sums_(backend, transport_, schedule, grads),
        ops_(backend, stages, loss, params, grads, bf16, token_input),
        params_(params),
        grads_(grads),
        bf16_(bf16),
        token_input_(token_input),
        graphs_(graphs),
        offload_(offload),
        probe_(probe) {}

  // Runs the step (with a forward_only schedule: the inference into step.out); returns the summed
  // loss of every micro-batch (0 for inference). Throws (from the backend's
  // synchronize) the first failure of any stream, naming its stage, device and micro-batch.
  double run(const Step& given) {
    const std::size_t M = given.split.micro_batches;
    Step step = given;
    std::span<float> losses;
    std::vector<float> own_losses;
    std::vector<bf16> own_bits;
    StepMode mode = StepMode::eager;
    const bool replayable = graphs_ != nullptr && probe_ == nullptr && !given.sum_over_replicas &&
                            !schedule_.forward_only && all_devices_local();
    if (replayable) {
      step.x = graphs_->input(HostArray::x, given.x);
      step.y = graphs_->input(HostArray::y, given.y);
      step.document = graphs_->input(HostArray::document, given.document);
      losses = graphs_->template output<float>(HostArray::losses, M);
      if (token_bits_needed())
        step.token_bits = token_bits(
            step.x, graphs_->template output<bf16>(HostArray::token_bits, step.x.size()));
    } else {
      own_losses.resize(M);
      losses = own_losses;
      if (token_bits_needed()) {
        own_bits.resize(step.x.size());
        step.token_bits = token_bits(step.x, own_bits);
      }
    }
    begin_offload(step);
    if (replayable) mode = graphs_->next(key_of(step));
    step_ = &step;
    begin_step(M);
    const std::size_t last_device = schedule_.device_of_stage(num_stages_ - 1);
    const bool has_loss = !schedule_.forward_only && transport_.is_local(last_device);
    try {
      if (step.sum_over_replicas) sums_.begin(M);
      if (mode == StepMode::replay) {
        for (std::size_t st = 0; st < num_stages_; ++st)
          if (transport_.is_local(schedule_.device_of_stage(st))) ops_.rounded_by_graph(st);
        graphs_->launch();
      } else if (mode == StepMode::capture && graphs_->begin_capture()) {
        issue_step(has_loss, last_device, losses);
        std::string why;
        if (graphs_->end_capture(why)) {
          graphs_->launch();
        } else {  // not capturable: the same step op by op
          clear();
          step_ = &step;
          begin_step(M);
          issue_step(has_loss, last_device, losses);
        }
      } else {
        issue_step(has_loss, last_device, losses);
      }
    } catch (...) {
      // Work already issued may wait for events that will now never be recorded: cancel it
      // before the slots it uses go away (and with several processes, end the step on all).
      if (replayable) graphs_->forget();
      abandon([this] { clear(); });
    }
    try {
      finish();
      ops_.commit_weights();
      sums_.add_back_earlier();
    } catch (...) {
      // a failed step starts its key afresh: issued, then captured (a capture it made failing
      // with it says nothing about the steps to come)
      if (replayable) graphs_->forget();
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
    if (sum_over_replicas) transport_.begin_gradient_sums(sums_.arrays());
    transport_.abort_step(std::current_exception());
  }

 private:
  using Slot = detail::Slot<Buffer<Activation>, typename Transport::template Mailbox<Activation>>;
  static constexpr bool mixed = !std::is_same_v<Activation, float>;

  void begin_step(std::size_t M) {
    slots_ = std::vector<Slot>(num_stages_ * M);
    ops_.begin(num_stages_, M);
  }

  // Issues the step's work: each local stage's bf16 weights where they are not current, every op
  // of the schedule in issue order, and the download of the micro-batches' losses into `losses`
  // (the loss buffer is freed by that work, so that the step frees all it allocates).
  // Every record is issued before the waits for it: a CUDA stream that waits on an event not yet
  // recorded does not wait at all.
  void issue_step(bool has_loss, std::size_t last_device, std::span<float> losses) {
    const std::size_t M = step_->split.micro_batches;
    for (std::size_t st = 0; st < num_stages_; ++st)
      if (transport_.is_local(schedule_.device_of_stage(st)))
        ops_.prepare_weights(st, schedule_.device_of_stage(st));
    if (has_loss) loss_ = backend_.template allocate<float>(last_device, M, MemoryKind::workspace);
    if (probe_ != nullptr)
      probe_->begin(schedule_, order_, grads_, M,
                    [this](std::size_t d) { return transport_.is_local(d); });
    for (const OpPlace& place : order_) {
      if (!transport_.is_local(place.device)) continue;
      for (const std::size_t slot : offload_plan_.fetches(place.device, place.position))
        fetch(place.device, slot / M, slot % M);
      issue(place.device, schedule_.ops[place.device][place.position]);
    }
    if (probe_ != nullptr) probe_->end();
    if (has_loss)
      backend_.submit(last_device, {"read loss"}, [this, losses, M](Kernels& k) {
        k.download(M, loss_.data(), losses.data());
        loss_.reset();
      });
  }

  bool all_devices_local() const {
    for (std::size_t d = 0; d < schedule_.num_devices; ++d)
      if (!transport_.is_local(d)) return false;
    return true;
  }

  // Under MixedBf16 stage 0's token ids travel as the 16 bits of a bf16 (StageOps).
  bool token_bits_needed() const { return mixed && token_input_; }
  static std::span<const bf16> token_bits(std::span<const float> x, std::span<bf16> bits) {
    for (std::size_t i = 0; i < x.size(); ++i)
      bits[i] = bf16::from_bits(static_cast<std::uint16_t>(x[i]));
    return bits;
  }

  // Everything that decides what a step issues, and on which memory (StepGraphs): the schedule
  // and its issue order, the split, the remat policy, the host arrays and the stages' arrays, the
  // loss's scale (a kernel argument), and which stages' bf16 weights are current.
  StepKey key_of(const Step& s) const {
    const auto address = [](const void* p) {
      return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
    };
    StepKey k{address(&schedule_),
              address(order_.data()),
              s.split.rows,
              s.split.micro_batches,
              s.split.sample_rows,
              s.remat.size(),
              std::bit_cast<std::uint32_t>(s.loss_scale),
              address(s.x.data()),
              s.x.size(),
              address(s.y.data()),
              s.y.size(),
              address(s.document.data()),
              s.document.size(),
              address(s.token_bits.data())};
    for (const Remat r : s.remat) k.push_back(static_cast<std::uint64_t>(r));
    if constexpr (Offload<Backend>::supported)
      if (!offload_plan_.empty())
        for (const std::uint64_t a : offload_->key()) k.push_back(a);
    for (std::size_t st = 0; st < num_stages_; ++st) {
      k.push_back(address(params_[st].data()));
      k.push_back(address(grads_[st].data()));
      if constexpr (mixed) {
        k.push_back(address(bf16_.data(st)));
        k.push_back(bf16_.current(st) ? 1 : 0);
      }
    }
    return k;
  }

  Slot& slot(std::size_t s, std::size_t mb) { return slots_[s * step_->split.micro_batches + mb]; }
  std::size_t num_mb() const { return step_->split.micro_batches; }

  // Remat::offload: the step's OffloadPlan, and the host block of each offloaded slot of this
  // process laid out by the Offload (before key_of, which lists the blocks' addresses). Under other
  // policies the plan is empty; the trainer refuses Remat::offload where the backend does not
  // support it.
  void begin_offload(const Step& step) {
    offload_plan_ =
        offload_ != nullptr ? offload_plan(schedule_, step.remat, stages_) : OffloadPlan{};
    if constexpr (Offload<Backend>::supported) {
      if (offload_plan_.empty()) return;
      const std::size_t M = step.split.micro_batches;
      std::vector<std::size_t> bytes(num_stages_ * M, 0), device(num_stages_ * M, 0);
      for (std::size_t s = 0; s < num_stages_; ++s)
        for (std::size_t mb = 0; mb < M; ++mb) {
          device[s * M + mb] = schedule_.device_of_stage(s);
          if (offload_plan_.offloads(s, mb) && transport_.is_local(device[s * M + mb]))
            bytes[s * M + mb] =
                step.split.size(mb) * offloaded_per_row(stages_[s]) * sizeof(Activation);
        }
      offload_->begin(bytes, device);
    }
  }
  // Right after stage s's F of micro-batch mb: the buffers offload_buffers frees (the stash and
  // the cheap stash) to host memory, freed there.
  void send_to_host(std::size_t device, std::size_t s, std::size_t mb) {
    if constexpr (Offload<Backend>::supported) {
      constexpr OpBuffers moved = offload_buffers();
      static_assert(moved.num_frees == 2);
      Slot& here = slot(s, mb);
      offload_->template to_host<Activation>(
          device, {.what = "offload", .stage = s, .micro_batch = mb, .background = true},
          s * num_mb() + mb, {&here[moved.frees[0]], &here[moved.frees[1]]});
    }
  }
  // Ahead of the op before stage s's B of micro-batch mb: the buffers fetch_buffers allocates
  // (as activations), filled from host memory; the B waits for them.
  void fetch(std::size_t device, std::size_t s, std::size_t mb) {
    if constexpr (Offload<Backend>::supported) {
      constexpr OpBuffers moved = fetch_buffers();
      static_assert(moved.num_allocates == 2 &&
                    moved.allocates[0].kind == MemoryKind::activations &&
                    moved.allocates[1].kind == MemoryKind::activations);
      Slot& here = slot(s, mb);
      const std::size_t rows = step_->split.size(mb);
      offload_->template from_host<Activation>(
          device, {.what = "fetch", .stage = s, .micro_batch = mb, .background = true},
          s * num_mb() + mb, {&here[moved.allocates[0].buffer], &here[moved.allocates[1].buffer]},
          {rows * elements_per_row(stages_[s], moved.allocates[0].buffer),
           rows * elements_per_row(stages_[s], moved.allocates[1].buffer)});
    }
  }

  // What stage s's ops on micro-batch mb allocate and free depends on (slot_buffers.hpp).
  OpSituation situation(std::size_t s, std::size_t mb) const {
    return op_situation(schedule_, policy_of(step_->remat, s), s, mb, stages_[s],
                        loss_program_.in_place);
  }
  // An op's allocations, and after its kernels its frees, on its slot (slot_buffers.hpp).
  void allocate(const OpBuffers& ops, std::size_t s, std::size_t device, std::size_t rows,
                Slot& here) {
    for (std::size_t i = 0; i < ops.num_allocates; ++i) {
      const Allocation& a = ops.allocates[i];
      here[a.buffer] = backend_.template allocate<Activation>(
          device, rows * elements_per_row(stages_[s], a.buffer), a.kind);
    }
  }
  static void release(const OpBuffers& ops, Slot& here) {
    for (std::size_t i = 0; i < ops.num_frees; ++i) here[ops.frees[i]].reset();
  }

  void clear() {
    slots_.clear();
    ops_.clear();
    loss_ = {};
    sums_.clear();
    step_ = nullptr;
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

  // A send or receive of stage s's slot, through the transport: a send hands over the
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
                                  step_->split.size(mb) * elements_per_row(stages_[s], a.buffer),
                                  a.kind,
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
        submit_compute(op.kind, s, device, label, mb);
        if (offload_plan_.offloads(s, mb)) send_to_host(device, s, mb);
        return;
      case OpKind::backward_input:
        if constexpr (Offload<Backend>::supported)
          if (offload_plan_.offloads(s, mb)) offload_->before_backward(device, s * num_mb() + mb);
        return submit_compute(op.kind, s, device, label, mb);
      case OpKind::backward_weight:
        submit_compute(op.kind, s, device, label, mb);
        return sums_.after_backward_weight(device, s);
      case OpKind::send_activation:
      case OpKind::send_gradient:
      case OpKind::recv_activation:
      case OpKind::recv_gradient:
        return issue_transfer(op, s, label);
    }
  }

  // Submits the compute op `kind` of stage s on micro-batch mb to `device`: the slot's buffers
  // the table allocates, the op itself (stage_ops.hpp), then the table's frees. The loss buffer's
  // address is taken now: the last device's "read loss" frees the buffer while other devices'
  // work may still run.
  void submit_compute(OpKind kind, std::size_t s, std::size_t device, WorkLabel label,
                      std::size_t mb) {
    backend_.submit(device, label, [this, kind, s, device, mb, loss = loss_.data()](Kernels& k) {
      const std::size_t rows = step_->split.size(mb);
      const OpSituation at = situation(s, mb);
      const OpBuffers buffers = buffers_of(kind, at);
      Slot& here = slot(s, mb);
      allocate(buffers, s, device, rows, here);
      ops_.run(kind, k, {.stage = s, .device = device, .micro_batch = mb, .rows = rows}, at,
               here.buffers, *step_, loss);
      if (probe_ != nullptr) check(kind, k, s, mb, rows, here, loss);
      release(buffers, here);
    });
  }

  // Under a probe, what the compute op `kind` of stage s on micro-batch mb wrote: F its output
  // (the last stage its loss), B its input gradient (but stage 0's, which goes nowhere), W the
  // stage's gradients.
  void check(OpKind kind, Kernels& k, std::size_t s, std::size_t mb, std::size_t rows, Slot& here,
             const float* loss) {
    if (kind == OpKind::forward) {
      if (s + 1 == num_stages_) return probe_->loss(k, s, mb, loss + mb);
      return probe_->forward(k, s, mb, here[SlotBuffer::output].data(),
                             rows * elements_per_row(stages_[s], SlotBuffer::output));
    }
    if (kind == OpKind::backward_input) {
      const Activation* dx = s > 0 ? here[SlotBuffer::grad_input].data() : nullptr;
      return probe_->input_gradient(
          k, s, mb, dx,
          dx != nullptr ? rows * elements_per_row(stages_[s], SlotBuffer::grad_input) : 0);
    }
    probe_->gradients(k, s, mb, grads_[s].data());
  }

  Backend& backend_;
  Transport transport_;
  const Schedule& schedule_;
  std::span<const OpPlace> order_;
  std::span<const StageProgram<OpContext>> stages_;
  const LossProgram<OpContext, Target>& loss_program_;
  const std::size_t num_stages_;
  const Step* step_ = nullptr;
  std::vector<Slot> slots_;
  Buffer<float> loss_;
  ReplicaGradientSums<Backend> sums_;         // with replicas: the step's gradient sums over them
  StageOps<Backend, Target, Precision> ops_;  // what the compute ops do
  std::span<Buffer<float>> params_, grads_;
  Bf16Weights<Backend>& bf16_;
  bool token_input_;
  StepGraphs<Backend>* graphs_;                 // null: every step issued op by op
  Offload<Backend>* offload_;                   // null: no Remat::offload
  OffloadPlan offload_plan_;                    // the step's (empty unless Remat::offload)
  NonFiniteProbe<Backend, Activation>* probe_;  // null: no checks
};

}  // namespace gpipe::detail
