#pragma once
// The optimizer concept: what a type must provide to be the argument of Trainer::step, from
// named parts as gpipe::layer is. SGD and AdamW (sgd.hpp, adamw.hpp) are the library's; a
// user's own optimizer provides the same three pieces.

#include <concepts>
#include <cstddef>

#include "gpipe/model/layer.hpp"

namespace gpipe {

/// has_state_size<O>: static `state_per_param`, the floats of state O keeps per parameter (SGD's
/// momentum buffer: 1; AdamW's two moments: 2), which the Trainer allocates and zeroes on each
/// stage's device.
template <class O>
concept has_state_size = requires {
  { O::state_per_param } -> std::convertible_to<std::size_t>;
};

/// has_hyperparameter_check<O>: `check() const`, which throws gpipe::Error for a hyperparameter
/// out of range; the Trainer calls it before every update.
template <class O>
concept has_hyperparameter_check = requires(const O& o) {
  o.check();
};

/// optimizer<O>: what the Trainer needs of an optimizer before any device runs it.
template <class O>
concept optimizer = has_state_size<O> && has_hyperparameter_check<O>;

/// optimizer_for<O, Ctx>: O's `update(ctx, n, params, grads, state, step) const` runs with the
/// kernel context Ctx: one update of n float parameters in place, step = 1, 2, ... counted by the
/// Trainer.
template <class O, class Ctx>
concept optimizer_for = optimizer<O> &&
    requires(const O& o, Ctx& ctx, std::size_t n, float* p, const float* g) {
  o.update(ctx, n, p, g, p, n);
};

namespace detail {

// explain_optimizer_for<O, Ctx>(): true for an optimizer_for<O, Ctx>; otherwise a static_assert
// that names the first piece O lacks (Trainer::step checks its argument with it).
template <class O, class Ctx>
constexpr bool explain_optimizer_for() {
  if constexpr (optimizer_for<O, Ctx>) {
    return true;
  } else if constexpr (!has_state_size<O>) {
    static_assert(lacks<O>,
                  "gpipe: an optimizer needs static constexpr std::size_t state_per_param (floats "
                  "of state per parameter; 0 for none); see gpipe/optim/optimizer.hpp");
  } else if constexpr (!has_hyperparameter_check<O>) {
    static_assert(lacks<O>,
                  "gpipe: an optimizer needs check() const (throws gpipe::Error for a "
                  "hyperparameter out of range)");
  } else {
    static_assert(lacks<O, Ctx>,
                  "gpipe: an optimizer needs update(Ctx&, std::size_t n, float* params, const "
                  "float* grads, float* state, std::size_t step) const callable with this "
                  "backend's kernel context");
  }
  return false;
}

}  // namespace detail
}  // namespace gpipe
