#pragma once
// The optimizer concept: what a type must provide to be the argument of Trainer::step, from
// named parts as gpipe::layer is. SGD and AdamW (sgd.hpp, adamw.hpp) are the library's; a
// user's own optimizer provides the same three pieces. An optimizer that treats tensors by their
// shape (AdamW's Decay::matrices, nanoGPT's two groups) also provides the update that takes the
// stage's tensors (`grouped_optimizer_for`), which the Trainer then calls instead; one that can
// also write the updated parameters rounded to bf16 in the same pass (`fused_bf16_optimizer_for`)
// spares a gpipe::MixedBf16 trainer its rounding of the weights before the next step.

#include <charconv>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>

#include "gpipe/model/layer.hpp"
#include "gpipe/model/precision.hpp"

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

namespace optim {

/// Which parameters an optimizer's weight decay applies to.
enum class Decay {
  all,       ///< every parameter (PyTorch's default)
  matrices,  ///< tensors of two or more dimensions only: weights of Linear and the embeddings,
             ///< not biases, not LayerNorm (nanoGPT's two parameter groups)
};

/// One parameter tensor within a stage's flat parameter array: elements [offset, offset + size)
/// of a tensor of `dims` dimensions. The Trainer gives a grouped optimizer a stage's tensors in
/// order of offset, covering the array without gaps.
struct ParameterRange {
  std::size_t offset = 0;  ///< first element in the stage's flat array
  std::size_t size = 0;    ///< elements
  std::size_t dims = 1;    ///< 1 for a bias or a LayerNorm parameter, 2 for a matrix
};

}  // namespace optim

/// grouped_optimizer_for<O, Ctx>: O's `update(ctx, n, params, grads, state, step, tensors)`
/// takes the stage's tensors (optim::ParameterRange, in order) as well, so that it may treat them
/// by shape; the Trainer calls it instead of the update without them. The state layout is the
/// same (state_per_param planes of n floats).
template <class O, class Ctx>
concept grouped_optimizer_for = optimizer_for<O, Ctx> &&
    requires(const O& o, Ctx& ctx, std::size_t n, float* p, const float* g,
             std::span<const optim::ParameterRange> tensors) {
  o.update(ctx, n, p, g, p, n, tensors);
};

/// fused_bf16_optimizer_for<O, Ctx>: O's grouped update also takes `bf16* params_bf16` (n),
/// `update(ctx, n, params, grads, state, step, tensors, params_bf16)`, and writes there every
/// updated parameter rounded to bf16 (nearest even, as a convert of the parameters would). A
/// gpipe::MixedBf16 Trainer passes its stages' bf16 copies of the weights, which the GEMMs of the
/// next step read, and then rounds none of them again before that step.
template <class O, class Ctx>
concept fused_bf16_optimizer_for = grouped_optimizer_for<O, Ctx> &&
    requires(const O& o, Ctx& ctx, std::size_t n, float* p, const float* g,
             std::span<const optim::ParameterRange> tensors, bf16* params_bf16) {
  o.update(ctx, n, p, g, p, n, tensors, params_bf16);
};

namespace detail {

// `value` as the shortest decimal that reads back as the same double ("0.001", "1e-08").
inline std::string decimal(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

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
