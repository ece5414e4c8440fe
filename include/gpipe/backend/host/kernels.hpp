#pragma once
// gpipe::host::KernelContext<T>: the host backend's kernel context, the set of primitive operations
// that layers, losses and optimizers are written against (gpipe::kernel_context,
// model/kernel_context.hpp). A backend's stream hands its kernel context to each piece of work;
// the CUDA backend's enqueues the same operations on its stream. Pointers are device memory of
// the context's device; on the host that is ordinary memory. It keeps only primitives: a layer's
// own kernels (ReLU, GELU, LayerNorm, attention, embedding) are its LayerKernels specialization
// for this context, in layers/, which splits them over the team with in_blocks.
//
// KernelContext<double> exists for the finite-difference tests and the double-precision reference.
//
// Beyond the primitives every backend's context has, this one has linear_forward, a Linear
// layer's GEMM and bias in one call, which Linear uses where a context provides it: the float
// context runs it as one oneDNN matmul with the bias fused (kernels/linear.hpp) where oneDNN is
// the GEMM library (kernels/gemm_library.hpp), else as a GEMM and a bias pass.
//
// A context may be given a Team (kernels/team.hpp): its GEMMs (gemm_split), and its elementwise,
// bias, softmax cross-entropy and optimizer kernels and the layers' kernels (in_blocks), then
// split over the team's threads, each result bit for bit the one-thread one (but a GEMM's
// that splits, whose library may round a block as it would not the whole: oneDNN picks its
// kernel per shape, and the unsplit Linear forward is its fused matmul); the MSE loss stays on
// the caller.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <variant>
#include <vector>

#include "gpipe/backend/host/kernels/elementwise.hpp"
#include "gpipe/backend/host/kernels/gemm.hpp"
#include "gpipe/backend/host/kernels/linear.hpp"
#include "gpipe/backend/host/kernels/loss.hpp"
#include "gpipe/backend/host/kernels/optimizer.hpp"
#include "gpipe/backend/host/kernels/team.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::host {

template <class T>
class KernelContext;
/// The context for bf16 activations (kernels_bf16.hpp).
template <>
class KernelContext<bf16>;

/// The context's former name, kept for layers written outside the library, which specialize
/// `LayerKernels<MyOp, host::Kernels<T>>`: the same type.
template <class T>
using Kernels = KernelContext<T>;

/// The host backend's kernel context for scalars `T` (a `gpipe::kernel_context`): the primitive
/// operations layers, losses and optimizers run on one device. Each runs at once on the calling
/// thread, which for submitted work is the device's worker. Shapes are given as (rows, cols) of
/// row-major arrays; "+=" marks an output that is accumulated into, "=" one that is overwritten.
template <class T>
class KernelContext {
 public:
  /// The scalar type of every array argument: float in a backend's work, double in the
  /// finite-difference tests and the double-precision reference.
  using value_type = T;

  /// A context for `device`, the number device() reports, computing on the calling thread and on
  /// `team`'s helpers where given (the team outlives the context; null = the calling thread
  /// alone); it allocates nothing until used.
  explicit KernelContext(std::size_t device = 0, Team* team = nullptr)
      : device_(device), team_(team) {}
  /// The device whose memory the pointer arguments are.
  std::size_t device() const { return device_; }
  /// The threads this context's kernels split over: 1, or the size of its Team.
  std::size_t threads() const { return team_ == nullptr ? 1 : team_->size(); }

  /// The split in_blocks() makes of `units` units of `unit_work` elements each: one block per
  /// thread of the team where each gets at least split_min_elements elements, else one block.
  BlockSplit split(std::size_t units, std::size_t unit_work) const {
    return block_split(units, unit_work, threads(), unit_work == 1 ? split_align : 1,
                       split_min_elements);
  }
  /// Calls `f(first, count)` over blocks of [0, units) as split() cuts them, on the team's
  /// threads (at once) or on the calling thread alone; the kernels below and the host layers'
  /// kernels (layers/) run their rows or elements through it. Blocks of single elements are
  /// whole multiples of split_align (a cache line of float), so no two threads write one line.
  template <class F>
  void in_blocks(std::size_t units, std::size_t unit_work, const F& f) {
    run_blocks(team_, units, split(units, unit_work), f);
  }
  /// Calls `f(first, count)` over the blocks of a split the caller made (block_split, for at most
  /// threads() threads), as in_blocks does: for kernels whose blocks need more than split() knows
  /// (a scratch area per block, as the attention core's backward).
  template <class F>
  void in_blocks(std::size_t units, BlockSplit split, const F& f) {
    run_blocks(team_, units, split, f);
  }
  /// A block of an elementwise pass is not worth a hand-over below this many elements (256 KiB
  /// of floats, tens of microseconds of one core's pass).
  static constexpr std::size_t split_min_elements = std::size_t{1} << 16;
  /// Elementwise blocks are whole multiples of this many elements.
  static constexpr std::size_t split_align = 16;

  /// C(m, n) = alpha op(A) op(B) + beta C, row-major. op(A) (m, k) is A, or the transpose of a
  /// stored (k, m) A when `trans_a`; op(B) (k, n) likewise with `trans_b`. beta = 0 overwrites C,
  /// NaN included. Split over the context's team where it has one (host::gemm_split).
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
            const T* a, const T* b, T beta, T* c);
  /// y (rows, out) = x (rows, in) W^T + b (out), W (out, in) row-major; y overwritten. For float
  /// with oneDNN as the GEMM library, one matmul with the bias fused (kernels/linear.hpp) where
  /// the GEMM does not split over the team (gemm_split: one thread, or too little work), so that
  /// a team computes such a Linear with the very call one thread makes; else (OpenBLAS, a GEMM
  /// that splits, double, a build that defines GPIPE_HOST_GEMM_REFERENCE) gemm then bias_add.
  void linear_forward(std::size_t rows, std::size_t in, std::size_t out, const T* x, const T* w,
                      const T* b, T* y);
  /// y(rows, cols) += bias(cols), on every row.
  void bias_add(std::size_t rows, std::size_t cols, const T* bias, T* y);
  /// db(cols) += the column sums of dy(rows, cols).
  void bias_grad(std::size_t rows, std::size_t cols, const T* dy, T* db);
  /// y(n) = a + b; y may be a or b.
  void add(std::size_t n, const T* a, const T* b, T* y);
  /// y(n) += x.
  void accumulate(std::size_t n, const T* x, T* y);
  /// dst(n) = src; the two must not overlap.
  void copy(std::size_t n, const T* src, T* dst);
  /// dst(n) = value.
  void fill(std::size_t n, T value, T* dst);
  /// x(n) *= alpha.
  void scale(std::size_t n, T alpha, T* x);
  /// out[0] (one double of this device's memory) = the sum of x(n)'s squares in double, in the
  /// fixed order of detail::squares_chunk (backend/common.hpp: the same bits for any team and on
  /// every backend).
  void sum_of_squares(std::size_t n, const T* x, double* out);

  /// dst(n) on this device = host_src(n) in host memory (U = float, or std::int32_t for class
  /// ids); on the host both are ordinary memory.
  template <class U>
  void upload(std::size_t n, const U* host_src, U* dst) {
    host::copy(n, host_src, dst);
  }
  /// host_dst(n) in host memory = src(n) on this device.
  template <class U>
  void download(std::size_t n, const U* src, U* host_dst) {
    host::copy(n, src, host_dst);
  }

  /// Cross-entropy of softmax(logits (rows, classes)) against targets(rows), class ids in
  /// [0, classes) or ignore_index (-100) that the caller has checked: loss_sum[0] = the sum over
  /// the rows not ignored of -log softmax(logits_r)[t_r], dlogits (rows, classes) = grad_scale
  /// (softmax - onehot), 0 on an ignored row. Both
  /// overwritten; grad_scale = 1 / (mini-batch normalizer) makes micro-batches' gradients add up
  /// to the mini-batch mean's.
  /// Split over the team by rows, each row's loss kept until all are done and then summed in
  /// row order, as one thread sums them.
  void softmax_cross_entropy(std::size_t rows, std::size_t classes, const T* logits,
                             const std::int32_t* targets, T grad_scale, T* dlogits, T* loss_sum);
  /// loss_sum[0] = sum (y - target)^2 over n elements, dy(n) = grad_scale 2 (y - target); both
  /// overwritten, grad_scale as for softmax_cross_entropy.
  void mse(std::size_t n, const T* y, const T* target, T grad_scale, T* dy, T* loss_sum);
  /// One torch.optim.SGD step on p(n) with gradient g(n): d = g + weight_decay p; when
  /// momentum != 0, buf = first_step ? d : momentum buf + (1 - dampening) d and d = nesterov ?
  /// d + momentum buf : buf; then p -= lr d. momentum_buf(n) is used only when momentum != 0.
  void sgd_update(std::size_t n, T* p, const T* g, T* momentum_buf, double lr, double momentum,
                  double dampening, double weight_decay, bool nesterov, bool first_step);
  /// One torch.optim.AdamW step on p(n) with gradient g(n) and moments m(n), v(n), all three
  /// updated in place: p *= 1 - lr weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v +
  /// (1 - beta2) g^2; p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps), t = `step`,
  /// counted from 1.
  void adamw_update(std::size_t n, T* p, const T* g, T* m, T* v, double lr, double beta1,
                    double beta2, double eps, double weight_decay, std::size_t step);
  /// adamw_update over all n parameters, weight_decay applied only in the `ranges` that decay
  /// (in order, covering [0, n); else gpipe::Error); where p_bf16 is not null, p_bf16(n) = the
  /// updated p rounded to bf16 (gpipe::has_adamw_ranges). A run at a time, split over the team.
  void adamw_update_ranges(std::size_t n, T* p, const T* g, T* m, T* v,
                           std::span<const DecayRange> ranges, double lr, double beta1,
                           double beta2, double eps, double weight_decay, std::size_t step,
                           bf16* p_bf16);

  /// The context for bf16 activations on this device and team (kernels_bf16.hpp), made on first
  /// use and kept with this one (gpipe::MixedBf16's work runs on it).
  KernelContext<bf16>& bf16_context();

 private:
#ifdef GPIPE_HOST_GEMM_REFERENCE
  static constexpr bool fused_linear = false;
  struct LinearForward {};
#else
  static constexpr bool fused_linear = std::is_same_v<T, float>;
#endif

  std::size_t device_;
  Team* team_;
  std::vector<double> row_losses_;  ///< softmax_cross_entropy's per-row losses, when it splits
  [[no_unique_address]] std::conditional_t<fused_linear, LinearForward, std::monostate> linear_;
  std::unique_ptr<KernelContext<bf16>> bf16_;  ///< bf16_context(), once asked for
};

// The kernels are defined out of the class, so that a program that declares KernelContext<float> an
// explicit instantiation (GPIPE_COMPILED_HOST: at the end of kernels_bf16.hpp) compiles none of
// them.

template <class T>
void KernelContext<T>::gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                            T alpha, const T* a, const T* b, T beta, T* c) {
  host::gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c,
             dense_strides(trans_a, trans_b, m, n, k), team_);
}

template <class T>
void KernelContext<T>::linear_forward(std::size_t rows, std::size_t in, std::size_t out, const T* x,
                                      const T* w, const T* b, T* y) {
  if (rows == 0) return;
#ifndef GPIPE_HOST_GEMM_REFERENCE
  if constexpr (fused_linear) {
    if (gemm_library() == GemmLibrary::onednn &&
        host::gemm_split(rows, out, in, threads()).parts == 1)
      return linear_(rows, in, out, x, w, b, y);
  }
#endif
  gemm(false, true, rows, out, in, T(1), x, w, T(0), y);
  bias_add(rows, out, b, y);
}

template <class T>
void KernelContext<T>::bias_add(std::size_t rows, std::size_t cols, const T* bias, T* y) {
  in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
    host::bias_add(count, cols, bias, y + first * cols);
  });
}

template <class T>
void KernelContext<T>::bias_grad(std::size_t rows, std::size_t cols, const T* dy, T* db) {
  in_blocks(cols, rows, [&](std::size_t first, std::size_t count) {  // column blocks
    host::bias_grad(rows, count, dy + first, db + first, cols);
  });
}

template <class T>
void KernelContext<T>::add(std::size_t n, const T* a, const T* b, T* y) {
  in_blocks(n, 1, [&](std::size_t i, std::size_t c) { host::add(c, a + i, b + i, y + i); });
}

template <class T>
void KernelContext<T>::accumulate(std::size_t n, const T* x, T* y) {
  in_blocks(n, 1, [&](std::size_t i, std::size_t c) { host::accumulate(c, x + i, y + i); });
}

template <class T>
void KernelContext<T>::scale(std::size_t n, T alpha, T* x) {
  in_blocks(n, 1, [&](std::size_t i, std::size_t c) { host::scale(c, alpha, x + i); });
}

template <class T>
void KernelContext<T>::sum_of_squares(std::size_t n, const T* x, double* out) {
  using detail::squares_chunk;
  const std::size_t chunks = (n + squares_chunk - 1) / squares_chunk;
  std::vector<double> sums(chunks);
  in_blocks(chunks, squares_chunk, [&](std::size_t first, std::size_t count) {
    for (std::size_t c = first; c < first + count; ++c) {
      const std::size_t begin = c * squares_chunk;
      sums[c] = chunk_sum_of_squares(std::min(squares_chunk, n - begin), x + begin);
    }
  });
  double total = 0;
  for (const double s : sums) total += s;
  out[0] = total;
}

template <class T>
void KernelContext<T>::copy(std::size_t n, const T* src, T* dst) {
  in_blocks(n, 1, [&](std::size_t i, std::size_t c) { host::copy(c, src + i, dst + i); });
}

template <class T>
void KernelContext<T>::fill(std::size_t n, T value, T* dst) {
  in_blocks(n, 1, [&](std::size_t i, std::size_t c) { host::fill(c, value, dst + i); });
}

template <class T>
void KernelContext<T>::softmax_cross_entropy(std::size_t rows, std::size_t classes, const T* logits,
                                             const std::int32_t* targets, T grad_scale, T* dlogits,
                                             T* loss_sum) {
  const BlockSplit rows_split = split(rows, classes);
  if (rows_split.parts <= 1)
    return host::softmax_cross_entropy(rows, classes, logits, targets, grad_scale, dlogits,
                                       loss_sum);
  row_losses_.resize(rows);  // grows to the largest rows seen, then is reused
  in_blocks(rows, rows_split, [&](std::size_t first, std::size_t count) {
    for (std::size_t r = first; r < first + count; ++r)
      row_losses_[r] = host::softmax_cross_entropy_row(classes, logits + r * classes, targets[r],
                                                       grad_scale, dlogits + r * classes);
  });
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r) total += row_losses_[r];
  loss_sum[0] = static_cast<T>(total);
}

template <class T>
void KernelContext<T>::mse(std::size_t n, const T* y, const T* target, T grad_scale, T* dy,
                           T* loss_sum) {
  host::mse(n, y, target, grad_scale, dy, loss_sum);
}

template <class T>
void KernelContext<T>::sgd_update(std::size_t n, T* p, const T* g, T* momentum_buf, double lr,
                                  double momentum, double dampening, double weight_decay,
                                  bool nesterov, bool first_step) {
  in_blocks(n, 1, [&](std::size_t i, std::size_t c) {
    host::sgd_update(c, p + i, g + i, momentum_buf == nullptr ? nullptr : momentum_buf + i, lr,
                     momentum, dampening, weight_decay, nesterov, first_step);
  });
}

template <class T>
void KernelContext<T>::adamw_update(std::size_t n, T* p, const T* g, T* m, T* v, double lr,
                                    double beta1, double beta2, double eps, double weight_decay,
                                    std::size_t step) {
  in_blocks(n, 1, [&](std::size_t i, std::size_t c) {
    host::adamw_update(c, p + i, g + i, m + i, v + i, lr, beta1, beta2, eps, weight_decay, step);
  });
}

template <class T>
void KernelContext<T>::adamw_update_ranges(std::size_t n, T* p, const T* g, T* m, T* v,
                                           std::span<const DecayRange> ranges, double lr,
                                           double beta1, double beta2, double eps,
                                           double weight_decay, std::size_t step, bf16* p_bf16) {
  gpipe::detail::check_decay_ranges(n, ranges);
  for (const DecayRange& r : ranges) {
    const double wd = r.decays ? weight_decay : 0.0;
    in_blocks(r.size, 1, [&](std::size_t i, std::size_t c) {
      const std::size_t at = r.offset + i;
      host::adamw_update(c, p + at, g + at, m + at, v + at, lr, beta1, beta2, eps, wd, step);
      if (p_bf16 == nullptr) return;
      for (std::size_t j = at; j < at + c; ++j) p_bf16[j] = bf16(p[j]);
    });
  }
}

}  // namespace gpipe::host

#include "gpipe/backend/host/kernels_bf16.hpp"  // IWYU pragma: export
