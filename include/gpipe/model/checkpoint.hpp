#pragma once
// Checkpoint<Layers...>: activation checkpointing of a segment inside a Stage. Forward keeps
// nothing of the segment beyond its input (which the enclosing stage keeps anyway); backward
// recomputes the segment's forward and keeps what it computed until backward_weight. So with
// Remat::never, a stage keeps its other layers' activations and only the segment's input.
//
//   Stage<Linear<64, 256>, Checkpoint<ReLU, Linear<256, 256>, GELU>, Linear<256, 10>>
//
// The wrapper is transparent for parameter names: the wrapped layers keep the nn.Sequential
// indices they would have without it, so checkpointing does not change a saved file.
//
// Memory per row of the segment body (stash S, grad stash G, workspace X of the body):
//   stash 0;  grad stash S + G (recomputed activations and the body's B-to-W gradients);
//   workspace max(S, out_features) + X (forward: the body's stash, dropped at the end;
//   backward: the recomputed output, which nobody needs).

#include <cstddef>
#include <span>
#include <tuple>

#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {
namespace detail {

template <class Body>
struct CheckpointOf {
  static constexpr std::size_t in_features = Body::in_features;
  static constexpr std::size_t out_features = Body::out_features;
  static constexpr std::size_t num_params = Body::num_params;
  static constexpr std::size_t stash_per_row = 0;
  static constexpr std::size_t grad_stash_per_row = Body::stash_per_row + Body::grad_stash_per_row;
  static constexpr std::size_t workspace_per_row =
      (Body::stash_per_row > out_features ? Body::stash_per_row : out_features) +
      Body::workspace_per_row;
  static constexpr std::size_t sequential_size = Body::sequential_size;
  static constexpr bool transparent = true;

  static constexpr auto param_specs() { return Body::param_specs(); }
  static void init(std::span<float> params, Rng& rng) { Body::init(params, rng); }

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    auto* body_stash = a.workspace;
    Body::forward(ctx, {a.rows, a.x, a.y, a.params, body_stash,
                        a.workspace + workspace_offset(a.rows), a.compute_params, a.document});
  }

  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    auto* body_stash = a.grad_stash;
    auto* body_grad_stash = a.grad_stash + Body::stash_per_row * a.rows;
    auto* body_workspace = a.workspace + workspace_offset(a.rows);
    Body::forward(ctx, {a.rows, a.x, a.workspace, a.params, body_stash, body_workspace,
                        a.compute_params, a.document});
    Body::backward_input(ctx, {a.rows, a.x, a.dy, a.dx, a.params, body_stash, body_grad_stash,
                               body_workspace, a.compute_params, nullptr, a.document});
  }

  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    Body::backward_weight(ctx, {a.rows, a.x, a.dy, a.params, a.grad_stash,
                                a.grad_stash + Body::stash_per_row * a.rows, a.grads,
                                a.workspace + workspace_offset(a.rows), a.document});
  }

 private:
  static constexpr std::size_t workspace_offset(std::size_t rows) {
    return (Body::stash_per_row > out_features ? Body::stash_per_row : out_features) * rows;
  }
};

}  // namespace detail

/// Activation checkpointing of a segment of a Stage: forward keeps nothing of Layers beyond
/// their input, and backward_input recomputes their forward first. Per row of the segment's body
/// (stash S, grad stash G, workspace X): stash 0, grad stash S + G, workspace
/// max(S, out_features) + X. Transparent for parameter names: the wrapped layers keep their
/// nn.Sequential indices.
template <layer_spec... Layers>
struct Checkpoint {
  static_assert(sizeof...(Layers) > 0, "gpipe: Checkpoint needs at least one layer");

  /// Marks a width_generic_layer: a Stage binds it to the width that comes in.
  using width_generic = void;
  /// The first wrapped layer's own width, or 0 when it takes the width from before.
  static constexpr std::size_t natural_in_features =
      detail::natural_in_features_v<std::tuple_element_t<0, std::tuple<Layers...>>>;
  /// Entries of nn.Sequential it stands for: those of the wrapped layers, not 1.
  static constexpr std::size_t sequential_size = (std::size_t{0} + ... + sequential_size_v<Layers>);

  /// The bound layer when N features come in, in a model of T tokens per sample (0: none).
  template <std::size_t N, std::size_t T>
  using with_shape = detail::CheckpointOf<detail::bind_chain_t<N, T, Layers...>>;
  /// `with_shape<N, 0>`: the bound layer outside a token model.
  template <std::size_t N>
  using with_features = with_shape<N, 0>;
};

}  // namespace gpipe
