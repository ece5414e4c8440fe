#pragma once
// gpipe::host::KernelContext<bf16>: the host backend's kernel context for gpipe::MixedBf16, a
// gpipe::kernel_context whose value_type is bf16 (activations, stashes, hand-overs) and whose
// master type is float (parameters, gradients, losses). A device's float context makes it on
// first use (KernelContext<float>::bf16_context()), on the same device and team.
//
// Every kernel computes in float: bf16 inputs are widened exactly, results rounded once to
// nearest even when stored as bf16. GEMMs multiply bf16 operands with fp32 accumulation
// (kernels/gemm_bf16.hpp: oneDNN's bf16 matmul, AVX512-BF16 or AMX where the CPU has them).
// Layers pass weights as the bf16 copy the runtime rounds once per step
// (ForwardArgs::compute_params); a float operand is rounded into scratch at each use. The
// elementwise kernels widen blocks of at most `chunk` elements into buffers on the stack, run the
// float kernel and round its results.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/kernels/bf16.hpp"
#include "gpipe/backend/host/kernels/gemm_bf16.hpp"
#include "gpipe/backend/host/linkage.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::host {

/// The host backend's kernel context for bf16 activations with float master weights (see the
/// top of this file). Its members take the float context's arguments with activations as bf16.
template <>
class KernelContext<bf16> {
 public:
  /// The activations' type; parameters, gradients and losses are float (master_t<bf16>).
  using value_type = bf16;
  /// Elements a widening kernel handles per block on the stack.
  static constexpr std::size_t chunk = 512;

  /// A context for `device`, computing on the calling thread and on `team`'s helpers (null: the
  /// calling thread alone).
  explicit KernelContext(std::size_t device = 0, Team* team = nullptr)
      : fp32_(device, team), scratch_(fp32_.threads()) {}

  /// The device whose memory the pointer arguments are.
  std::size_t device() const { return fp32_.device(); }
  /// The threads this context's kernels split over: 1, or the size of its Team.
  std::size_t threads() const { return fp32_.threads(); }

  /// The split in_blocks() makes, as the float context's (KernelContext<float>::split).
  BlockSplit split(std::size_t units, std::size_t unit_work) const {
    return fp32_.split(units, unit_work);
  }
  /// Calls f(first, count) over blocks of [0, units) on the team, as
  /// KernelContext<float>::in_blocks.
  template <class F>
  void in_blocks(std::size_t units, std::size_t unit_work, const F& f) {
    fp32_.in_blocks(units, unit_work, f);
  }
  /// Calls f(first, count) over the blocks of a split the caller made.
  template <class F>
  void in_blocks(std::size_t units, BlockSplit split, const F& f) {
    fp32_.in_blocks(units, split, f);
  }

  /// Float scratch of at least n elements for block `block` (< threads()) of a split the caller
  /// runs with in_blocks: kept and reused (a kernel's widened operands are megabytes, which a
  /// fresh allocation per call would fault in page by page). Its contents are undefined.
  float* block_scratch(std::size_t block, std::size_t n) {
    std::vector<float>& s = scratch_.at(block);
    if (s.size() < n) s.resize(n);
    return s.data();
  }

  /// C(m, n) = alpha op(A) op(B) + beta C, row-major, dense; A and B bf16 or float (rounded to
  /// bf16 first), C bf16 or float; fp32 accumulation (see the top of this file).
  template <class A, class B, class C>
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
            const A* a, const B* b, float beta, C* c) {
    static_assert(is_storage<A> && is_storage<B> && is_storage<C>,
                  "gpipe: host::KernelContext<bf16>::gemm takes bf16 or float arrays");
    if (m == 0 || n == 0) return;
    const bf16* a16 = operand(a, m * k, a_scratch_);
    const bf16* b16 = operand(b, k * n, b_scratch_);
    run_gemm(Bf16GemmShape::dense(trans_a, trans_b, m, n, k, alpha, beta, std::is_same_v<C, float>),
             a16, b16, nullptr, c);
  }

  /// y (rows, out) = x (rows, in) W^T + b (out): one bf16 GEMM with the bias added in float
  /// before y is rounded; W bf16 or float (rounded first).
  template <class W>
  void linear_forward(std::size_t rows, std::size_t in, std::size_t out, const bf16* x, const W* w,
                      const float* b, bf16* y) {
    static_assert(is_storage<W>,
                  "gpipe: host::KernelContext<bf16>::linear_forward takes bf16 or float weights");
    if (rows == 0) return;
    const bf16* w16 = operand(w, out * in, b_scratch_);
    Bf16GemmShape shape = Bf16GemmShape::dense(false, true, rows, out, in, 1, 0, false);
    shape.bias = true;
    run_gemm(shape, x, w16, b, y);
  }

  /// What runs gemm(trans_a, trans_b, m, n, k, 1, a, b, beta, c) unsplit, C float or bf16:
  /// oneDNN's kernel name ("brg:avx512_core_bf16", ...), or the fp32 path.
  std::string gemm_implementation(bool trans_a, bool trans_b, std::size_t m, std::size_t n,
                                  std::size_t k, bool c_is_float, float beta = 0) {
    return gemms_.implementation(
        Bf16GemmShape::dense(trans_a, trans_b, m, n, k, 1, beta, c_is_float));
  }

  /// y(rows, cols) += bias(cols) on every row, in float, rounded once.
  void bias_add(std::size_t rows, std::size_t cols, const float* bias, bf16* y) {
    in_blocks(rows, cols, [&](std::size_t first, std::size_t count) {
      std::array<float, chunk> row;
      for (std::size_t r = first; r < first + count; ++r)
        for (std::size_t j = 0; j < cols; j += chunk) {
          const std::size_t w = std::min(chunk, cols - j);
          bf16* yr = y + r * cols + j;
          from_bf16(w, yr, row.data());
          host::add(w, row.data(), bias + j, row.data());
          to_bf16(w, row.data(), yr);
        }
    });
  }
  /// db(cols) += the column sums of dy(rows, cols), in float.
  void bias_grad(std::size_t rows, std::size_t cols, const bf16* dy, float* db) {
    in_blocks(cols, rows, [&](std::size_t first, std::size_t count) {  // column blocks
      for (std::size_t j = first; j < first + count; j += chunk) {
        const std::size_t w = std::min(chunk, first + count - j);
        std::array<float, chunk> row;
        for (std::size_t r = 0; r < rows; ++r) {
          from_bf16(w, dy + r * cols + j, row.data());
          host::accumulate(w, row.data(), db + j);
        }
      }
    });
  }

  /// y(n) = a + b (bf16 or float arrays, all one type); y may be a or b.
  template <class T>
  void add(std::size_t n, const T* a, const T* b, T* y) {
    if constexpr (std::is_same_v<T, float>)
      return fp32_.add(n, a, b, y);
    else
      widened(
          n, y,
          [](std::size_t c, const float* const* in, float* out) {
            host::add(c, in[0], in[1], out);
          },
          a, b);
  }
  /// y(n) += x.
  template <class T>
  void accumulate(std::size_t n, const T* x, T* y) {
    if constexpr (std::is_same_v<T, float>)
      return fp32_.accumulate(n, x, y);
    else
      add(n, y, x, y);
  }
  /// dst(n) = src.
  template <class T>
  void copy(std::size_t n, const T* src, T* dst) {
    in_blocks(n, 1, [&](std::size_t i, std::size_t c) { std::copy_n(src + i, c, dst + i); });
  }
  /// dst(n) = value (rounded once for bf16).
  template <class T, class V>
  void fill(std::size_t n, V value, T* dst) {
    const T v = static_cast<T>(static_cast<float>(value));
    in_blocks(n, 1, [&](std::size_t i, std::size_t c) { std::fill_n(dst + i, c, v); });
  }
  /// x(n) *= alpha.
  template <class T>
  void scale(std::size_t n, float alpha, T* x) {
    if constexpr (std::is_same_v<T, float>)
      return fp32_.scale(n, alpha, x);
    else
      widened(
          n, x,
          [alpha](std::size_t c, const float* const* in, float* out) {
            std::copy_n(in[0], c, out);
            host::scale(c, alpha, out);
          },
          x);
  }
  /// out[0] = the sum of the squares of the float array x(n), as the float context sums them.
  void sum_of_squares(std::size_t n, const float* x, double* out) {
    fp32_.sum_of_squares(n, x, out);
  }

  /// y(n) = x(n) rounded to bf16, device memory (a stage's weights, once per step).
  void convert(std::size_t n, const float* x, bf16* y) {
    in_blocks(n, 1, [&](std::size_t i, std::size_t c) { to_bf16(c, x + i, y + i); });
  }
  /// y(n) = x(n) widened to float (exact), device memory.
  void convert(std::size_t n, const bf16* x, float* y) {
    in_blocks(n, 1, [&](std::size_t i, std::size_t c) { from_bf16(c, x + i, y + i); });
  }

  /// dst(n) on the device = host_src(n): the same type (float, class ids, bf16), or floats
  /// rounded into bf16.
  template <class U>
  void upload(std::size_t n, const U* host_src, U* dst) {
    host::copy(n, host_src, dst);
  }
  /// dst(n) on the device = host_src(n) rounded to bf16.
  void upload(std::size_t n, const float* host_src, bf16* dst) { to_bf16(n, host_src, dst); }
  /// host_dst(n) = src(n): the same type, or bf16 widened to float.
  template <class U>
  void download(std::size_t n, const U* src, U* host_dst) {
    host::copy(n, src, host_dst);
  }
  /// host_dst(n) = src(n) widened to float (exact).
  void download(std::size_t n, const bf16* src, float* host_dst) { from_bf16(n, src, host_dst); }

  /// The float context's softmax_cross_entropy on logits widened to float, a row at a time:
  /// loss_sum[0] (float) = the summed loss in row order, dlogits rounded to bf16.
  void softmax_cross_entropy(std::size_t rows, std::size_t classes, const bf16* logits,
                             const std::int32_t* targets, float grad_scale, bf16* dlogits,
                             float* loss_sum) {
    row_losses_.resize(rows);
    const BlockSplit blocks = split(rows, classes);
    in_blocks(rows, blocks, [&](std::size_t first, std::size_t count) {
      float* row = block_scratch(first / blocks.block, 2 * classes);
      for (std::size_t r = first; r < first + count; ++r) {
        from_bf16(classes, logits + r * classes, row);
        row_losses_[r] =
            host::softmax_cross_entropy_row(classes, row, targets[r], grad_scale, row + classes);
        to_bf16(classes, row + classes, dlogits + r * classes);
      }
    });
    double total = 0;
    for (std::size_t r = 0; r < rows; ++r) total += row_losses_[r];
    loss_sum[0] = static_cast<float>(total);
  }
  /// loss_sum[0] = sum (y - target)^2 (float), dy = grad_scale 2 (y - target) rounded to bf16.
  void mse(std::size_t n, const bf16* y, const float* target, float grad_scale, bf16* dy,
           float* loss_sum) {
    std::vector<float> wide(2 * n);
    from_bf16(n, y, wide.data());
    host::mse(n, wide.data(), target, grad_scale, wide.data() + n, loss_sum);
    to_bf16(n, wide.data() + n, dy);
  }
  /// The optimizers' updates, on the float master arrays (the float context's).
  void sgd_update(std::size_t n, float* p, const float* g, float* momentum_buf, double lr,
                  double momentum, double dampening, double weight_decay, bool nesterov,
                  bool first_step) {
    fp32_.sgd_update(n, p, g, momentum_buf, lr, momentum, dampening, weight_decay, nesterov,
                     first_step);
  }
  /// One AdamW step on the float master arrays (KernelContext<float>::adamw_update).
  void adamw_update(std::size_t n, float* p, const float* g, float* m, float* v, double lr,
                    double beta1, double beta2, double eps, double weight_decay, std::size_t step) {
    fp32_.adamw_update(n, p, g, m, v, lr, beta1, beta2, eps, weight_decay, step);
  }
  /// AdamW over a stage's ranges on the float master arrays, with their bf16 copy
  /// (KernelContext<float>::adamw_update_ranges).
  void adamw_update_ranges(std::size_t n, float* p, const float* g, float* m, float* v,
                           std::span<const DecayRange> ranges, double lr, double beta1,
                           double beta2, double eps, double weight_decay, std::size_t step,
                           bf16* p_bf16) {
    fp32_.adamw_update_ranges(n, p, g, m, v, ranges, lr, beta1, beta2, eps, weight_decay, step,
                              p_bf16);
  }

  /// out(n) = f applied to in...(n) widened to float, rounded to bf16, in blocks of `chunk` over
  /// the team: f(count, const float* const* widened_inputs, float* out). An input may be out.
  template <class F, class... In>
  void widened(std::size_t n, bf16* out, const F& f, const In*... in) {
    in_blocks(n, 1, [&](std::size_t first, std::size_t count) {
      std::array<std::array<float, chunk>, sizeof...(In)> wide;
      std::array<float, chunk> result;
      for (std::size_t i = first; i < first + count; i += chunk) {
        const std::size_t c = std::min(chunk, first + count - i);
        std::size_t j = 0;
        ((widen_into(c, in + i, wide[j++].data())), ...);
        std::array<const float*, sizeof...(In)> ptrs;
        for (std::size_t k = 0; k < sizeof...(In); ++k) ptrs[k] = wide[k].data();
        f(c, ptrs.data(), result.data());
        to_bf16(c, result.data(), out + i);
      }
    });
  }

 private:
  template <class T>
  static constexpr bool is_storage = std::is_same_v<T, bf16> || std::is_same_v<T, float>;

  // A bf16 GEMM on the context's team (SplitBf16Gemm).
  void run_gemm(const Bf16GemmShape& s, const bf16* a, const bf16* b, const float* bias, void* c) {
    gemms_(s, a, b, bias, c, threads(), [this](std::size_t units, BlockSplit split, const auto& f) {
      in_blocks(units, split, f);
    });
  }

  static void widen_into(std::size_t n, const bf16* x, float* y) { from_bf16(n, x, y); }
  static void widen_into(std::size_t n, const float* x, float* y) { std::copy_n(x, n, y); }

  // A GEMM operand as bf16: itself, or rounded into scratch.
  const bf16* operand(const bf16* p, std::size_t, std::vector<bf16>&) const { return p; }
  const bf16* operand(const float* p, std::size_t n, std::vector<bf16>& scratch) const {
    scratch.resize(n);
    to_bf16(n, p, scratch.data());
    return scratch.data();
  }

  KernelContext<float> fp32_;
  SplitBf16Gemm gemms_;
  std::vector<bf16> a_scratch_, b_scratch_;
  std::vector<double> row_losses_;
  std::vector<std::vector<float>> scratch_;  ///< block_scratch(), one per thread
};

template <class T>
KernelContext<bf16>& KernelContext<T>::bf16_context() {
  if (!bf16_) bf16_ = std::make_unique<KernelContext<bf16>>(device_, team_);
  return *bf16_;
}

// Here, after the last of its out-of-class members (backend/host/linkage.hpp).
GPIPE_HOST_INSTANTIATION(class KernelContext<float>);

}  // namespace gpipe::host

namespace gpipe::detail {

// The bf16 kernels of an elementwise layer op (ReLU, GELU): its float kernels on blocks widened
// to float, the results rounded to bf16; each block runs the float kernel on a context of its
// own thread alone.
template <class Op>
struct WidenedElementwise {
  using Fp32 = LayerKernels<Op, host::KernelContext<float>>;
  // y(n) = f(x)
  static void forward(host::KernelContext<bf16>& k, std::size_t n, const bf16* x, bf16* y) {
    k.widened(
        n, y,
        [](std::size_t c, const float* const* in, float* out) {
          host::KernelContext<float> solo;
          Fp32::forward(solo, c, in[0], out);
        },
        x);
  }
  // dx(n) = dy f'(x)
  static void backward(host::KernelContext<bf16>& k, std::size_t n, const bf16* x, const bf16* dy,
                       bf16* dx) {
    k.widened(
        n, dx,
        [](std::size_t c, const float* const* in, float* out) {
          host::KernelContext<float> solo;
          Fp32::backward(solo, c, in[0], in[1], out);
        },
        x, dy);
  }
};

}  // namespace gpipe::detail
