#pragma once
// Locating the first non-finite value of a training step (Trainer::locate_non_finite): the
// report's type, and the probe the executor runs after each compute op of a located step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/model/pipeline.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/validator.hpp"

namespace gpipe {

/// Where the first non-finite value (a NaN or an inf) of a training step came from
/// (`Trainer::non_finite_origin`): the first op in the schedule's issue order whose result held
/// one (an op whose inputs were all finite, since an op comes after the ops it reads in that
/// order), or the step's input data before any op.
struct NonFiniteOrigin {
  std::size_t stage = 0;        ///< the stage whose op wrote it (0 for the input data)
  std::size_t micro_batch = 0;  ///< its micro-batch, in its replica's split of the mini-batch
  std::size_t replica = 0;      ///< the data-parallel replica (0 without replicas)
  /// What held it: `"input"` (the step's x, before stage 0), `"output"` (the stage's forward
  /// output), `"loss"` (the last stage's loss of the micro-batch), `"input gradient"` (the
  /// stage's backward_input result) or a parameter's name (the stage's backward_weight made its
  /// gradient non-finite).
  std::string tensor;

  /// One line for a log: `stage 1, micro-batch 2: the gradient of "3.weight"`.
  std::string describe() const {
    std::string what =
        tensor == "input" || tensor == "output" || tensor == "loss" || tensor == "input gradient"
            ? "the " + tensor
            : "the gradient of \"" + tensor + "\"";
    return "stage " + std::to_string(stage) + ", micro-batch " + std::to_string(micro_batch) +
           (replica > 0 ? " of replica " + std::to_string(replica) : std::string()) + ": " + what;
  }
};

namespace detail {

// The checks of a located step. Each is the sum of squares in double of what an op wrote, into
// one double of its device's buffer: non-finite iff a value was (squares of floats and their sums
// stay far below double's range). F checks the stage's output (the last stage: its loss), B its
// input gradient, W each of the stage's gradient tensors; the gradients are also checked before
// the step's ops, and a tensor already non-finite then is not blamed on this step. The results
// are downloaded at the step's end and read after it (finish).
//
// A finding's key orders findings as the issue order does: (position + 1) W + j, with the input
// data's micro-batch j at position -1 and an op's tensor j (0 for F and B) at its position in the
// issue order; W = max(micro-batches, tensors of a stage) + 1.
template <class Backend, class Activation>
class NonFiniteProbe {
 public:
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;
  using Kernels = typename Backend::Kernels;
  static constexpr double none = std::numeric_limits<double>::infinity();

  // tensors: every parameter tensor (ParameterStore::infos()), which outlive the probe.
  NonFiniteProbe(Backend& backend, std::span<const ParameterInfo> tensors, std::size_t stages)
      : backend_(backend), tensors_(stages) {
    for (const ParameterInfo& info : tensors) tensors_[info.stage].push_back(&info);
  }

  // Before a step's ops: its checks, of the schedule, its issue order and each stage's gradient
  // array, for micro-batches M, on the devices that are this process's (`local(d)`).
  template <class Local>
  void begin(const Schedule& schedule, std::span<const OpPlace> order,
             std::span<Buffer<float>> grads, std::size_t M, Local local) {
    const std::size_t S = grads.size();
    M_ = M;
    std::size_t widest = M;
    for (const auto& t : tensors_) widest = std::max(widest, t.size());
    width_ = static_cast<double>(widest + 1);
    first_ = std::vector<std::size_t>(S * M * 3, npos);
    position_ = std::vector<std::size_t>(S * M * 3, npos);
    before_ = std::vector<std::size_t>(S, npos);
    count_ = std::vector<std::size_t>(schedule.num_devices, 0);
    device_of_stage_ = std::vector<std::size_t>(S);
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t d = device_of_stage_[s] = schedule.device_of_stage(s);
      if (!local(d)) continue;
      before_[s] = count_[d];
      count_[d] += tensors_[s].size();
    }
    for (std::size_t p = 0; p < order.size(); ++p) {
      const std::size_t d = order[p].device;
      const Op& op = schedule.ops[d][order[p].position];
      if (!is_compute(op.kind) || !local(d)) continue;
      const std::size_t s = schedule.stage_of(d, op.chunk);
      const std::size_t at = index(s, op.micro_batch, op.kind);
      position_[at] = p;
      first_[at] = count_[d];
      count_[d] += op.kind == OpKind::backward_weight ? tensors_[s].size() : 1;
    }
    sums_ = std::vector<Buffer<double>>(schedule.num_devices);
    host_ = std::vector<std::vector<double>>(schedule.num_devices);
    for (std::size_t d = 0; d < schedule.num_devices; ++d) {
      if (count_[d] == 0) continue;
      sums_[d] = backend_.template allocate<double>(d, count_[d], MemoryKind::workspace);
      host_[d].assign(count_[d], 0.0);
    }
    for (std::size_t s = 0; s < S; ++s)
      if (before_[s] != npos)
        backend_.submit(
            device_of_stage_[s], {.what = "check gradients", .stage = s},
            [this, s, g = grads[s].data()](Kernels& k) { sum_gradients(k, s, g, before_[s]); });
  }

  // After stage s's F of micro-batch mb: its output y(n), or the last stage's loss (one float).
  void forward(Kernels& k, std::size_t s, std::size_t mb, const Activation* y, std::size_t n) {
    activations(k, s, first_[index(s, mb, OpKind::forward)], y, n);
  }
  void loss(Kernels& k, std::size_t s, std::size_t mb, const float* loss) {
    k.sum_of_squares(1, loss,
                     sums_[device_of_stage_[s]].data() + first_[index(s, mb, OpKind::forward)]);
  }
  // After stage s's B of micro-batch mb: its input gradient dx(n) (n = 0: none to check).
  void input_gradient(Kernels& k, std::size_t s, std::size_t mb, const Activation* dx,
                      std::size_t n) {
    activations(k, s, first_[index(s, mb, OpKind::backward_input)], dx, n);
  }
  // After stage s's W of micro-batch mb: each of its gradient tensors in grads.
  void gradients(Kernels& k, std::size_t s, std::size_t mb, const float* grads) {
    sum_gradients(k, s, grads, first_[index(s, mb, OpKind::backward_weight)]);
  }

  // After the step's ops: each device's sums to host memory (read after the step's work).
  void end() {
    for (std::size_t d = 0; d < sums_.size(); ++d)
      if (count_[d] > 0)
        backend_.submit(d, {.what = "read checks"},
                        [n = count_[d], p = sums_[d].data(), h = host_[d].data()](Kernels& k) {
                          k.download(n, p, h);
                        });
  }

  // After the step's work completed: this process's first finding's key (none: no finding);
  // input: the step's x per micro-batch checked on the host (first non-finite micro-batch).
  double first_key(std::optional<std::size_t> input) const {
    if (input) return static_cast<double>(*input);
    double best = none;
    const std::size_t S = tensors_.size();
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t mb = 0; mb < M_; ++mb)
        for (const OpKind kind :
             {OpKind::forward, OpKind::backward_input, OpKind::backward_weight}) {
          const std::size_t at = index(s, mb, kind);
          if (first_[at] == npos) continue;
          const std::vector<double>& h = host_[device_of_stage_[s]];
          const std::size_t checks = kind == OpKind::backward_weight ? tensors_[s].size() : 1;
          for (std::size_t j = 0; j < checks; ++j) {
            if (std::isfinite(h[first_[at] + j])) continue;
            // a gradient already non-finite before the step is not this step's
            if (kind == OpKind::backward_weight && !std::isfinite(h[before_[s] + j])) continue;
            best = std::min(
                best, (static_cast<double>(position_[at]) + 1) * width_ + static_cast<double>(j));
            break;
          }
        }
    return best;
  }

  // The finding of `key` (of any process: the issue order and tensors are every process's).
  NonFiniteOrigin origin(double key, const Schedule& schedule, std::span<const OpPlace> order,
                         std::size_t replica) const {
    const auto position = static_cast<std::size_t>(key / width_);
    const auto j = static_cast<std::size_t>(key - static_cast<double>(position) * width_);
    if (position == 0) return {.stage = 0, .micro_batch = j, .replica = replica, .tensor = "input"};
    const OpPlace place = order[position - 1];
    const Op& op = schedule.ops[place.device][place.position];
    const std::size_t s = schedule.stage_of(place.device, op.chunk);
    NonFiniteOrigin out{
        .stage = s, .micro_batch = op.micro_batch, .replica = replica, .tensor = {}};
    if (op.kind == OpKind::backward_weight)
      out.tensor = tensors_[s][j]->name;
    else if (op.kind == OpKind::backward_input)
      out.tensor = "input gradient";
    else
      out.tensor = s + 1 == tensors_.size() ? "loss" : "output";
    return out;
  }

  // Frees the step's device buffers.
  void clear() { sums_.clear(); }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::size_t index(std::size_t s, std::size_t mb, OpKind kind) const {
    return (s * M_ + mb) * 3 + static_cast<std::size_t>(kind);
  }
  void sum_gradients(Kernels& k, std::size_t s, const float* grads, std::size_t first) {
    double* out = sums_[device_of_stage_[s]].data() + first;
    for (std::size_t j = 0; j < tensors_[s].size(); ++j)
      k.sum_of_squares(tensors_[s][j]->size, grads + tensors_[s][j]->offset, out + j);
  }
  // x(n) of the activations' type: bf16 widened into float first (exact).
  void activations(Kernels& k, std::size_t s, std::size_t slot, const Activation* x,
                   std::size_t n) {
    const std::size_t d = device_of_stage_[s];
    double* out = sums_[d].data() + slot;
    if constexpr (std::is_same_v<Activation, float>) {
      k.sum_of_squares(n, x, out);
    } else {
      Buffer<float> wide = backend_.template allocate<float>(d, n, MemoryKind::workspace);
      ActivationContext<Kernels, Activation>::of(k).convert(n, x, wide.data());
      k.sum_of_squares(n, wide.data(), out);
    }
  }

  Backend& backend_;
  std::size_t M_ = 0;
  double width_ = 1;
  std::vector<std::vector<const ParameterInfo*>> tensors_;  // per stage, in parameter order
  std::vector<std::size_t> device_of_stage_;
  // per (stage, micro-batch, compute kind) at index(): its first check's slot on its device, and
  // its position in the issue order (npos: not this process's)
  std::vector<std::size_t> first_, position_;
  std::vector<std::size_t> before_;  // per stage: the slot of its gradients' check before the step
  std::vector<std::size_t> count_;   // per device: its checks
  std::vector<Buffer<double>> sums_;
  std::vector<std::vector<double>> host_;
};

}  // namespace detail
}  // namespace gpipe
