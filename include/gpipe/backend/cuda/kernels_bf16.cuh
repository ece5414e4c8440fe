#pragma once
// gpipe::cuda::KernelContext<bf16>: the CUDA backend's kernel context for gpipe::MixedBf16, a
// gpipe::kernel_context whose value_type is bf16 (activations, stashes, hand-overs) and whose
// master type is float (parameters, gradients, losses). A device's float context makes it on
// first use (KernelContext<float>::bf16_context()): same device, streams and cuBLAS handle.
//
// Every kernel computes in float: bf16 inputs are widened exactly on load, results rounded once
// to nearest even on store (kernels/common.cuh: the host's bits). GEMMs multiply bf16 operands
// with float accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F: the tensor cores). Layers pass
// weights as the bf16 copy the runtime rounds once per step (ForwardArgs::compute_params); a float
// operand is rounded into the context's cast scratch at each use. Linear's forward and weight
// gradient carry their bias in a cuBLASLt epilogue (kernels/linear.cuh). Every other op
// (elementwise ops, bias, LayerNorm, the embedding, the attention core, the losses) runs kernels
// templated on the storage type, which read and write bf16 directly: no float copy of an
// activation is made (only host uploads and downloads of floats pass through the float scratch
// wide()).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels_bf16.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/bias.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/kernels/gemm.cuh"
#include "gpipe/backend/cuda/kernels/linear.cuh"
#include "gpipe/backend/cuda/kernels/loss.cuh"
#include "gpipe/model/precision.hpp"

namespace gpipe::cuda {

/// The CUDA backend's kernel context for bf16 activations with float master weights (see the top
/// of this file). Its members take the float context's arguments with activations as bf16; every
/// operation is enqueued on the device's compute stream, as the float context's are.
template <>
class KernelContext<bf16> {
 public:
  /// The activations' type; parameters, gradients and losses are float (master_t<bf16>).
  using value_type = bf16;

  /// A context on the device of `fp32` (the backend's float context of that device).
  explicit KernelContext(const KernelContext<float>& fp32) : fp32_(*fp32.s_), s_(fp32.s_) {}

  /// Index of the virtual device whose work this context issues.
  std::size_t device() const { return s_->index; }
  /// CUDA device ordinal of the GPU this virtual device runs on.
  int gpu() const { return s_->gpu->id; }
  /// The device's compute stream (the float context's): a layer's own kernels run on it.
  cudaStream_t stream() const { return s_->compute; }
  /// The device's cuBLAS handle.
  cublasHandle_t blas() const { return s_->blas; }
  /// The device's float context (its float kernels, on float arrays).
  KernelContext<float>& fp32() { return fp32_; }
  /// The float context's scratch (KernelContext<float>::scratch).
  float* scratch(std::size_t floats) { return fp32_.scratch(floats); }
  /// `floats` of this context's own float scratch, for floats on their way between the host and
  /// bf16 device arrays (upload, download): valid for work enqueued on the compute stream until
  /// the next call; apart from scratch(). Not counted in memory_stats.
  float* wide(std::size_t floats) {
    return detail::grow_scratch(*s_, s_->wide, s_->wide_floats, floats);
  }
  /// n rounded up to a whole number of 256-byte blocks of floats (offsets into wide()).
  static constexpr std::size_t padded(std::size_t n) { return (n + 63) / 64 * 64; }

  /// C(m, n) = alpha op(A) op(B) + beta C, row-major, dense; A and B bf16 or float (rounded to
  /// bf16 first), C bf16 or float; float accumulation (cublasGemmEx, see the top of this file).
  template <class A, class B, class C>
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
            const A* a, const B* b, float beta, C* c) {
    static_assert(is_storage<A> && is_storage<B> && is_storage<C>,
                  "gpipe: cuda::KernelContext<bf16>::gemm takes bf16 or float arrays");
    if (m == 0 || n == 0) return;
    // float operands are rounded into the cast scratch, A's first and B's after it (at a
    // 256-byte boundary)
    const std::size_t a_cast = std::is_same_v<A, float> ? padded((m * k + 1) / 2) : 0;
    const std::size_t b_cast = std::is_same_v<B, float> ? padded((k * n + 1) / 2) : 0;
    float* cast = detail::grow_scratch(*s_, s_->cast, s_->cast_floats, a_cast + b_cast);
    const bf16* a16 = operand(a, m * k, reinterpret_cast<bf16*>(cast));
    const bf16* b16 = operand(b, k * n, reinterpret_cast<bf16*>(cast + a_cast));
    gemm_bf16(s_->blas, trans_a, trans_b, m, n, k, alpha, a16, b16, beta, c, s_->compute);
  }

  /// y (rows, out) = x (rows, in) W^T + b (out), y overwritten: one cuBLASLt GEMM of bf16
  /// operands with float accumulation that adds the float b before rounding y once
  /// (kernels/linear.cuh); W bf16 or float (rounded into the cast scratch first). gemm then
  /// bias_add where cuBLASLt has no algorithm for it.
  template <class W>
  void linear_forward(std::size_t rows, std::size_t in, std::size_t out, const bf16* x, const W* w,
                      const float* b, bf16* y) {
    static_assert(is_storage<W>,
                  "gpipe: cuda::KernelContext<bf16>::linear_forward takes bf16 or float weights");
    if (rows == 0) return;
    const bf16* w16 = weights(w, out * in);
    if (linear_forward_lt(*s_, rows, in, out, x, w16, b, y)) return;
    gemm(false, true, rows, out, in, 1.0f, x, w16, 0.0f, y);
    bias_add(rows, out, b, y);
  }
  /// dx (rows, in) = (dy (rows, out) W) * GELUTanh'(pre (rows, in)), overwritten, rounded once:
  /// the input gradient through a GELUTanh and the Linear after it, as one cuBLASLt GEMM of bf16
  /// operands with GELU's derivative in its epilogue (kernels/linear.cuh); W bf16 or float
  /// (rounded into the cast scratch first). False where cuBLASLt cannot, with nothing enqueued
  /// but that rounding.
  template <class W>
  bool linear_backward_input_gelu_tanh(std::size_t rows, std::size_t in, std::size_t out,
                                       const bf16* dy, const W* w, const bf16* pre, bf16* dx) {
    static_assert(is_storage<W>, "gpipe: cuda::KernelContext<bf16> takes bf16 or float weights");
    return linear_backward_input_gelu_tanh_lt(*s_, rows, in, out, dy, weights(w, out * in), pre,
                                              dx);
  }
  /// dW (out, in) += dy^T x and db (out) += the column sums of dy (rows, out), x (rows, in), dW
  /// and db float: one cuBLASLt GEMM of bf16 operands with float accumulation whose epilogue sums
  /// dy's columns (accumulated into db, deterministic; kernels/linear.cuh), or gemm then bias_grad
  /// where cuBLASLt has no algorithm for it.
  void linear_backward_weight(std::size_t rows, std::size_t in, std::size_t out, const bf16* dy,
                              const bf16* x, float* dw, float* db) {
    if (linear_backward_weight_lt(*s_, rows, in, out, dy, x, dw, db, scratch(out))) return;
    gemm(true, false, out, in, rows, 1.0f, dy, x, 1.0f, dw);
    bias_grad(rows, out, dy, db);
  }

  /// y(rows, cols) += bias(cols), in float, rounded once.
  void bias_add(std::size_t rows, std::size_t cols, const float* bias, bf16* y) {
    bias_add_forward(rows, cols, bias, y, s_->compute);
  }
  /// db(cols) += the column sums of dy(rows, cols) in float: accumulated, deterministic.
  void bias_grad(std::size_t rows, std::size_t cols, const bf16* dy, float* db) {
    bias_grad_backward(rows, cols, dy, db, scratch(bias_grad_scratch(rows, cols)), s_->compute);
  }

  /// y(n) = a + b (bf16 or float arrays, all one type), rounded once; y may be a or b.
  template <class T>
  void add(std::size_t n, const T* a, const T* b, T* y) {
    cuda::add(n, a, b, y, s_->compute);
  }
  /// y(n) += x.
  template <class T>
  void accumulate(std::size_t n, const T* x, T* y) {
    cuda::accumulate(n, x, y, s_->compute);
  }
  /// dst(n) = src, device to device (src may be on another GPU).
  template <class T>
  void copy(std::size_t n, const T* src, T* dst) {
    fp32_.copy_bytes(n * sizeof(T), src, dst);
  }
  /// dst(n) = value (rounded once for bf16).
  template <class T, class V>
  void fill(std::size_t n, V value, T* dst) {
    cuda::fill(n, static_cast<float>(value), dst, s_->compute);
  }
  /// x(n) *= alpha.
  template <class T>
  void scale(std::size_t n, float alpha, T* x) {
    cuda::scale(n, alpha, x, s_->compute);
  }
  /// out[0] = the sum of the squares of the float array x(n), as the float context sums them.
  void sum_of_squares(std::size_t n, const float* x, double* out) {
    fp32_.sum_of_squares(n, x, out);
  }

  /// y(n) = x(n) rounded to bf16, device memory (a stage's weights, once per step).
  void convert(std::size_t n, const float* x, bf16* y) { cuda::convert(n, x, y, s_->compute); }
  /// y(n) = x(n) widened to float (exact).
  void convert(std::size_t n, const bf16* x, float* y) { cuda::convert(n, x, y, s_->compute); }

  /// dst(n) on the device = host_src(n) in host memory, the same type (float, class ids, bf16).
  template <class U>
  void upload(std::size_t n, const U* host_src, U* dst) {
    fp32_.upload(n, host_src, dst);
  }
  /// dst(n) on the device = host_src(n) rounded to bf16 (uploaded as floats into wide(), rounded
  /// there).
  void upload(std::size_t n, const float* host_src, bf16* dst) {
    float* w = wide(n);
    fp32_.upload(n, host_src, w);
    convert(n, w, dst);
  }
  /// host_dst(n) = src(n), the same type; as KernelContext<float>::download, host_dst holds the
  /// data once the backend has synchronized.
  template <class U>
  void download(std::size_t n, const U* src, U* host_dst) {
    fp32_.download(n, src, host_dst);
  }
  /// host_dst(n) = src(n) widened to float (on the device, into wide(), then downloaded).
  void download(std::size_t n, const bf16* src, float* host_dst) {
    float* w = wide(n);
    convert(n, src, w);
    fp32_.download(n, w, host_dst);
  }

  /// loss_sum[0] (float, device memory) = the summed loss, dlogits = grad_scale (softmax -
  /// onehot) rounded to bf16 (0 on a row whose target is ignore_index), dlogits may be logits: one
  /// kernel on the bf16 logits, a block per row, float math (cuda::softmax_cross_entropy_forward),
  /// the rows' losses summed in a fixed order.
  void softmax_cross_entropy(std::size_t rows, std::size_t classes, const bf16* logits,
                             const std::int32_t* targets, float grad_scale, bf16* dlogits,
                             float* loss_sum) {
    softmax_cross_entropy_forward(rows, classes, logits, targets, grad_scale, dlogits, loss_sum,
                                  scratch(softmax_cross_entropy_scratch(rows)), s_->compute);
  }
  /// loss_sum[0] = sum (y - target)^2 (float), dy = grad_scale 2 (y - target) rounded to bf16
  /// (dy may be y), in one pass over the bf16 y.
  void mse(std::size_t n, const bf16* y, const float* target, float grad_scale, bf16* dy,
           float* loss_sum) {
    mse_forward(n, y, target, grad_scale, dy, loss_sum, scratch(mse_scratch()), s_->compute);
  }
  /// torch.optim.SGD's step on the float master arrays (KernelContext<float>::sgd_update).
  void sgd_update(std::size_t n, float* p, const float* g, float* momentum_buf, double lr,
                  double momentum, double dampening, double weight_decay, bool nesterov,
                  bool first_step) {
    fp32_.sgd_update(n, p, g, momentum_buf, lr, momentum, dampening, weight_decay, nesterov,
                     first_step);
  }
  /// torch.optim.AdamW's step on the float master arrays (KernelContext<float>::adamw_update).
  void adamw_update(std::size_t n, float* p, const float* g, float* m, float* v, double lr,
                    double beta1, double beta2, double eps, double weight_decay, std::size_t step) {
    fp32_.adamw_update(n, p, g, m, v, lr, beta1, beta2, eps, weight_decay, step);
  }
  /// AdamW over a stage's ranges on the float master arrays in one launch, with their bf16 copy
  /// (KernelContext<float>::adamw_update_ranges).
  void adamw_update_ranges(std::size_t n, float* p, const float* g, float* m, float* v,
                           std::span<const DecayRange> ranges, double lr, double beta1,
                           double beta2, double eps, double weight_decay, std::size_t step,
                           bf16* p_bf16) {
    fp32_.adamw_update_ranges(n, p, g, m, v, ranges, lr, beta1, beta2, eps, weight_decay, step,
                              p_bf16);
  }

  /// The transport's half of a hand-over, as KernelContext<float>::receive (bf16 messages: half the
  /// bytes).
  template <class U>
  void receive(std::size_t n, const U* src, U* dst) {
    fp32_.receive(n, src, dst);
  }

 private:
  template <class T>
  static constexpr bool is_storage = std::is_same_v<T, bf16> || std::is_same_v<T, float>;

  // A GEMM operand as bf16: itself, or rounded into `cast`.
  const bf16* operand(const bf16* p, std::size_t, bf16*) { return p; }
  const bf16* operand(const float* p, std::size_t n, bf16* cast) {
    convert(n, p, cast);
    return cast;
  }
  // n weights as bf16: themselves, or rounded into the cast scratch.
  const bf16* weights(const bf16* w, std::size_t) { return w; }
  const bf16* weights(const float* w, std::size_t n) {
    float* cast = detail::grow_scratch(*s_, s_->cast, s_->cast_floats, padded((n + 1) / 2));
    return operand(w, n, reinterpret_cast<bf16*>(cast));
  }

  KernelContext<float> fp32_;
  detail::DeviceState* s_;
};

inline KernelContext<bf16>& KernelContext<float>::bf16_context() {
  if (!bf16_) bf16_ = std::make_shared<KernelContext<bf16>>(*this);
  return *bf16_;
}

}  // namespace gpipe::cuda
