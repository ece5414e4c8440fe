#pragma once
// The layer concept: what a type must provide to be a layer of a gpipe::Stage.
//
// A layer maps a (rows, in_features) activation to (rows, out_features). It owns a flat float
// array of num_params parameters, split into named tensors by param_specs(). Its backward is two
// ops, so that schedules may separate them:
//   backward_input  (B): dy -> dx                       (needs x and the forward stash)
//   backward_weight (W): dy -> d(params), accumulated   (needs x, the stash and the B stash)
// Everything a backward needs beyond the layer input x is kept by forward in `stash`
// (stash_per_row floats per row) and by backward_input in `grad_stash` (grad_stash_per_row).
// The layer output y is not kept for it: a layer that needs it in backward stashes it, unless it
// only ever runs inside a Chain, which passes it every layer's output but its last's
// (BackwardInputArgs::y: the next layer's input, which the Chain keeps anyway). A layer that
// needs scratch memory only while one of its ops runs declares workspace_per_row (optional,
// default 0); its contents do not survive from one op to the next.
// Selective recomputation (Remat::selective): a layer whose forward is cheap next to the memory
// its output takes (a norm, an activation) declares `cheap_to_recompute = true`; inside a Chain
// its output and its stash then go to the chain's cheap stash, which the policy drops after
// forward and the chain's `recompute` rebuilds before backward from the rest. A composite layer
// reports that part of its stash as cheap_stash_per_row (optional, default 0; part of
// stash_per_row) and rebuilds it with `recompute(ctx, ForwardArgs)`; its ops find it at the
// Args' `cheap_stash`.
//
// The operations are function templates over a kernel context Ctx (a backend's per-device kernel
// set, e.g. gpipe::host::KernelContext<float>); pointers are that device's memory. Ctx::value_type
// is the activations' scalar type (float, bf16 under gpipe::MixedBf16, double in the
// finite-difference tests); parameters and gradients are master_t<value_type> (float for bf16).

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe {

/// One named parameter tensor of a layer: leaf `name` ("weight", "bias"), the child indices that
/// lead to it inside composite layers (`path[0..depth)`, so the full name is "i.path....name" for
/// layer i), row-major `shape` (first `rank` entries) and `offset` into the layer's flat parameter
/// array.
struct ParamSpec {
  /// Capacity of `path`: composite layers nest at most this deep (a Chain checks it).
  static constexpr std::size_t max_depth = 4;

  /// Leaf name within its layer: "weight", "bias", or "c_attn.weight" in a named composite.
  std::string_view name;
  /// Row-major extents; only the first `rank` are used, the rest stay 0 (bias: `{Out, 0}`).
  std::array<std::size_t, 2> shape{};
  /// Number of dimensions used in `shape`: 1 (a vector) or 2 (a matrix).
  std::size_t rank = 0;
  /// Offset in floats of the tensor's first element in the layer's flat parameter array.
  std::size_t offset = 0;
  /// nn.Sequential indices from the outermost layer down; a layer leaves it empty for its own
  /// tensors and each enclosing chain prepends its child's index.
  std::array<std::size_t, max_depth> path{};
  /// Number of valid entries of `path`.
  std::size_t depth = 0;

  /// Number of elements: the product of the first `rank` extents.
  constexpr std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
};

/// Arguments of a layer's `forward` (F): y = layer(x), keeping in `stash` what the backward ops
/// need. Pointers are device memory of the kernel context; T is `Ctx::value_type`.
template <class T>
struct ForwardArgs {
  /// Rows of this micro-batch: samples, or tokens (samples * T) in a token model.
  std::size_t rows;
  const T* x;                 ///< (rows, in_features)
  T* y;                       ///< (rows, out_features)
  const master_t<T>* params;  ///< (num_params): float master weights when T is bf16
  T* stash;                   ///< (rows, stash_per_row), kept until backward
  T* workspace = nullptr;     ///< (rows, workspace_per_row), scratch for this op only
  /// (num_params): params in T, the form GEMMs read them in (the step's bf16 rounding of the
  /// master weights under MixedBf16, params itself in float); nullptr where the caller has none
  /// (a bf16 context then rounds float operands at each use; see with_compute_params).
  const T* compute_params = nullptr;
  /// (rows) the document id of each row (token) when the step packs documents into its samples
  /// (README, "Packed documents"), else nullptr: one document per sample.
  const std::int32_t* document = nullptr;
  /// (rows, cheap_stash_per_row): the part of the stash that `recompute` rebuilds (a composite
  /// layer's, see the top of this file); nullptr: right after the rest of the stash in the same
  /// buffer, at stash + (stash_per_row - cheap_stash_per_row) * rows.
  T* cheap_stash = nullptr;
};

/// Arguments of a layer's `backward_input` (B): dx from dy, keeping in `grad_stash` what its
/// `backward_weight` needs. Pointers are device memory of the kernel context.
template <class T>
struct BackwardInputArgs {
  /// Rows of this micro-batch, as in the forward that left `stash`.
  std::size_t rows;
  const T* x;                 ///< (rows, in_features)
  const T* dy;                ///< (rows, out_features)
  T* dx;                      ///< (rows, in_features), overwritten
  const master_t<T>* params;  ///< (num_params): float master weights when T is bf16
  const T* stash;             ///< (rows, stash_per_row) as left by forward
  T* grad_stash;              ///< (rows, grad_stash_per_row), kept until backward_weight
  T* workspace = nullptr;     ///< (rows, workspace_per_row), scratch for this op only
  /// (num_params): params in T, as in ForwardArgs::compute_params.
  const T* compute_params = nullptr;
  /// (rows, out_features): the forward's output where the caller keeps it (inside a Chain, every
  /// layer but the last), else nullptr. A layer that needs y and may not get it stashes it.
  const T* y = nullptr;
  /// (rows) the document id of each row (token) when the step packs documents into its samples
  /// (README, "Packed documents"), else nullptr: one document per sample.
  const std::int32_t* document = nullptr;
  /// (rows, cheap_stash_per_row), as in ForwardArgs::cheap_stash (nullptr: after the rest).
  const T* cheap_stash = nullptr;
};

/// Arguments of a layer's `backward_weight` (W): adds d(loss)/d(params) into `grads`. Pointers are
/// device memory of the kernel context.
template <class T>
struct BackwardWeightArgs {
  /// Rows of this micro-batch, as in its forward and backward_input.
  std::size_t rows;
  const T* x;                 ///< (rows, in_features)
  const T* dy;                ///< (rows, out_features)
  const master_t<T>* params;  ///< (num_params): float master weights when T is bf16
  const T* stash;             ///< (rows, stash_per_row)
  const T* grad_stash;        ///< (rows, grad_stash_per_row) as left by backward_input
  master_t<T>* grads;         ///< (num_params), accumulated: grads += d(loss)/d(params)
  T* workspace = nullptr;     ///< (rows, workspace_per_row), scratch for this op only
  /// (rows) the document id of each row (token) when the step packs documents into its samples
  /// (README, "Packed documents"), else nullptr: one document per sample.
  const std::int32_t* document = nullptr;
  /// (rows, cheap_stash_per_row), as in ForwardArgs::cheap_stash (nullptr: after the rest).
  const T* cheap_stash = nullptr;
};

/// Calls f(w) with w a layer's parameters as GEMM operands: `a.compute_params + offset` where the
/// caller passed the compute copy, else `a.params + offset` (float master weights, which a bf16
/// context rounds at each use). Args is ForwardArgs or BackwardInputArgs.
template <class Args, class F>
constexpr void with_compute_params(const Args& a, std::size_t offset, F&& f) {
  if (a.compute_params != nullptr)
    f(a.compute_params + offset);
  else
    f(a.params + offset);
}

namespace detail {

/// Two layers A then B, consecutive in a chain, whose input gradients a backend may compute in one
/// pass. Where `LayerPair<A, B>` has `static bool backward_input(ctx, const BackwardInputArgs& a,
/// const BackwardInputArgs& b)` (B's backward_input then A's: a.dx written; b.dx, which is a.dy,
/// may be left unwritten, so only a pair whose A has no W op and no grad stash may define it) and
/// it returns true, the chain's B runs it instead of the two layers' own; false: it enqueued
/// nothing that matters, and the chain runs the two layers. The primary template pairs nothing;
/// model/linear.hpp pairs GELUTanh and a Linear for contexts with GELU's derivative in their
/// GEMMs' epilogues.
template <class A, class B>
struct LayerPair {};

// A residual add fused into the layer norm next to it (forward and input gradient), as three
// optional static members, found by the concepts below for one kernel context Ctx (T its
// value_type); a Chain uses them where two consecutive layers have them:
//   forward_adding_input(ctx, const ForwardArgs<T>& a, const T* r): the layer's input is a.x + r,
//     not yet formed: writes a.x + r into a.x (in place: a.x is writable memory of the caller's
//     whenever r is given), then runs forward on it.
//   forward_leaving_add(ctx, const ForwardArgs<T>& a, const T* r_in) -> const T* r: forward (of
//     the input a.x + r_in where r_in is not nullptr, as forward_adding_input), except that the
//     output is left as a.y + r, r returned (not nullptr): the next layer forms it with its
//     forward_adding_input.
//   backward_input_adding(ctx, const BackwardInputArgs<T>& a, const T* r): dx = B(dy) + r.
// Residual leaves its add (model/residual.hpp) and gives its input gradient's add to its body's
// first layer; LayerNorm takes both where its kernels have the fused forms (model/layer_norm.hpp);
// a Chain passes them on to its first and last layers. Each result equals the unfused one bit for
// bit: the sum is rounded to T and stored before it is normalized, and the layer's own input
// gradient is rounded to T before r is added.
template <class L, class Ctx>
concept adds_input = requires(Ctx& c, const ForwardArgs<typename Ctx::value_type>& a,
                              const typename Ctx::value_type* r) {
  L::forward_adding_input(c, a, r);
};
template <class L, class Ctx>
concept leaves_add = requires(Ctx& c, const ForwardArgs<typename Ctx::value_type>& a,
                              const typename Ctx::value_type* r) {
  { L::forward_leaving_add(c, a, r) } -> std::same_as<const typename Ctx::value_type*>;
};
template <class L, class Ctx>
concept adds_to_input_gradient = requires(Ctx& c,
                                          const BackwardInputArgs<typename Ctx::value_type>& a,
                                          const typename Ctx::value_type* r) {
  L::backward_input_adding(c, a, r);
};

}  // namespace detail

/// The compute copy of a sub-range starting at `offset` (nullptr stays nullptr), for composite
/// layers handing a part of their parameters to a child.
template <class T>
constexpr const T* compute_params_at(const T* compute_params, std::size_t offset) {
  return compute_params == nullptr ? nullptr : compute_params + offset;
}

/// Deterministic generator for parameter initialization (SplitMix64 stream); the same seed gives
/// the same parameters on every platform, unlike std::uniform_real_distribution.
class Rng {
 public:
  /// Starts the stream at `seed`: the same seed gives the same sequence of draws.
  explicit constexpr Rng(std::uint64_t seed) : state_(seed) {}

  /// Next 64 uniformly distributed bits; advances the stream.
  constexpr std::uint64_t next_u64() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  /// Uniform in [lo, hi), 24 random bits.
  constexpr float uniform(float lo, float hi) {
    const float u = static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
  }

 private:
  std::uint64_t state_;
};

/// has_features<L>: static `in_features` and `out_features`, the widths of x and y, both > 0.
template <class L>
concept has_features = requires {
  { L::in_features } -> std::convertible_to<std::size_t>;
  { L::out_features } -> std::convertible_to<std::size_t>;
}
&&(L::in_features > 0) && (L::out_features > 0);

/// has_parameters<L>: static `num_params` (floats), `param_specs()` (a range of ParamSpec) and
/// `init(std::span<float> params, Rng&)`, which writes all `num_params` initial values.
template <class L>
concept has_parameters = requires(std::span<float> p, Rng& rng) {
  { L::num_params } -> std::convertible_to<std::size_t>;
  {L::param_specs()};
  {L::init(p, rng)};
};

/// has_stash<L>: static `stash_per_row` (floats per row that forward keeps for B and W) and
/// `grad_stash_per_row` (floats per row that B keeps for W); 0 for none.
template <class L>
concept has_stash = requires {
  { L::stash_per_row } -> std::convertible_to<std::size_t>;
  { L::grad_stash_per_row } -> std::convertible_to<std::size_t>;
};

/// layer<L>: the compile-time part (shapes, parameters, stash sizes, initialization); the ops
/// are checked per kernel context by layer_for.
template <class L>
concept layer = has_features<L> && has_parameters<L> && has_stash<L>;

/// layer_for<L, Ctx>: L's operations can run with the kernel context Ctx.
template <class L, class Ctx>
concept layer_for = layer<L> && requires(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& f,
                                         const BackwardInputArgs<typename Ctx::value_type>& b,
                                         const BackwardWeightArgs<typename Ctx::value_type>& w) {
  L::forward(ctx, f);
  L::backward_input(ctx, b);
  L::backward_weight(ctx, w);
};

/// workspace_per_row_v<L>: L::workspace_per_row when L declares it, else 0.
template <class L>
constexpr std::size_t workspace_per_row_v = 0;
/// The case of an L that declares workspace_per_row.
template <class L>
requires requires { L::workspace_per_row; }
constexpr std::size_t workspace_per_row_v<L> = L::workspace_per_row;

/// cheap_to_recompute_v<L>: L declares `cheap_to_recompute = true`: its forward is cheap next to
/// the memory its output takes, so that under Remat::selective a Chain drops its output and stash
/// after forward and runs its forward again before backward (see the top of this file).
template <class L>
constexpr bool cheap_to_recompute_v = false;
/// The case of an L that declares cheap_to_recompute.
template <class L>
requires requires { L::cheap_to_recompute; }
constexpr bool cheap_to_recompute_v<L> = L::cheap_to_recompute;

/// cheap_stash_per_row_v<L>: L::cheap_stash_per_row when L declares it (a composite layer: the
/// part of its stash its `recompute` rebuilds), else 0.
template <class L>
constexpr std::size_t cheap_stash_per_row_v = 0;
/// The case of an L that declares cheap_stash_per_row.
template <class L>
requires requires { L::cheap_stash_per_row; }
constexpr std::size_t cheap_stash_per_row_v<L> = L::cheap_stash_per_row;

/// Where the cheap part of a layer's stash lies for the Args `a` of one of its ops, the layer's
/// stash keeping `kept_per_row` elements per row besides it: `a.cheap_stash`, or right after the
/// kept part when the caller passed one buffer for all of it.
template <class Args>
constexpr auto* cheap_stash_of(const Args& a, std::size_t kept_per_row) {
  return a.cheap_stash != nullptr ? a.cheap_stash : a.stash + kept_per_row * a.rows;
}

/// sequential_size_v<L>: how many entries of PyTorch's nn.Sequential the layer (or layer spec)
/// stands for: 1, or L::sequential_size for a transparent wrapper such as Checkpoint<...>, whose
/// parameters keep the indices its layers would have without it.
template <class L>
constexpr std::size_t sequential_size_v = 1;
/// The case of an L that declares sequential_size.
template <class L>
requires requires { L::sequential_size; }
constexpr std::size_t sequential_size_v<L> = L::sequential_size;

/// width_generic_layer<L>: a layer that takes its width from the layer before it (ReLU, GELU,
/// Residual): L::with_features<N> is the layer of width N (not instantiated here: only a width
/// that fits may be). L::natural_in_features is the width it has on its own (0 when only the
/// previous layer can tell), used when it opens a pipeline. Marked by `using width_generic = void`.
template <class L>
concept width_generic_layer = requires {
  typename L::width_generic;
  { L::natural_in_features } -> std::convertible_to<std::size_t>;
};

// A width-generic composite (Residual, Checkpoint) may also provide L::with_shape<N, T>, which
// binds its children to the model's tokens per sample T too; it is used where present.

/// sequence_layer<L>: a layer that acts on whole samples of T tokens, not on each row alone
/// (causal self-attention, a Transformer block), and takes T from the model, whose Embedding fixes
/// it: L::with_tokens<T> is the layer, or a width-generic spec, for samples of T tokens (rows).
/// L::natural_in_features is its width (0 when only the previous layer can tell). Marked by
/// `using sequence_generic = void`. A model's rows are then tokens: T consecutive rows are one
/// sample, and micro-batches split only between samples.
template <class L>
concept sequence_layer = requires {
  typename L::sequence_generic;
  { L::natural_in_features } -> std::convertible_to<std::size_t>;
};

namespace detail {

// The sequence_layer spec of a layer of width D with H heads (CausalSelfAttention,
// TransformerBlock): Of<D, H, T> once the model's T binds it.
template <std::size_t D, std::size_t H, template <std::size_t, std::size_t, std::size_t> class Of>
struct HeadedSequenceLayer {
  static_assert(D > 0 && H > 0 && D % H == 0,
                "gpipe: a layer's width D must be a multiple of its heads H");
  /// Marks a sequence_layer: the model's tokens per sample T binds it.
  using sequence_generic = void;
  /// D, the width it takes and gives: fixed, so a Stage may start with it.
  static constexpr std::size_t natural_in_features = D;
  /// The layer for samples of T tokens (T consecutive rows).
  template <std::size_t T>
  using with_tokens = Of<D, H, T>;
};

}  // namespace detail

/// layer_spec<L>: what a Stage accepts: a layer, a width-generic layer or a sequence layer.
template <class L>
concept layer_spec = layer<L> || width_generic_layer<L> || sequence_layer<L>;

namespace detail {

// explain_layer_spec<L>(): true for a layer_spec; otherwise a static_assert that names the first
// piece L lacks (a Stage checks each of its layers with it, so that the error says what to add).
template <class L>
constexpr bool explain_layer_spec() {
  if constexpr (layer_spec<L>) {
    return true;
  } else if constexpr (
      requires { typename L::width_generic; } || requires { typename L::sequence_generic; }) {
    static_assert(lacks<L>,
                  "gpipe: a width-generic or sequence layer needs static constexpr std::size_t "
                  "natural_in_features (0 when only the layer before it can tell)");
  } else if constexpr (!requires {
                         { L::in_features } -> std::convertible_to<std::size_t>;
                         { L::out_features } -> std::convertible_to<std::size_t>;
                       }) {
    static_assert(lacks<L>,
                  "gpipe: not a layer: it needs static constexpr std::size_t in_features and "
                  "out_features (or `using width_generic = void` and natural_in_features for a "
                  "layer that takes its width from the one before it); see gpipe/model/layer.hpp");
  } else if constexpr (!has_features<L>) {
    static_assert(lacks<L>, "gpipe: a layer's in_features and out_features must be > 0");
  } else if constexpr (!requires {
                         { L::num_params } -> std::convertible_to<std::size_t>;
                       }) {
    static_assert(lacks<L>,
                  "gpipe: a layer needs static constexpr std::size_t num_params (derive from "
                  "gpipe::ParameterFree for a layer without parameters)");
  } else if constexpr (!requires { L::param_specs(); }) {
    static_assert(lacks<L>,
                  "gpipe: a layer needs static param_specs() (its tensors' names and shapes; "
                  "gpipe::ParameterFree gives an empty one)");
  } else if constexpr (!requires(std::span<float> p, Rng & rng) { L::init(p, rng); }) {
    static_assert(lacks<L>,
                  "gpipe: a layer needs static init(std::span<float> params, gpipe::Rng&)");
  } else if constexpr (!requires {
                         { L::stash_per_row } -> std::convertible_to<std::size_t>;
                       }) {
    static_assert(lacks<L>,
                  "gpipe: a layer needs static constexpr std::size_t stash_per_row (floats per "
                  "row its forward keeps for its backward; 0 for none)");
  } else {
    static_assert(lacks<L>,
                  "gpipe: a layer needs static constexpr std::size_t grad_stash_per_row (floats "
                  "per row its backward_input keeps for its backward_weight; 0 for none)");
  }
  return false;
}

// explain_layer_for<L, Ctx>(): true when L's operations can run with the kernel context Ctx;
// otherwise a static_assert that names the first one that cannot (a Trainer checks every layer
// of its model against its backend's context with it).
template <class L, class Ctx>
constexpr bool explain_layer_for() {
  using T = typename Ctx::value_type;
  if constexpr (layer_for<L, Ctx>) {
    return true;
  } else if constexpr (!requires(Ctx & c, const ForwardArgs<T>& a) { L::forward(c, a); }) {
    static_assert(lacks<L, Ctx>,
                  "gpipe: a layer needs static forward(Ctx&, const ForwardArgs<T>&) callable with "
                  "this backend's kernel context (template <class Ctx> to run on every backend; "
                  "plain loops over the pointers run on the host backend only)");
  } else if constexpr (!requires(Ctx & c, const BackwardInputArgs<T>& a) {
                         L::backward_input(c, a);
                       }) {
    static_assert(lacks<L, Ctx>,
                  "gpipe: a layer needs static backward_input(Ctx&, const BackwardInputArgs<T>&) "
                  "callable with this backend's kernel context");
  } else {
    static_assert(lacks<L, Ctx>,
                  "gpipe: a layer needs static backward_weight(Ctx&, const BackwardWeightArgs<T>&) "
                  "callable with this backend's kernel context (gpipe::ParameterFree gives an "
                  "empty one)");
  }
  return false;
}

}  // namespace detail

/// Base for layers without parameters: empty param_specs(), init does nothing, W does nothing.
struct ParameterFree {
  /// No parameters: the `params` and `grads` a layer is given hold nothing of its own.
  static constexpr std::size_t num_params = 0;
  /// No tensors, so the layer adds no names to the model's parameter list.
  static constexpr std::array<ParamSpec, 0> param_specs() { return {}; }
  /// Nothing to initialize; draws nothing from the generator.
  static constexpr void init(std::span<float>, Rng&) {}
  /// W: no gradient to accumulate.
  template <class Ctx>
  static void backward_weight(Ctx&, const BackwardWeightArgs<typename Ctx::value_type>&) {}
};

}  // namespace gpipe
