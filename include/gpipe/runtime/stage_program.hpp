#pragma once
// What the runtime needs of a model, with the layers' types erased: per stage its sizes and its
// three ops as function pointers for one kernel context, and the loss's hooks for one target
// type. The executor, the parameter store and the step runner are written against these, so
// they are compiled once per backend, not once per model: a model type costs a program of three
// small functions per stage, and a translation unit that trains many models (a test of every
// schedule) compiles the runtime once.

#include <array>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "gpipe/model/layer.hpp"

namespace gpipe::detail {

// skips_input_gradient<L>: L::backward_input accepts dx == nullptr (see model/detail/chain.hpp).
template <class L>
constexpr bool skips_input_gradient = requires {
  requires L::skips_input_gradient;
};

// ActivationContext<Kernels, A>: the kernel context a device runs ops on activations of type A
// with: the backend's own (float), or the bf16 context its float context makes
// (bf16_context(), for gpipe::MixedBf16). `of(k)` is it for the backend's context k.
template <class Kernels, class A>
struct ActivationContext {
  using type = Kernels;
  static Kernels& of(Kernels& k) { return k; }
};
template <class Kernels>
requires requires(Kernels& k) { k.bf16_context(); }
struct ActivationContext<Kernels, bf16> {
  using type = std::remove_reference_t<decltype(std::declval<Kernels&>().bf16_context())>;
  static type& of(Kernels& k) { return k.bf16_context(); }
};

// One stage (a bound Stage chain) for kernel context Kernels: sizes per row (in elements of
// the context's value_type), and its ops. Its stash is two buffers (the Args' stash and
// cheap_stash): the part Remat::selective keeps, kept_stash_per_row, and the part it drops and
// `recompute` rebuilds, cheap_stash_per_row; together the chain's stash_per_row.
template <class Kernels>
struct StageProgram {
  using T = typename Kernels::value_type;
  std::size_t in_features = 0, out_features = 0, num_params = 0;
  std::size_t kept_stash_per_row = 0, cheap_stash_per_row = 0, grad_stash_per_row = 0,
              workspace_per_row = 0;
  bool skips_input_gradient = false;  // backward_input takes dx == nullptr
  void (*init)(std::span<float>, Rng&) = nullptr;
  void (*forward)(Kernels&, const ForwardArgs<T>&) = nullptr;
  void (*recompute)(Kernels&, const ForwardArgs<T>&) = nullptr;  // the cheap stash from the rest
  void (*backward_input)(Kernels&, const BackwardInputArgs<T>&) = nullptr;
  void (*backward_weight)(Kernels&, const BackwardWeightArgs<T>&) = nullptr;
};

// stage_program<S, Kernels>(): StageProgram of the concrete stage chain S.
template <class S, class Kernels>
constexpr StageProgram<Kernels> stage_program() {
  using T = typename Kernels::value_type;
  return {
      .in_features = S::in_features,
      .out_features = S::out_features,
      .num_params = S::num_params,
      .kept_stash_per_row = S::stash_per_row - S::cheap_stash_per_row,
      .cheap_stash_per_row = S::cheap_stash_per_row,
      .grad_stash_per_row = S::grad_stash_per_row,
      .workspace_per_row = workspace_per_row_v<S>,
      .skips_input_gradient = skips_input_gradient<S>,
      .init = [](std::span<float> p, Rng& rng) { S::init(p, rng); },
      .forward = [](Kernels& k, const ForwardArgs<T>& a) { S::forward(k, a); },
      .recompute = [](Kernels& k, const ForwardArgs<T>& a) { S::recompute(k, a); },
      .backward_input = [](Kernels& k, const BackwardInputArgs<T>& a) { S::backward_input(k, a); },
      .backward_weight = [](Kernels& k,
                            const BackwardWeightArgs<T>& a) { S::backward_weight(k, a); }};
}

// model_program<Model, Kernels>: the StageProgram of every stage of a Pipeline, in order.
template <class Model, class Kernels, std::size_t... S>
constexpr std::array<StageProgram<Kernels>, sizeof...(S)> stage_programs(
    std::index_sequence<S...>) {
  return {stage_program<typename Model::template stage_t<S>, Kernels>()...};
}
template <class Model, class Kernels>
inline constexpr std::array<StageProgram<Kernels>, Model::num_stages> model_program =
    stage_programs<Model, Kernels>(std::make_index_sequence<Model::num_stages>{});

// A loss for kernel context Kernels and targets of type Target (see model/loss.hpp): y and dy
// are activations (Kernels::value_type), the loss float.
template <class Kernels, class Target>
struct LossProgram {
  using T = typename Kernels::value_type;
  std::size_t (*targets_per_row)(std::size_t out_features) = nullptr;
  // of the whole mini-batch's targets
  double (*normalizer)(std::span<const Target> targets, std::size_t out_features) = nullptr;
  void (*check)(std::span<const Target> targets, std::size_t out_features) = nullptr;
  // loss_sum[0] and dy (rows, out) of one micro-batch, in device memory
  void (*apply)(Kernels&, std::size_t rows, std::size_t out, const T* y, const Target* targets,
                float grad_scale, T* dy, float* loss_sum) = nullptr;
  bool in_place = false;  // apply takes dy == y (loss_in_place)
};

template <class Loss, class Kernels>
inline constexpr LossProgram<Kernels, typename Loss::target_type> loss_program{
    .targets_per_row = [](std::size_t out) { return Loss::targets_per_row(out); },
    .normalizer = [](std::span<const typename Loss::target_type> targets,
                     std::size_t out) { return Loss::normalizer(targets, out); },
    .check = [](std::span<const typename Loss::target_type> targets,
                std::size_t out) { Loss::check(targets, out); },
    .apply =
        [](Kernels& k, std::size_t rows, std::size_t out, const typename Kernels::value_type* y,
           const typename Loss::target_type* targets, float grad_scale,
           typename Kernels::value_type* dy,
           float* loss_sum) { Loss::apply(k, rows, out, y, targets, grad_scale, dy, loss_sum); },
    .in_place = loss_in_place<Loss>};

}  // namespace gpipe::detail
