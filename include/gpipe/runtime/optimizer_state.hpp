#pragma once
// The trainer's optimizer state: per stage, on the stage's device, what the optimizer keeps per
// parameter (SGD's momentum buffer, AdamW's two moments) and the step count, restarted when the
// optimizer's type changes. With a transport that shards the optimizer over data-parallel
// replicas (ZeRO-1: transport optimizer_share), a process keeps the state of its share of each
// stage's parameters only, updates that share, and the replicas then gather the parameters. The
// state knows its optimizer by the type's name, fixed while compiling (no RTTI: equal in every
// translation unit and shared library, and with -fno-rtti). Compiled once per backend and
// optimizer type. Under gpipe::MixedBf16 an optimizer with the fused update
// (fused_bf16_optimizer_for) also writes each stage's bf16 copy of the weights
// (runtime/bf16_weights.hpp); after any other update the next step rounds them again.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/concepts.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/optim/optimizer.hpp"
#include "gpipe/runtime/bf16_weights.hpp"
#include "gpipe/runtime/parameter_store.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe::detail {

// The name of type T as the compiler spells it in this function's signature: one string per
// type, the same wherever it is compiled.
template <class T>
constexpr std::string_view type_name() {
  return __PRETTY_FUNCTION__;
}

// What a checkpoint records of the optimizer besides its state tensors.
struct OptimizerRecord {
  std::string kind;                      // Optimizer::name ("AdamW", "SGD"); "" before any step
  std::vector<std::string> state_names;  // of its state planes (PyTorch's: "exp_avg", ...)
  std::vector<std::pair<std::string, std::string>> hyperparameters;  // at the last step
  std::size_t steps = 0;                                             // updates so far
};

// An optimizer's kind (Optimizer::name, else its type's name), the names of its state planes
// (Optimizer::state_names, else "state0", ...) and its hyperparameters (hyperparameters(), else
// none), as a checkpoint records them.
template <class Optimizer>
OptimizerRecord record_of(const Optimizer& optimizer) {
  OptimizerRecord out;
  if constexpr (requires { Optimizer::name; })
    out.kind = std::string(Optimizer::name);
  else
    out.kind = std::string(type_name<Optimizer>());
  for (std::size_t i = 0; i < Optimizer::state_per_param; ++i) {
    if constexpr (requires { Optimizer::state_names[i]; })
      out.state_names.emplace_back(Optimizer::state_names[i]);
    else
      out.state_names.push_back("state" + std::to_string(i));
  }
  if constexpr (requires { optimizer.hyperparameters(); })
    out.hyperparameters = optimizer.hyperparameters();
  return out;
}

template <class Backend>
class OptimizerState {
 public:
  // Trainer::step's contract: one update of every parameter of `store` from its gradient.
  template <class Optimizer>
  void step(const Optimizer& optimizer, ParameterStore<Backend>& store, Backend& backend);

  // For checkpoints: the record of the optimizer whose state this is, and stage s's state
  // (state_names.size() planes of its share's size, on its device; empty before any step), its
  // share of the stage's parameters [first, last) (all of them unless sharded) and whether any
  // stage's state is a share.
  const OptimizerRecord& record() const { return record_; }
  typename Backend::template Buffer<float>& state(std::size_t s) { return state_[s]; }
  std::pair<std::size_t, std::size_t> share(std::size_t s) const { return shares_[s]; }
  bool sharded() const { return sharded_; }
  // No state: the next step starts its optimizer afresh (a checkpoint saved before any step).
  void clear() {
    state_.clear();
    shares_.clear();
    sharded_ = false;
    optimizer_ = {};
    record_ = {};
    restored_ = false;
  }
  // A checkpoint's state: zeroed planes for `record`'s optimizer, its step count; the next step
  // must be given an optimizer of that kind (gpipe::Error otherwise), which then continues it.
  void restore(OptimizerRecord record, ParameterStore<Backend>& store, Backend& backend) {
    allocate(record.state_names.size(), store, backend);
    optimizer_ = {};
    record_ = std::move(record);
    restored_ = true;
  }

 private:
  using Kernels = typename Backend::Kernels;
  using Ranges = std::vector<optim::ParameterRange>;

  // Zeroed state: `planes` floats per parameter of each local stage's share.
  void allocate(std::size_t planes, ParameterStore<Backend>& store, Backend& backend) {
    const transport::Transport<Backend> transport(backend);
    state_.clear();
    shares_.clear();
    sharded_ = transport.shards_optimizer();
    for (std::size_t s = 0; s < store.num_stages(); ++s) {
      shares_.push_back(transport.optimizer_share(store.params()[s].size()));
      if (!store.local(s)) {
        state_.emplace_back();
        continue;
      }
      const std::size_t n = planes * (shares_[s].second - shares_[s].first);
      state_.push_back(backend.template allocate<float>(store.device_of_stage(s), n,
                                                        MemoryKind::optimizer_state));
      backend.submit(store.device_of_stage(s), {"optimizer state", s},
                     [p = state_.back().data(), n](Kernels& k) { k.fill(n, 0.0f, p); });
    }
    backend.synchronize();
  }
  // Per stage: its tensors in order of offset (they cover its flat array without gaps).
  static std::vector<Ranges> tensors_of(const ParameterStore<Backend>& store) {
    std::vector<Ranges> out(store.num_stages());
    for (const ParameterInfo& info : store.infos())
      out[info.stage].push_back({info.offset, info.size, info.shape.size()});
    for (Ranges& ranges : out) {
      std::sort(ranges.begin(), ranges.end(),
                [](const auto& a, const auto& b) { return a.offset < b.offset; });
      for (std::size_t i = 0, at = 0; i < ranges.size(); at += ranges[i++].size)
        require(ranges[i].offset == at, "a stage's parameter tensors leave a gap");
    }
    return out;
  }

  // Per stage: a stage's tensors as the optimizer sees its share [first, last): the tensors that
  // meet it, cut to it, offsets from `first`.
  static Ranges cut(const Ranges& tensors, std::pair<std::size_t, std::size_t> share) {
    Ranges out;
    for (const optim::ParameterRange& t : tensors) {
      const std::size_t first = std::max(t.offset, share.first);
      const std::size_t last = std::min(t.offset + t.size, share.second);
      if (first < last) out.push_back({first - share.first, last - first, t.dims});
    }
    return out;
  }

  // One stage's update by `optimizer` on its device: the fused one where w (the stage's bf16 copy
  // of the weights) is given, else the grouped one where the optimizer has it, else the plain one.
  template <class Optimizer>
  static void update(const Optimizer& optimizer, Kernels& k, std::size_t n, float* p,
                     const float* g, float* state, std::size_t t,
                     std::span<const optim::ParameterRange> tensors, bf16* w) {
    if constexpr (fused_bf16_optimizer_for<Optimizer, Kernels>) {
      if (w != nullptr) return optimizer.update(k, n, p, g, state, t, tensors, w);
    }
    if constexpr (grouped_optimizer_for<Optimizer, Kernels>)
      optimizer.update(k, n, p, g, state, t, tensors);
    else
      optimizer.update(k, n, p, g, state, t);
  }

  std::vector<typename Backend::template Buffer<float>> state_;  // per stage, on its device
  std::vector<std::pair<std::size_t, std::size_t>> shares_;      // per stage: [first, last)
  bool sharded_ = false;         // a share is not the whole of its stage
  std::vector<Ranges> tensors_;  // per stage, for optimizers that group tensors by shape
  std::string_view optimizer_;   // type_name<Optimizer>() of the optimizer the state belongs to
  OptimizerRecord record_;       // what a checkpoint records of it, its step count among them
  bool restored_ = false;        // the state is a checkpoint's, its optimizer not yet given
};

// Defined out of the class, so that a program that declares its instantiation for
// host::Backend extern (GPIPE_COMPILED_HOST, backend/host/compiled.hpp) does not compile it.
template <class Backend>
template <class Optimizer>
void OptimizerState<Backend>::step(const Optimizer& optimizer, ParameterStore<Backend>& store,
                                   Backend& backend) {
  optimizer.check();
  OptimizerRecord record = record_of(optimizer);  // steps 0
  if (restored_) {
    require(record.kind == record_.kind && record.state_names == record_.state_names,
            "the optimizer state restored from a checkpoint is " + record_.kind +
                "'s, and Trainer::step was given " + record.kind);
    optimizer_ = type_name<Optimizer>();
    restored_ = false;
  } else if (optimizer_ != type_name<Optimizer>()) {
    allocate(Optimizer::state_per_param, store, backend);
    optimizer_ = type_name<Optimizer>();
    record_ = record;  // steps 0
  }
  record_.hyperparameters = std::move(record.hyperparameters);  // this step's
  if (tensors_.empty()) {
    tensors_ = tensors_of(store);
    for (std::size_t s = 0; s < store.num_stages(); ++s) tensors_[s] = cut(tensors_[s], shares_[s]);
  }
  const std::size_t t = ++record_.steps;
  Bf16Weights<Backend>& bf16 = store.bf16_weights();
  bf16.invalidate();  // before any parameter is written
  const bool fused = fused_bf16_optimizer_for<Optimizer, Kernels> && bf16.kept() && !sharded_;
  for (std::size_t s = 0; s < store.num_stages(); ++s) {
    if (!store.local(s)) continue;
    const auto [first, last] = shares_[s];
    backend.submit(store.device_of_stage(s), {"optimizer step", s},
                   [&optimizer, p = store.params()[s].data() + first,
                    g = store.grads()[s].data() + first, st = state_[s].data(), n = last - first, t,
                    tensors = std::span<const optim::ParameterRange>(tensors_[s]),
                    w = fused ? bf16.data(s) : nullptr](Kernels& k) {
                     update(optimizer, k, n, p, g, st, t, tensors, w);
                   });
  }
  backend.synchronize();
  if (fused)
    for (std::size_t s = 0; s < store.num_stages(); ++s)
      if (store.local(s)) bf16.mark_current(s);
  if (sharded_) {  // every replica gets every share's update
    const transport::Transport<Backend> transport(backend);
    for (std::size_t s = 0; s < store.num_stages(); ++s)
      if (store.local(s))
        transport.gather_optimizer_shares({store.params()[s].data(), store.params()[s].size()});
  }
  store.sync_tied_parameters();
}

}  // namespace gpipe::detail
