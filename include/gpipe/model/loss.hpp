#pragma once
// Losses, applied by the last stage to its output. Both average over the whole mini-batch as
// PyTorch's reduction='mean': SoftmaxCrossEntropy over the rows whose target is not ignored
// (torch.nn.CrossEntropyLoss, ignore_index -100), MSELoss over all rows * out_features elements
// (torch.nn.MSELoss).
//
// A loss L provides (the concepts `loss` and `loss_for` below, each from named parts): target_type;
// targets_per_row(out_features); normalizer(targets, out_features), the divisor of the summed loss
// from the whole mini-batch's targets (micro-batches are scaled by the mini-batch's, not their
// own); check(targets, out_features) (throws gpipe::Error for a bad target); and apply(ctx, rows,
// out_features, y, targets, grad_scale, dy, loss_sum), which writes the micro-batch's summed loss
// and dy = grad_scale * d(sum)/dy. A loss that declares `static constexpr bool in_place = true`
// (both built-in ones) accepts dy == y: the last stage then keeps one (rows, out_features) buffer
// for its output and its gradient instead of two (loss_in_place below; predict_memory's
// in_place_loss).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gpipe/error.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {

/// has_targets<L>: `target_type` (what one target is: class ids `std::int32_t`, values `float`),
/// static `targets_per_row(out_features)` and `normalizer(targets, out_features)` (the divisor
/// that makes the summed loss the mini-batch's mean, from all the mini-batch's targets, a
/// `std::span<const target_type>`).
template <class L>
concept has_targets = requires(std::size_t n, std::span<const typename L::target_type> targets) {
  typename L::target_type;
  { L::targets_per_row(n) } -> std::convertible_to<std::size_t>;
  { L::normalizer(targets, n) } -> std::convertible_to<double>;
};

/// has_target_check<L>: static `check(std::span<const target_type>, out_features)`, which throws
/// gpipe::Error for a target the loss cannot take (a class id out of range).
template <class L>
concept has_target_check = has_targets<L> &&
    requires(std::span<const typename L::target_type> targets, std::size_t n) {
  L::check(targets, n);
};

/// loss<L>: what the Trainer needs of its Loss before any device runs it.
template <class L>
concept loss = has_targets<L> && has_target_check<L>;

/// loss_for<L, Ctx>: L's static `apply(ctx, rows, out_features, y, targets, grad_scale, dy,
/// loss_sum)` runs with the kernel context Ctx (activations of its value_type, loss in master_t of
/// it).
template <class L, class Ctx>
concept loss_for = loss<L> &&
    requires(Ctx& ctx, std::size_t n, const typename Ctx::value_type* y,
             const typename L::target_type* targets, typename Ctx::value_type* dy,
             master_t<typename Ctx::value_type>* out) {
  L::apply(ctx, n, n, y, targets, 1.0f, dy, out);
};

/// loss_in_place<L>: L::apply accepts dy == y (it reads each value of y before writing dy there).
template <class L>
inline constexpr bool loss_in_place = requires {
  requires L::in_place;
};

namespace detail {

// explain_loss_for<L, Ctx>(): true for a loss_for<L, Ctx>; otherwise a static_assert that names
// the first piece L lacks (the Trainer checks its Loss with it).
template <class L, class Ctx>
constexpr bool explain_loss_for() {
  if constexpr (loss_for<L, Ctx>) {
    return true;
  } else if constexpr (!requires { typename L::target_type; }) {
    static_assert(lacks<L>,
                  "gpipe: a loss needs `using target_type = ...` (std::int32_t class ids, float "
                  "values); see gpipe/model/loss.hpp");
  } else if constexpr (!requires(std::size_t n) {
                         { L::targets_per_row(n) } -> std::convertible_to<std::size_t>;
                       }) {
    static_assert(lacks<L>, "gpipe: a loss needs static targets_per_row(std::size_t out_features)");
  } else if constexpr (!has_targets<L>) {
    static_assert(lacks<L>,
                  "gpipe: a loss needs static normalizer(std::span<const target_type> targets, "
                  "std::size_t out_features), the divisor of the summed loss");
  } else if constexpr (!has_target_check<L>) {
    static_assert(lacks<L>,
                  "gpipe: a loss needs static check(std::span<const target_type>, std::size_t "
                  "out_features) (throws gpipe::Error for a bad target)");
  } else {
    static_assert(lacks<L, Ctx>,
                  "gpipe: a loss needs static apply(Ctx&, rows, out_features, y, targets, "
                  "grad_scale, dy, loss_sum) callable with this backend's kernel context");
  }
  return false;
}

}  // namespace detail

/// The target that SoftmaxCrossEntropy ignores, as PyTorch's default `ignore_index`: its row adds
/// nothing to the loss nor to its normalizer, and gets a zero gradient.
inline constexpr std::int32_t ignore_index = -100;

/// Softmax cross-entropy over the model's out_features classes, as torch.nn.CrossEntropyLoss:
/// one class id per row, loss averaged over the rows whose target is not `ignore_index` (-100).
struct SoftmaxCrossEntropy {
  /// Targets are class ids in [0, classes), or ignore_index.
  using target_type = std::int32_t;
  /// One class id per row.
  static constexpr std::size_t targets_per_row(std::size_t) { return 1; }
  /// apply may write dlogits over the logits (loss_in_place).
  static constexpr bool in_place = true;
  /// The mini-batch loss is the summed loss divided by this: its targets that are not ignored.
  static constexpr double normalizer(std::span<const std::int32_t> targets, std::size_t) {
    std::size_t counted = 0;
    for (const std::int32_t t : targets) counted += t != ignore_index ? 1 : 0;
    return static_cast<double>(counted);
  }
  /// Throws gpipe::Error naming the first target neither in [0, classes) nor ignore_index, with
  /// its index and value, or when every target is ignored (the mean of no rows has no value).
  static void check(std::span<const std::int32_t> targets, std::size_t classes) {
    bool any_counted = false;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (targets[i] == ignore_index) continue;
      if (targets[i] < 0 || static_cast<std::size_t>(targets[i]) >= classes)
        throw Error("gpipe: SoftmaxCrossEntropy target " + std::to_string(i) + " is " +
                    std::to_string(targets[i]) + ", expected a class id in [0, " +
                    std::to_string(classes) + ") or " + std::to_string(ignore_index) +
                    " (ignored)");
      any_counted = true;
    }
    if (!any_counted)
      throw Error("gpipe: SoftmaxCrossEntropy: all " + std::to_string(targets.size()) +
                  " targets are " + std::to_string(ignore_index) +
                  " (ignored); expected at least one class id in [0, " + std::to_string(classes) +
                  ") to average the loss over");
  }
  /// For one micro-batch, in device memory: loss_sum[0] = sum_r -log softmax(logits_r)[t_r] over
  /// the rows whose target is not ignore_index (overwritten) and dlogits (rows, classes) =
  /// grad_scale * (softmax(logits) - onehot(t)), 0 on an ignored row, from logits (rows, classes)
  /// and targets (rows); dlogits may be logits. grad_scale is 1 / normalizer of the mini-batch.
  template <class Ctx, class T>
  static void apply(Ctx& ctx, std::size_t rows, std::size_t classes, const T* logits,
                    const std::int32_t* targets, master_t<T> grad_scale, T* dlogits,
                    master_t<T>* loss_sum) {
    ctx.softmax_cross_entropy(rows, classes, logits, targets, grad_scale, dlogits, loss_sum);
  }
};

/// Mean squared error, as torch.nn.MSELoss: one target value per output element, loss averaged over
/// all rows * out_features elements.
struct MSELoss {
  /// Targets are real values, one per output element.
  using target_type = float;
  /// A full row of targets: (rows, out_features) in all.
  static constexpr std::size_t targets_per_row(std::size_t out_features) { return out_features; }
  /// apply may write dy over y (loss_in_place).
  static constexpr bool in_place = true;
  /// The mini-batch loss is the summed loss divided by this: all its elements, rows *
  /// out_features, as many as targets.
  static constexpr double normalizer(std::span<const float> targets, std::size_t) {
    return static_cast<double>(targets.size());
  }
  /// Every real target is valid: never throws.
  static void check(std::span<const float>, std::size_t) {}
  /// For one micro-batch, in device memory: loss_sum[0] = sum (y - t)^2 over all rows *
  /// out_features elements (overwritten) and dy (rows, out_features) = grad_scale * 2 (y - t); dy
  /// may be y. grad_scale is 1 / normalizer of the mini-batch.
  template <class Ctx, class T>
  static void apply(Ctx& ctx, std::size_t rows, std::size_t out_features, const T* y,
                    const float* targets, master_t<T> grad_scale, T* dy, master_t<T>* loss_sum) {
    ctx.mse(rows * out_features, y, targets, grad_scale, dy, loss_sum);
  }
};

}  // namespace gpipe
