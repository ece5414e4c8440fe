#pragma once
// A data-parallel step's gradient sums over the replicas: which arrays, in what order, each
// started once its stage's last backward_weight is issued, and the gradients accumulated before
// the step set aside meanwhile (so the sums add only this step's) and added back after.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe::detail {

// The sums of one step (or of none, when the step has one replica) over the stages of
// `schedule` whose gradient arrays are `grads`; all of them outlive it.
template <class Backend>
class ReplicaGradientSums {
 public:
  using Kernels = typename Backend::Kernels;

  ReplicaGradientSums(Backend& backend, const transport::Transport<Backend>& transport,
                      const Schedule& schedule,
                      std::span<typename Backend::template Buffer<float>> grads)
      : backend_(backend), transport_(transport), schedule_(schedule), grads_(grads) {}

  // The start of a data-parallel step of M micro-batches: tells the transport which gradient
  // sums the step starts and in what order (the order of each stage's last backward_weight on
  // its device), sets the gradients accumulated so far aside (on the devices' streams, before
  // the step's work) and zeroes them.
  void begin(std::size_t micro_batches) {
    transport_.begin_gradient_sums(arrays());
    micro_batches_ = micro_batches;
    weights_done_.assign(grads_.size(), 0);
    earlier_.resize(grads_.size());
    for (std::size_t s = 0; s < grads_.size(); ++s) {
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
  std::vector<std::span<float>> arrays() const {
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
  // After stage s's backward_weight is issued on `device`: its sum starts after the last.
  void after_backward_weight(std::size_t device, std::size_t s) {
    if (weights_done_.empty() || ++weights_done_[s] != micro_batches_) return;
    transport_.start_gradient_sum(device, {"sum gradients over replicas", s});
  }
  // After the step's sums: the gradients set aside before it, added back; waits for them.
  void add_back_earlier() {
    if (earlier_.empty()) return;
    for (std::size_t s = 0; s < grads_.size(); ++s) {
      if (earlier_[s].size() == 0) continue;
      backend_.submit(schedule_.device_of_stage(s), {"add earlier gradients", s},
                      [n = grads_[s].size(), g = grads_[s].data(),
                       e = earlier_[s].data()](Kernels& k) { k.accumulate(n, e, g); });
    }
    backend_.synchronize();
  }
  // Forgets the step (frees what was set aside).
  void clear() {
    earlier_.clear();
    weights_done_.clear();
  }

 private:
  Backend& backend_;
  const transport::Transport<Backend>& transport_;
  const Schedule& schedule_;
  std::span<typename Backend::template Buffer<float>> grads_;
  std::size_t micro_batches_ = 0;
  std::vector<typename Backend::template Buffer<float>> earlier_;  // per stage: set aside
  std::vector<std::size_t> weights_done_;  // per stage: backward_weight ops issued
};

}  // namespace gpipe::detail
