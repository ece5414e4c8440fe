#pragma once
// gpipe::optim::SpikeGuard: catches a loss spike (or a gradient-norm spike) before it reaches the
// weights, as llm.c's outlier detector does: the z-score of each new value against the mean and
// standard deviation of the values before it, over a window. A training loop skips the update
// of a step whose loss or norm scores above the threshold:
//
//     gpipe::optim::SpikeGuard loss_guard({.window = 128, .threshold = 5});
//     const float loss = trainer.forward_backward(x, y);
//     const float norm = trainer.clip_grad_norm(1.0);
//     if (loss_guard.is_spike(loss)) {
//       trainer.skip_step();                  // parameters and optimizer state unchanged
//     } else {
//       loss_guard.add(loss);
//       trainer.step(adamw);
//     }
//
// A skipped value is not added, so that a spike does not widen the baseline that the next one is
// judged against.

#include <cmath>
#include <cstddef>
#include <deque>
#include <limits>
#include <string>

#include "gpipe/error.hpp"

namespace gpipe::optim {

/// SpikeGuard's parameters.
struct SpikeGuardOptions {
  std::size_t window = 128;  ///< values the baseline is taken over, >= 2
  double threshold = 5;      ///< a z-score above it is a spike; finite and > 0
};

/// The z-score of a value against a window of earlier values (see the top of this file).
class SpikeGuard {
 public:
  /// Throws `gpipe::Error` for a window below 2 or a threshold that is not a positive number.
  explicit SpikeGuard(SpikeGuardOptions options) : options_(options) {
    detail::require(options_.window >= 2, [&] {
      return "SpikeGuard's window must be at least 2 values, got " +
             std::to_string(options_.window);
    });
    detail::require(std::isfinite(options_.threshold) && options_.threshold > 0, [&] {
      return "SpikeGuard's threshold must be a positive number, got " +
             std::to_string(options_.threshold);
    });
  }

  /// The options as given.
  const SpikeGuardOptions& options() const { return options_; }

  /// (value - mean) / standard deviation over the window: 0 until the window is full or when its
  /// values are all equal; +infinity for a value that is not finite.
  double z_score(double value) const {
    if (!std::isfinite(value)) return std::numeric_limits<double>::infinity();
    if (values_.size() < options_.window) return 0;
    const double n = static_cast<double>(values_.size());
    double mean = 0;
    for (double v : values_) mean += v;
    mean /= n;
    double variance = 0;
    for (double v : values_) variance += (v - mean) * (v - mean);
    const double sd = std::sqrt(variance / n);
    return sd > 0 ? (value - mean) / sd : 0;
  }

  /// Whether `value` is a spike: its z-score is above the threshold.
  bool is_spike(double value) const { return z_score(value) > options_.threshold; }

  /// Adds `value` to the window (dropping the oldest once full); a value that is not finite is
  /// ignored.
  void add(double value) {
    if (!std::isfinite(value)) return;
    values_.push_back(value);
    if (values_.size() > options_.window) values_.pop_front();
  }

  /// Values in the window now.
  std::size_t size() const { return values_.size(); }

 private:
  SpikeGuardOptions options_;
  std::deque<double> values_;
};

}  // namespace gpipe::optim
