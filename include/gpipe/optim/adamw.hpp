#pragma once
// gpipe::optim::AdamW: torch.optim.AdamW (decoupled weight decay, bias-corrected moments,
// amsgrad off), with nanoGPT's decay groups (Decay::matrices). Defaults are PyTorch's. What an
// optimizer provides is the `optimizer` concept's (optim/optimizer.hpp).

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/optim/optimizer.hpp"

namespace gpipe::optim {

/// AdamW's hyperparameters, with PyTorch's defaults; `AdamW::check` states their valid ranges.
struct AdamWOptions {
  double lr = 1e-3;            ///< learning rate, >= 0
  double beta1 = 0.9;          ///< decay of the first moment `m`, in [0, 1)
  double beta2 = 0.999;        ///< decay of the second moment `v`, in [0, 1)
  double eps = 1e-8;           ///< added to `sqrt(v_hat)` in the denominator, >= 0
  double weight_decay = 1e-2;  ///< decoupled: `p *= 1 - lr weight_decay` before the Adam step, >= 0
  /// The parameters weight_decay applies to: all (PyTorch's default), or Decay::matrices (only
  /// tensors of two or more dimensions, nanoGPT's groups); the others get weight_decay 0.
  Decay decay = Decay::all;
};

/// torch.optim.AdamW (amsgrad off), applied by `Trainer::step`. At step t = 1, 2, ... each
/// parameter p with gradient g becomes, in float as PyTorch's single-tensor implementation does:
///
///     p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
///     p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
///
/// `m` and `v` start at zero and live on each stage's device (`state_per_param` = 2).
class AdamW {
 public:
  /// The hyperparameters' type, so that generic code can write `Optimizer::Options`.
  using Options = AdamWOptions;

  /// Throws `gpipe::Error` when a hyperparameter is out of range (see `check`).
  explicit AdamW(Options options = {}) : options(options) { check(); }

  static constexpr std::size_t state_per_param = 2;  ///< (m, v), each a block of n floats
  /// The kind a checkpoint records; its state under PyTorch's names (`<param>.exp_avg`, ...).
  static constexpr std::string_view name = "AdamW";
  /// PyTorch's names of the state planes (m, v), as checkpoints write them.
  static constexpr std::array<std::string_view, 2> state_names{"exp_avg", "exp_avg_sq"};

  /// The hyperparameters as a checkpoint records them (shortest round-trip decimals).
  std::vector<std::pair<std::string, std::string>> hyperparameters() const {
    return {{"lr", detail::decimal(options.lr)},
            {"beta1", detail::decimal(options.beta1)},
            {"beta2", detail::decimal(options.beta2)},
            {"eps", detail::decimal(options.eps)},
            {"weight_decay", detail::decimal(options.weight_decay)},
            {"decay", options.decay == Decay::all ? "all" : "matrices"}};
  }

  /// Throws `gpipe::Error` naming the first hyperparameter out of range: lr, eps, weight_decay
  /// < 0, or beta1, beta2 outside [0, 1). `Trainer::step` calls it, so edits to `options` between
  /// steps are checked too.
  void check() const {
    detail::require(options.lr >= 0, "AdamW lr must be >= 0, got " + std::to_string(options.lr));
    detail::require(options.beta1 >= 0 && options.beta1 < 1,
                    "AdamW beta1 must be in [0, 1), got " + std::to_string(options.beta1));
    detail::require(options.beta2 >= 0 && options.beta2 < 1,
                    "AdamW beta2 must be in [0, 1), got " + std::to_string(options.beta2));
    detail::require(options.eps >= 0, "AdamW eps must be >= 0, got " + std::to_string(options.eps));
    detail::require(options.weight_decay >= 0,
                    "AdamW weight_decay must be >= 0, got " + std::to_string(options.weight_decay));
  }

  /// One update of `n` parameters in place on the device whose kernels `k` are: `params` (n) from
  /// `grads` (n), with `state` (2 n: `m`, then `v`) updated in place; `step` >= 1 counts this
  /// optimizer's updates, for the bias corrections.
  template <class Kernels, class T>
  void update(Kernels& k, std::size_t n, T* params, const T* grads, T* state,
              std::size_t step) const {
    k.adamw_update(n, params, grads, state, state + n, options.lr, options.beta1, options.beta2,
                   options.eps, options.weight_decay, step);
  }

  /// As `update` above, for a stage whose tensors are `tensors` (in order of offset, covering
  /// the n parameters): with Decay::matrices, tensors of one dimension get weight decay 0. One
  /// call of the kernels' `adamw_update_ranges` where they have it (gpipe::has_adamw_ranges: one
  /// launch on CUDA), else one `adamw_update` per run of tensors of one setting; the same bits
  /// either way.
  template <class Kernels, class T>
  void update(Kernels& k, std::size_t n, T* params, const T* grads, T* state, std::size_t step,
              std::span<const ParameterRange> tensors) const {
    if constexpr (has_adamw_ranges<Kernels>) {
      update(k, n, params, grads, state, step, tensors, static_cast<bf16*>(nullptr));
    } else {
      for (const DecayRange& run : runs(n, tensors))
        k.adamw_update(run.size, params + run.offset, grads + run.offset, state + run.offset,
                       state + n + run.offset, options.lr, options.beta1, options.beta2,
                       options.eps, run.decays ? options.weight_decay : 0.0, step);
    }
  }

  /// As the update above, in one call of `adamw_update_ranges`, which also writes `params_bf16`
  /// (n; none where null) = the updated parameters rounded to bf16: a gpipe::MixedBf16 Trainer's
  /// copy of the weights for the next step's GEMMs (gpipe::fused_bf16_optimizer_for).
  template <class Kernels, class T>
  requires has_adamw_ranges<Kernels>
  void update(Kernels& k, std::size_t n, T* params, const T* grads, T* state, std::size_t step,
              std::span<const ParameterRange> tensors, bf16* params_bf16) const {
    const std::vector<DecayRange> ranges = runs(n, tensors);
    k.adamw_update_ranges(n, params, grads, state, state + n, ranges, options.lr, options.beta1,
                          options.beta2, options.eps, options.weight_decay, step, params_bf16);
  }

  Options options;  ///< may be changed between steps (e.g. a learning-rate schedule)

 private:
  // The runs of weight decay over n parameters whose tensors are `tensors`: all of them with
  // Decay::all, else one run per maximal sequence of tensors that all decay (two or more
  // dimensions) or all do not.
  std::vector<DecayRange> runs(std::size_t n, std::span<const ParameterRange> tensors) const {
    if (options.decay == Decay::all) return {{0, n, true}};
    std::vector<DecayRange> out;
    for (const ParameterRange& t : tensors) {
      const bool decays = t.dims >= 2;
      if (!out.empty() && out.back().decays == decays)
        out.back().size += t.size;
      else
        out.push_back({t.offset, t.size, decays});
    }
    return out;
  }
};

}  // namespace gpipe::optim
