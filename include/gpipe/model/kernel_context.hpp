#pragma once
// What layers run on: a backend's kernel context, and the kernels a layer brings for a backend.
//
// kernel_context<Ctx>: the primitives every backend's per-device context provides. Each backend
// has one context class template, its parameter the activations' type T (float, or bf16 under
// gpipe::MixedBf16): gpipe::host::KernelContext<T>, gpipe::cuda::KernelContext<T>. Pointers are
// memory of the context's device; every operation is issued in the device's stream order. Layers
// are written against these primitives, and where they need more, against their own
// LayerKernels.
//
// LayerKernels<Op, Ctx>: the kernels of one layer's operations (Op, a tag type the layer names)
// on the backend whose context is Ctx. The primary template is declared here once and never
// defined; each backend specializes it for the layers it runs (the library's own in
// backend/host/layers/ and backend/cuda/layers/), and a layer written outside the library
// specializes it for its own tag, on the host and, in a .cu file, for the CUDA context, whose
// stream() and blas() its kernels are launched on. A partial specialization for
// KernelContext<T> covers both precisions where the kernels are the same code. The layer calls
//   LayerKernels<MyOp, Ctx>::forward(ctx, ...)
// and a backend without the specialization fails to compile at that call, naming MyOp and Ctx.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe {

/// The scalar type and the device.
template <class Ctx>
concept kernel_context_base = requires(const Ctx& k) {
  typename Ctx::value_type;
  { k.device() } -> std::convertible_to<std::size_t>;
};

/// C(m, n) = alpha op(A) op(B) + beta C, row-major, of activations, and of activations with
/// master parameters (a Linear's x W^T, dy W) into activations or (dy^T x) into master gradients;
/// y(rows, cols) += bias; db += column sums of dy.
template <class Ctx>
concept has_blas = requires(Ctx& k, std::size_t n, master_t<typename Ctx::value_type> s,
                            const typename Ctx::value_type* a, typename Ctx::value_type* c,
                            const master_t<typename Ctx::value_type>* p,
                            master_t<typename Ctx::value_type>* g) {
  k.gemm(false, true, n, n, n, s, a, a, s, c);
  k.gemm(false, true, n, n, n, s, a, p, s, c);
  k.gemm(true, false, n, n, n, s, a, a, s, g);
  k.bias_add(n, n, p, c);
  k.bias_grad(n, n, a, g);
};

/// y = a + b, y += x, dst = src, dst = value, x *= alpha.
template <class Ctx>
concept has_vector_ops = requires(Ctx& k, std::size_t n, typename Ctx::value_type s,
                                  const typename Ctx::value_type* a, typename Ctx::value_type* c) {
  k.add(n, a, a, c);
  k.accumulate(n, a, c);
  k.copy(n, a, c);
  k.fill(n, s, c);
  k.scale(n, s, c);
};

/// Copies between host memory and the device's memory, of floats and of class ids.
template <class Ctx>
concept has_transfers = requires(Ctx& k, std::size_t n, const float* f, float* g,
                                 const std::int32_t* i, std::int32_t* j) {
  k.upload(n, f, g);
  k.download(n, f, g);
  k.upload(n, i, j);
  k.download(n, i, j);
};

/// The losses' and optimizers' kernels (the primitives of model/loss.hpp and optim/), and the
/// sum of squares in double of gradient clipping (out: one double of the device's memory, summed
/// in the fixed order of backend/common.hpp).
template <class Ctx>
concept has_training_ops = requires(Ctx& k, std::size_t n, master_t<typename Ctx::value_type> s,
                                    const typename Ctx::value_type* a, typename Ctx::value_type* c,
                                    const master_t<typename Ctx::value_type>* mp,
                                    master_t<typename Ctx::value_type>* m, const std::int32_t* ids,
                                    double* out) {
  k.sum_of_squares(n, mp, out);
  k.softmax_cross_entropy(n, n, a, ids, s, c, m);
  k.mse(n, a, mp, s, c, m);
  k.sgd_update(n, m, mp, m, 0.1, 0.9, 0.0, 0.0, false, true);
  k.adamw_update(n, m, mp, m, m, 0.1, 0.9, 0.999, 1e-8, 0.0, std::size_t{1});
};

/// kernel_context<Ctx>: everything the library's own layers, losses and optimizers need of a
/// backend's per-device context (see the top of this file).
template <class Ctx>
concept kernel_context = kernel_context_base<Ctx> && has_blas<Ctx> && has_vector_ops<Ctx> &&
    has_transfers<Ctx> && has_training_ops<Ctx>;

/// A run of a stage's parameters, elements [offset, offset + size), with one weight-decay
/// setting: AdamW's decoupled weight decay applies where `decays`, none elsewhere (the argument
/// of `adamw_update_ranges`, see has_adamw_ranges).
struct DecayRange {
  std::size_t offset = 0;  ///< first element
  std::size_t size = 0;    ///< elements
  bool decays = true;      ///< weight_decay applies to the run (else 0 does)
};

/// has_adamw_ranges<Ctx>: the optional AdamW step over all of a stage's n parameters in one call
/// (one launch on CUDA), `adamw_update_ranges(n, p, g, m, v, ranges, lr, beta1, beta2, eps,
/// weight_decay, step, p_bf16)`: every element updated with the float operations of
/// `adamw_update` (bit for bit), with weight_decay where its range decays and 0 elsewhere;
/// `ranges` in order of offset, covering [0, n) without gaps (else gpipe::Error). Where p_bf16
/// is not null, p_bf16(n) = the updated p rounded to bf16 (nearest even), as a convert of p would
/// give: gpipe::MixedBf16's copy of the weights for its GEMMs, fused into the update. Not part of
/// kernel_context: optim::AdamW falls back to one `adamw_update` per run where it is missing.
template <class Ctx>
concept has_adamw_ranges = requires(Ctx& k, std::size_t n, master_t<typename Ctx::value_type>* m,
                                    const master_t<typename Ctx::value_type>* mp,
                                    std::span<const DecayRange> ranges, bf16* w) {
  k.adamw_update_ranges(n, m, mp, m, m, ranges, 0.1, 0.9, 0.999, 1e-8, 0.0, std::size_t{1}, w);
};

namespace detail {

// adamw_update_ranges' check of its ranges: in order of offset, covering [0, n) without gaps.
inline void check_decay_ranges(std::size_t n, std::span<const DecayRange> ranges) {
  std::size_t at = 0;
  for (const DecayRange& r : ranges) {
    require(r.offset == at, "adamw_update_ranges: a range starts at " + std::to_string(r.offset) +
                                ", expected " + std::to_string(at) +
                                " (ranges in order of offset, without gaps or overlaps)");
    at += r.size;
  }
  require(at == n, "adamw_update_ranges: the ranges cover " + std::to_string(at) +
                       " parameters, expected n = " + std::to_string(n));
}

}  // namespace detail

/// LayerKernels<Op, Ctx>: see the top of this file. Declared, never defined.
template <class Op, class Ctx>
struct LayerKernels;

/// has_layer_kernels<Op, Ctx>: the backend of Ctx has kernels for Op (its LayerKernels
/// specialization is visible here).
template <class Op, class Ctx>
concept has_layer_kernels = requires {
  sizeof(LayerKernels<Op, Ctx>);
};

}  // namespace gpipe
