#pragma once
// A chain of layers run one after another: the body of a Stage and of a Residual.
//
// bind_chain_t<N, T, Ls...>: binds each layer spec to the width produced by the one before it
//   (N for the first) and to the model's tokens per sample T (0: not a token model), and checks
//   that consecutive widths agree and that every layer that fixes T fixes the model's, naming
//   both values when they do not. bind_chain_at_t<N, T, S, Ls...> does the same for stage S of
//   a Pipeline, and a width that does not fit also names the stage and the layer's position.
// Chain<Bs...> over bound layers is itself a layer:
//   forward:  a_0 = x, a_{i+1} = L_i(a_i), y = a_n; a_1..a_{n-1} and every L_i's stash are kept
//             in the chain's stash, each tensor contiguous (rows, width);
//   B:        g_n = dy, g_i = B_i(g_{i+1}); g_1..g_{n-1} and every L_i's grad stash are kept in
//             the chain's grad stash, dx = g_0. B_i gets its output a_{i+1} as
//             BackwardInputArgs::y for i < n - 1 (nullptr for the last: a_n is the chain's y,
//             which a Residual, say, does not keep as such). When nobody wants dx (the first stage)
//             and skips_input_gradient holds (L_0 keeps no grad stash for its W), the caller passes
//             dx = nullptr and B_0 does not run (for a first Linear that saves the GEMM dy W,
//             whose result nobody reads);
//   W:        W_i(a_i, g_{i+1}) for every i;
//   recompute (Remat::selective): the cheap part of the stash (the outputs and stashes of the
//             layers marked cheap_to_recompute, but the last's, and the layers' own cheap
//             parts) rebuilt from x and the rest, before B.
// Where two consecutive layers form a LayerPair (model/layer.hpp) for the context, B runs the
// pair's backward_input in place of theirs (it may leave g_{i+1}, the gradient between them,
// unwritten), or the two layers' where the pair declines.
// Where a layer leaves a residual add and the next one adds its input (model/layer.hpp), F lets
// the next layer form a_{i+1} = a_{i+1} + r (a residual's add fused into the layer norm after it);
// the chain itself adds its input, leaves its add and adds to its input gradient where its first
// or last layer does.
// Every layer of the chain gets the chain's document ids (the Args' `document`) as they are.

#include <array>
#include <concepts>
#include <cstddef>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gpipe/model/layer.hpp"

namespace gpipe::detail {

// Shows up in the compiler's message as
// feature_chain_check<out_features<A>, in_features<B>, at_stage_layer<S, P>>: A features come
// into layer P (counted from 0) of stage S, which takes B; a chain outside a Pipeline's stages
// (the body of a Residual, a Checkpoint or a TransformerBlock) is `in_a_block` instead.
template <std::size_t N>
struct out_features {};
template <std::size_t N>
struct in_features {};
template <std::size_t S, std::size_t P>
struct at_stage_layer {};
struct in_a_block {};
template <class Out, class In, class Where = in_a_block>
struct feature_chain_check;
template <std::size_t A, std::size_t B, class Where>
struct feature_chain_check<out_features<A>, in_features<B>, Where> {
  static_assert(A == B,
                "gpipe: feature chain mismatch: a layer takes another width than the layer or "
                "stage before it produces (feature_chain_check<out_features<produced>, "
                "in_features<taken>, at_stage_layer<stage, layer>> names both and where)");
  static constexpr bool value = A == B;
};

// Shows up in the compiler's message as
// token_count_check<model_tokens<A>, layer_tokens<B>>: the model's samples are A tokens long
// (its Embedding's T) but a layer fixes B.
template <std::size_t N>
struct model_tokens {};
template <std::size_t N>
struct layer_tokens {};
template <class Model, class Layer>
struct token_count_check;
template <std::size_t A, std::size_t B>
struct token_count_check<model_tokens<A>, layer_tokens<B>> {
  static_assert(A == B,
                "gpipe: tokens per sample mismatch: a layer fixes a different T than the model's "
                "Embedding (both are named in token_count_check<...>)");
  static constexpr bool value = A == B;
};

// Shows up as sequence_layer_needs_tokens<L, 0>: L (attention, a Transformer block) acts on whole
// samples of T tokens, which only a pipeline that starts with Embedding<V, T, D> has.
template <class L, std::size_t T>
struct sequence_layer_needs_tokens {
  static_assert(T > 0,
                "gpipe: a sequence layer (attention, TransformerBlock) needs token samples: start "
                "the pipeline with Embedding<V, T, D> (the layer is named in "
                "sequence_layer_needs_tokens<...>)");
  static constexpr bool value = T > 0;
};

// tokens_per_sample_v<L>: the T a layer (or spec) fixes, 0 when it fixes none.
template <class L>
constexpr std::size_t tokens_per_sample_v = 0;
template <class L>
requires requires { L::tokens_per_sample; }
constexpr std::size_t tokens_per_sample_v<L> = L::tokens_per_sample;

// tokens_agree<L, T>(): L fixes no T, or the model's.
template <class L, std::size_t T>
constexpr bool tokens_agree() {
  if constexpr (tokens_per_sample_v<L> == 0)
    return true;
  else
    return token_count_check<model_tokens<T>, layer_tokens<tokens_per_sample_v<L>>>::value;
}

// bound_layer_t<L, N, T, Where>: the concrete layer for spec L when N features come in, in a
// model of T tokens per sample; Where names its place in errors.
template <class L, std::size_t N, std::size_t T, class Where = in_a_block>
struct bound_layer {
  static_assert(feature_chain_check<out_features<N>, in_features<L::in_features>, Where>::value);
  static_assert(tokens_agree<L, T>());
  using type = L;
};
template <width_generic_layer L, std::size_t N, std::size_t T, class Where>
struct bound_layer<L, N, T, Where> {
  using type = typename L::template with_features<N>;
};
template <width_generic_layer L, std::size_t N, std::size_t T, class Where>
requires requires { typename L::template with_shape<N, T>; }
struct bound_layer<L, N, T, Where> {
  using type = typename L::template with_shape<N, T>;
};
template <sequence_layer L, std::size_t N, std::size_t T, class Where>
struct bound_layer<L, N, T, Where> {
  static_assert(sequence_layer_needs_tokens<L, T>::value);
  using type =
      typename bound_layer<typename L::template with_tokens<(T > 0 ? T : 1)>, N, T, Where>::type;
};
template <class L, std::size_t N, std::size_t T, class Where = in_a_block>
using bound_layer_t = typename bound_layer<L, N, T, Where>::type;

// natural_in_features_v<L>: the width L takes on its own (0 if only its predecessor can tell).
template <class L>
constexpr std::size_t natural_in_features_v = 0;
template <layer L>
constexpr std::size_t natural_in_features_v<L> = L::in_features;
template <width_generic_layer L>
constexpr std::size_t natural_in_features_v<L> = L::natural_in_features;
template <sequence_layer L>
constexpr std::size_t natural_in_features_v<L> = L::natural_in_features;

template <class... Bs>
struct Chain;

// Stage: the stage index S, or `no_stage` for a chain outside a Pipeline's stages; P: the
// position of the first layer of Ls.
inline constexpr std::size_t no_stage = static_cast<std::size_t>(-1);
template <std::size_t S, std::size_t P>
using where_t = std::conditional_t<S == no_stage, in_a_block, at_stage_layer<S, P>>;

template <std::size_t N, std::size_t T, std::size_t S, std::size_t P, class... Ls>
struct bind_chain;
template <std::size_t N, std::size_t T, std::size_t S, std::size_t P>
struct bind_chain<N, T, S, P> {
  using type = Chain<>;
};
template <std::size_t N, std::size_t T, std::size_t S, std::size_t P, class L, class... Rest>
struct bind_chain<N, T, S, P, L, Rest...> {
  using head = bound_layer_t<L, N, T, where_t<S, P>>;
  template <class C>
  struct prepend;
  template <class... Bs>
  struct prepend<Chain<Bs...>> {
    using type = Chain<head, Bs...>;
  };
  using type =
      typename prepend<typename bind_chain<head::out_features, T, S, P + 1, Rest...>::type>::type;
};
// bind_chain_t<N, T, L0, L1, ...> = Chain<L0 at N, L1 at L0's out, ...>, all at T tokens
template <std::size_t N, std::size_t T, class... Ls>
using bind_chain_t = typename bind_chain<N, T, no_stage, 0, Ls...>::type;
// the same for stage S of a Pipeline (errors name the stage and the layer)
template <std::size_t N, std::size_t T, std::size_t S, class... Ls>
using bind_chain_at_t = typename bind_chain<N, T, S, 0, Ls...>::type;

// is_transparent_v<L>: L is a wrapper whose parameters keep the sequential indices of the layers
// it wraps (param_specs() paths already start with those relative indices), e.g. Checkpoint.
template <class L>
constexpr bool is_transparent_v = requires {
  L::transparent;
};

// max_param_depth<Bs...>() = the deepest path a Chain of Bs gives its parameter tensors, before
// the chain's own index is prepended.
template <class... Bs>
constexpr std::size_t max_param_depth() {
  std::size_t depth = 0;
  auto visit = [&](const auto& specs, bool transparent) {
    for (const ParamSpec& s : specs) {
      const std::size_t d = s.depth - (transparent ? 1 : 0);
      depth = d > depth ? d : depth;
    }
  };
  (visit(Bs::param_specs(), is_transparent_v<Bs>), ...);
  return depth;
}

template <class... Bs>
struct Chain {
  static_assert(sizeof...(Bs) > 0, "gpipe: a stage or residual needs at least one layer");
  static_assert((layer<Bs> && ...), "gpipe: every bound layer must satisfy gpipe::layer");
  // param_specs() prepends one index to each child's path, which holds ParamSpec::max_depth.
  static_assert(max_param_depth<Bs...>() < ParamSpec::max_depth,
                "gpipe: composite layers are nested deeper than ParamSpec::max_depth allows");

  // Whether every layer runs with the kernel context Ctx; a static_assert naming what one lacks
  // otherwise (detail::explain_layer_for).
  template <class Ctx>
  static constexpr bool explain_runs_on() {
    return (explain_layer_for<Bs, Ctx>() && ...);
  }

  static constexpr std::size_t size = sizeof...(Bs);
  using first_layer = std::tuple_element_t<0, std::tuple<Bs...>>;
  using last_layer = std::tuple_element_t<size - 1, std::tuple<Bs...>>;
  static constexpr std::array<std::size_t, size> ins{Bs::in_features...};
  static constexpr std::array<std::size_t, size> outs{Bs::out_features...};
  static constexpr std::size_t in_features = ins.front();
  static constexpr std::size_t out_features = outs.back();

  static constexpr std::array<std::size_t, size> param_counts{Bs::num_params...};
  static constexpr std::size_t num_params = (std::size_t{0} + ... + Bs::num_params);

  // The stash is two parts (Args::stash and Args::cheap_stash), each
  //   [the layers' outputs a_{i+1} it holds, in order | the layers' stashes it holds, in order];
  // offsets are per row: the tensor at per-row offset o of a part for `rows` rows starts at
  // o * rows. A layer i < n - 1 marked cheap_to_recompute is `dropped`: its output and its whole
  // stash are in the cheap part. Every other layer's output is in the kept part, and so is its
  // stash but for its own cheap part (cheap_stash_per_row_v), which is in the chain's. Without
  // cheap layers the kept part is [a_1 | ... | a_{n-1} | stash_0 | ... | stash_{n-1}].
  static constexpr std::array<std::size_t, size> layer_stash{Bs::stash_per_row...};
  static constexpr std::array<std::size_t, size> layer_cheap_stash{cheap_stash_per_row_v<Bs>...};
  static constexpr std::array<bool, size> dropped = [] {
    std::array<bool, size> out{cheap_to_recompute_v<Bs>...};
    out[size - 1] = false;  // its output is the chain's y, which the chain does not keep
    return out;
  }();
  struct StashLayout {
    std::array<std::size_t, size> act{};    // a_{i+1} (i < n - 1), in its part
    std::array<std::size_t, size> stash{};  // layer i's stash: its kept part, or all if dropped
    std::array<std::size_t, size> cheap{};  // layer i's own cheap part (not dropped)
    std::size_t kept_width = 0, cheap_width = 0;
  };
  static constexpr StashLayout stash_layout = [] {
    StashLayout l;
    for (std::size_t i = 0; i + 1 < size; ++i)
      l.act[i] = std::exchange(dropped[i] ? l.cheap_width : l.kept_width,
                               (dropped[i] ? l.cheap_width : l.kept_width) + outs[i]);
    for (std::size_t i = 0; i < size; ++i) {
      if (dropped[i]) {
        l.stash[i] = std::exchange(l.cheap_width, l.cheap_width + layer_stash[i]);
      } else {
        l.stash[i] =
            std::exchange(l.kept_width, l.kept_width + layer_stash[i] - layer_cheap_stash[i]);
        l.cheap[i] = std::exchange(l.cheap_width, l.cheap_width + layer_cheap_stash[i]);
      }
    }
    return l;
  }();
  static constexpr std::array<std::size_t, size> layer_grad_stash{Bs::grad_stash_per_row...};

  static constexpr auto exclusive_sum(const std::array<std::size_t, size>& v, std::size_t start) {
    std::array<std::size_t, size> out{};
    std::size_t acc = start;
    for (std::size_t i = 0; i < size; ++i) out[i] = acc, acc += v[i];
    return out;
  }
  static constexpr std::size_t intermediate_width() {
    std::size_t w = 0;
    for (std::size_t i = 0; i + 1 < size; ++i) w += outs[i];
    return w;
  }
  // Per-row offset of g_{i+1} (i < size - 1) in the grad stash, [g_1 | ... | g_{n-1} |
  // grad_stash_0 | ... | grad_stash_{n-1}].
  static constexpr auto act_offset = exclusive_sum(outs, 0);
  static constexpr auto param_offset = exclusive_sum(param_counts, 0);
  static constexpr auto grad_stash_offset = exclusive_sum(layer_grad_stash, intermediate_width());

  // backward_input accepts dx == nullptr (see the top of this file).
  static constexpr bool skips_input_gradient = layer_grad_stash[0] == 0;

  static constexpr std::size_t stash_per_row =
      intermediate_width() + (std::size_t{0} + ... + Bs::stash_per_row);
  // Of which Remat::selective drops and `recompute` rebuilds (see the layout above).
  static constexpr std::size_t cheap_stash_per_row = stash_layout.cheap_width;
  static_assert(stash_layout.kept_width + stash_layout.cheap_width == stash_per_row);
  static constexpr std::size_t grad_stash_per_row =
      intermediate_width() + (std::size_t{0} + ... + Bs::grad_stash_per_row);

  // Scratch: layers run one at a time, so they share one workspace.
  static constexpr std::size_t workspace_per_row = [] {
    std::size_t w = 0;
    for (std::size_t x : {workspace_per_row_v<Bs>...}) w = x > w ? x : w;
    return w;
  }();

  // Entries of nn.Sequential the chain stands for, and where each layer's entries start.
  static constexpr std::array<std::size_t, size> sequential_sizes{sequential_size_v<Bs>...};
  static constexpr std::size_t sequential_size = (std::size_t{0} + ... + sequential_size_v<Bs>);
  static constexpr auto sequential_offset = exclusive_sum(sequential_sizes, 0);

  static constexpr std::size_t num_param_tensors =
      (std::size_t{0} + ... + Bs::param_specs().size());

  // Every parameter tensor of every layer, with the layer's sequential index prepended to its
  // path (added to the path's first index for a transparent wrapper).
  static constexpr std::array<ParamSpec, num_param_tensors> param_specs() {
    std::array<ParamSpec, num_param_tensors> out{};
    std::size_t k = 0, i = 0;
    auto add = [&](const auto& specs, bool transparent) {
      for (ParamSpec s : specs) {
        if (transparent) {
          s.path[0] += sequential_offset[i];
        } else {
          for (std::size_t d = s.depth; d > 0; --d) s.path[d] = s.path[d - 1];
          s.path[0] = sequential_offset[i];
          ++s.depth;
        }
        s.offset += param_offset[i];
        out[k++] = s;
      }
      ++i;
    };
    (add(Bs::param_specs(), is_transparent_v<Bs>), ...);
    return out;
  }

  static void init(std::span<float> params, Rng& rng) {
    std::size_t i = 0;
    (Bs::init(params.subspan(param_offset[i++], Bs::num_params), rng), ...);
  }

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    forward_impl<false>(ctx, a, nullptr, std::index_sequence_for<Bs...>{});
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    backward_input_impl(ctx, a, nullptr, std::index_sequence_for<Bs...>{});
  }
  // The residual-add fusion (model/layer.hpp), where the first or last layer has its part.
  template <class Ctx>
  requires adds_input<first_layer, Ctx>
  static void forward_adding_input(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
                                   const typename Ctx::value_type* r) {
    forward_impl<false>(ctx, a, r, std::index_sequence_for<Bs...>{});
  }
  template <class Ctx>
  requires leaves_add<last_layer, Ctx>
  static const typename Ctx::value_type* forward_leaving_add(
      Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
      const typename Ctx::value_type* r_in) {
    return forward_impl<true>(ctx, a, r_in, std::index_sequence_for<Bs...>{});
  }
  template <class Ctx>
  requires adds_to_input_gradient<first_layer, Ctx>
  static void backward_input_adding(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a,
                                    const typename Ctx::value_type* r) {
    backward_input_impl(ctx, a, r, std::index_sequence_for<Bs...>{});
  }
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    backward_weight_impl(ctx, a, std::index_sequence_for<Bs...>{});
  }
  // Rebuilds the cheap stash (a.cheap_stash, cheap_stash_per_row) from x, the kept stash and the
  // parameters, as forward left it: in order, the dropped layers' forward and the other layers'
  // own recompute. Writes nothing else; a.y is not read.
  template <class Ctx>
  static void recompute(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    recompute_impl(ctx, a, std::index_sequence_for<Bs...>{});
  }

 private:
  // Where the parts of the stash of one op's Args lie, and per layer where its pieces do.
  template <class T>
  struct Parts {
    T* kept;
    T* cheap;
    std::size_t rows;
    T* act(std::size_t i) const {  // a_{i+1}, i < size - 1
      return (dropped[i] ? cheap : kept) + stash_layout.act[i] * rows;
    }
    T* stash(std::size_t i) const {
      return (dropped[i] ? cheap : kept) + stash_layout.stash[i] * rows;
    }
    T* cheap_stash(std::size_t i) const {  // nullptr for a dropped layer: after its stash
      return dropped[i] ? nullptr : cheap + stash_layout.cheap[i] * rows;
    }
  };
  template <class Args>
  static auto parts(const Args& a) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(a.stash)>>;
    return Parts<T>{const_cast<T*>(a.stash),
                    const_cast<T*>(cheap_stash_of(a, stash_layout.kept_width)), a.rows};
  }
  template <std::size_t I, class T>
  static T* act(T* x, T* y, const Parts<T>& p) {  // a_I
    if constexpr (I == 0)
      return x;
    else if constexpr (I == size)
      return y;
    else
      return p.act(I - 1);
  }

  // Layer I's ForwardArgs within the chain's `a`: a_I in, a_{I+1} out (y: the chain's output,
  // nullptr where it is not written), its parameters and its parts of the stashes.
  template <std::size_t I, class T>
  static ForwardArgs<T> layer_forward_args(const ForwardArgs<T>& a, const Parts<T>& p, T* y) {
    T* x = const_cast<T*>(a.x);
    return {a.rows,
            act<I>(x, y, p),
            act<I + 1>(x, y, p),
            a.params + param_offset[I],
            p.stash(I),
            a.workspace,
            compute_params_at(a.compute_params, param_offset[I]),
            a.document,
            p.cheap_stash(I)};
  }

  template <class Ctx, std::size_t... I>
  static void recompute_impl(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
                             std::index_sequence<I...>) {
    using T = typename Ctx::value_type;
    const Parts<T> p = parts(a);
    auto step = [&](auto i_const) {
      constexpr std::size_t i = decltype(i_const)::value;
      using L = layer_t<i>;
      if constexpr (dropped[i] || layer_cheap_stash[i] > 0) {
        const ForwardArgs<T> args = layer_forward_args<i>(a, p, static_cast<T*>(nullptr));
        if constexpr (dropped[i])
          L::forward(ctx, args);
        else
          L::recompute(ctx, args);
      }
    };
    (step(std::integral_constant<std::size_t, I>{}), ...);
  }

  template <std::size_t I>
  using layer_t = std::tuple_element_t<I, std::tuple<Bs...>>;
  template <std::size_t I>
  using index_t = std::integral_constant<std::size_t, I>;
  // LayerPair<layer I, layer I + 1> runs backward_input (B) with Ctx.
  template <std::size_t I, class Ctx>
  static constexpr bool pair_backward =
      requires(Ctx& c, const BackwardInputArgs<typename Ctx::value_type>& b) {
    { LayerPair<layer_t<I>, layer_t<I + 1>>::backward_input(c, b, b) } -> std::same_as<bool>;
  };

  // Layer I leaves its residual add to layer I + 1, which adds its input (Leave: the chain's last
  // layer leaves it to whoever called forward_leaving_add).
  template <std::size_t I, class Ctx, bool Leave>
  static constexpr bool leaves_at() {
    if constexpr (I + 1 < size)
      return leaves_add<layer_t<I>, Ctx> && adds_input<layer_t<I + 1>, Ctx>;
    else
      return Leave;
  }

  // F of every layer; `pending`: the add the chain's input still needs (forward_adding_input),
  // then the one the layer before left. Returns the add the last layer left (Leave), else nullptr.
  template <bool Leave, class Ctx, std::size_t... I>
  static const typename Ctx::value_type* forward_impl(
      Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a,
      const typename Ctx::value_type* pending, std::index_sequence<I...>) {
    using T = typename Ctx::value_type;
    const Parts<T> p = parts(a);
    auto step = [&](auto i_const) {
      constexpr std::size_t i = decltype(i_const)::value;
      using L = layer_t<i>;
      const ForwardArgs<T> args = layer_forward_args<i>(a, p, a.y);
      if constexpr (leaves_at<i, Ctx, Leave>()) {
        pending = L::forward_leaving_add(ctx, args, pending);
        return;
      } else if constexpr (adds_input<L, Ctx>) {
        if (pending != nullptr) {
          L::forward_adding_input(ctx, args, std::exchange(pending, nullptr));
          return;
        }
      }
      L::forward(ctx, args);
    };
    (step(index_t<I>{}), ...);
    return pending;
  }

  // B of every layer, in reverse; `add` (not nullptr): dx = B(dy) + add, by the first layer's
  // backward_input_adding.
  template <class Ctx, std::size_t... I>
  static void backward_input_impl(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a,
                                  const typename Ctx::value_type* add, std::index_sequence<I...>) {
    using T = typename Ctx::value_type;
    T* x = const_cast<T*>(a.x);
    const Parts<T> p = parts(a);
    T* dy = const_cast<T*>(a.dy);
    // Reverse order: layer size-1 first. g_I for I in (0, size) lives in the grad stash.
    auto grad = [&](auto i_const) -> T* {
      constexpr std::size_t i = decltype(i_const)::value;
      if constexpr (i == 0)
        return a.dx;
      else if constexpr (i == size)
        return dy;
      else
        return a.grad_stash + act_offset[i - 1] * a.rows;
    };
    auto args = [&](auto i_const) {
      constexpr std::size_t i = decltype(i_const)::value;
      return BackwardInputArgs<T>{a.rows,
                                  act<i>(x, static_cast<T*>(nullptr), p),
                                  grad(index_t<i + 1>{}),
                                  grad(index_t<i>{}),
                                  a.params + param_offset[i],
                                  p.stash(i),
                                  a.grad_stash + grad_stash_offset[i] * a.rows,
                                  a.workspace,
                                  compute_params_at(a.compute_params, param_offset[i]),
                                  act<i + 1>(x, static_cast<T*>(nullptr), p),
                                  a.document,
                                  p.cheap_stash(i)};
    };
    bool done = false;  // layer i's B ran in a pair with layer i + 1's
    auto step = [&](auto j_const) {
      constexpr std::size_t i = size - 1 - decltype(j_const)::value;
      if (std::exchange(done, false)) return;
      if constexpr (i == 0 && skips_input_gradient) {
        if (a.dx == nullptr) return;
      }
      if constexpr (i > 0) {
        if constexpr (pair_backward<i - 1, Ctx>) {
          // not where the pair's dx would be the chain's, which nobody wants (skipped above) or
          // which the first layer adds to
          if (i - 1 != 0 || ((!skips_input_gradient || a.dx != nullptr) && add == nullptr)) {
            done = LayerPair<layer_t<i - 1>, layer_t<i>>::backward_input(
                ctx, args(index_t<i - 1>{}), args(index_t<i>{}));
            if (done) return;
          }
        }
      }
      if constexpr (i == 0 && adds_to_input_gradient<layer_t<i>, Ctx>) {
        if (add != nullptr) return layer_t<i>::backward_input_adding(ctx, args(index_t<i>{}), add);
      }
      layer_t<i>::backward_input(ctx, args(index_t<i>{}));
    };
    (step(index_t<I>{}), ...);
  }

  template <class Ctx, std::size_t... I>
  static void backward_weight_impl(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a,
                                   std::index_sequence<I...>) {
    using T = typename Ctx::value_type;
    T* x = const_cast<T*>(a.x);
    const Parts<T> p = parts(a);
    const T* gstash = a.grad_stash;
    auto grad = [&](std::size_t i) -> const T* {
      return i == size ? a.dy : gstash + act_offset[i - 1] * a.rows;
    };
    (Bs::backward_weight(
         ctx,
         BackwardWeightArgs<T>{a.rows, act<I>(x, static_cast<T*>(nullptr), p), grad(I + 1),
                               a.params + param_offset[I], p.stash(I),
                               gstash + grad_stash_offset[I] * a.rows, a.grads + param_offset[I],
                               a.workspace, a.document, p.cheap_stash(I)}),
     ...);
  }
};

}  // namespace gpipe::detail
