#pragma once
// gpipe::optim::WarmupCosine: the learning-rate schedule of GPT training runs (llm.c, nanoGPT,
// build-nanogpt): a linear warmup to max_lr, then half a cosine down to min_lr, then min_lr.
// Set an optimizer's lr from it before each step:
//
//     gpipe::optim::WarmupCosine schedule({.max_lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 700,
//                                          .total_steps = 19000});
//     adamw.options.lr = schedule(step);   // step = 0, 1, ...
//     trainer.step(adamw);

#include <cmath>
#include <cstddef>
#include <numbers>
#include <string>

#include "gpipe/error.hpp"

namespace gpipe::optim {

/// WarmupCosine's parameters.
struct WarmupCosineOptions {
  double max_lr = 6e-4;          ///< the rate at the end of the warmup, >= min_lr
  double min_lr = 6e-5;          ///< the rate from total_steps on, >= 0
  std::size_t warmup_steps = 0;  ///< steps of linear warmup (0: none)
  std::size_t total_steps = 1;   ///< where the cosine reaches min_lr, > warmup_steps
};

/// Linear warmup, then cosine decay (llm.c's and build-nanogpt's form). For step s = 0, 1, ...:
///
///     s < warmup:   max_lr (s + 1) / warmup
///     s <= total:   min_lr + (max_lr - min_lr) (1 + cos(pi (s - warmup) / (total - warmup))) / 2
///     s > total:    min_lr
class WarmupCosine {
 public:
  /// Throws `gpipe::Error` unless 0 <= min_lr <= max_lr and total_steps > warmup_steps.
  explicit WarmupCosine(WarmupCosineOptions options) : options_(options) {
    detail::require(options.min_lr >= 0 && options.min_lr <= options.max_lr,
                    "WarmupCosine needs 0 <= min_lr <= max_lr, got min_lr " +
                        std::to_string(options.min_lr) + " and max_lr " +
                        std::to_string(options.max_lr));
    detail::require(options.total_steps > options.warmup_steps,
                    "WarmupCosine needs total_steps > warmup_steps, got " +
                        std::to_string(options.total_steps) + " and " +
                        std::to_string(options.warmup_steps));
  }

  /// The learning rate of step `step` (0-based).
  double operator()(std::size_t step) const {
    const WarmupCosineOptions& o = options_;
    if (step < o.warmup_steps)
      return o.max_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
    if (step > o.total_steps) return o.min_lr;
    const double ratio = static_cast<double>(step - o.warmup_steps) /
                         static_cast<double>(o.total_steps - o.warmup_steps);
    return o.min_lr + 0.5 * (1 + std::cos(std::numbers::pi * ratio)) * (o.max_lr - o.min_lr);
  }

  /// The parameters given at construction.
  const WarmupCosineOptions& options() const { return options_; }

 private:
  WarmupCosineOptions options_;
};

}  // namespace gpipe::optim
