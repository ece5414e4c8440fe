#pragma once
// Residual<Layers...>: y = x + f(x) with f the chain of Layers, whose output width must equal its
// input width. Its children are named "i.j.weight" for the j-th inner layer of layer i.
// The width comes from the first inner layer when it has one, else from the layer before.

#include <cstddef>
#include <span>

#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe {
namespace detail {

template <class Body>
struct ResidualOf : Body {
  static constexpr std::size_t sequential_size = 1;  // one entry, its children "i.j"

  static_assert(
      feature_chain_check<out_features<Body::out_features>, in_features<Body::in_features>>::value,
      "gpipe: the body of a Residual must keep the width");

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    Body::forward(ctx, a);
    ctx.add(a.rows * Body::out_features, a.y, a.x, a.y);
  }
  // dx = dy + B_f(dy): the add in the body's first layer's B where it takes it (a layer norm's)
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    if constexpr (adds_to_input_gradient<Body, Ctx>) {
      Body::backward_input_adding(ctx, a, a.dy);
    } else {
      Body::backward_input(ctx, a);
      ctx.add(a.rows * Body::in_features, a.dx, a.dy, a.dx);
    }
  }

  // The residual-add fusion (model/layer.hpp): y = f(x) + x left to the next layer as y = f(x)
  // and r = x; the input's own pending add given to the body's first layer where it takes it.
  template <class Ctx>
  requires adds_input<Body, Ctx>
  static void forward_adding_input(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
                                   const typename Ctx::value_type* r) {
    Body::forward_adding_input(ctx, a, r);
    ctx.add(a.rows * Body::out_features, a.y, a.x, a.y);
  }
  template <class Ctx>
  static const typename Ctx::value_type* forward_leaving_add(
      Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
      const typename Ctx::value_type* r_in) {
    if constexpr (adds_input<Body, Ctx>) {
      if (r_in != nullptr) {
        Body::forward_adding_input(ctx, a, r_in);
        return a.x;
      }
    }
    Body::forward(ctx, a);
    return a.x;
  }
  // Hides the body's: the residual's input gradient has an add of its own, so it takes none.
  template <class Ctx>
  static void backward_input_adding(Ctx&, const BackwardInputArgs<typename Ctx::value_type>&,
                                    const typename Ctx::value_type*) = delete;
};

}  // namespace detail

/// Skip connection around a chain of layers: y = x + f(x), f = Layers applied in order, whose
/// output width must equal its input width (a static_assert says so otherwise). One entry of
/// nn.Sequential; its children are named "i.j.weight". A width-generic spec: a Stage binds it.
template <layer_spec... Layers>
struct Residual {
  static_assert(sizeof...(Layers) > 0, "gpipe: Residual needs at least one layer");

  /// The bound layer when N features come in, in a model of T tokens per sample (0: none); it
  /// keeps its body's stash and grad stash.
  template <std::size_t N, std::size_t T>
  using with_shape = detail::ResidualOf<detail::bind_chain_t<N, T, Layers...>>;
  /// `with_shape<N, 0>`: the bound layer outside a token model.
  template <std::size_t N>
  using with_features = with_shape<N, 0>;
  /// Marks a width_generic_layer.
  using width_generic = void;
  /// The first inner layer's own width, or 0 when it too takes the width from before.
  static constexpr std::size_t natural_in_features =
      detail::natural_in_features_v<std::tuple_element_t<0, std::tuple<Layers...>>>;
};

}  // namespace gpipe
