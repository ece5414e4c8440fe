#pragma once
// gpipe::host::Kernels<T>: the host backend's kernel context, the set of primitive operations
// that layers, losses and optimizers are written against (gpipe::kernel_context,
// model/kernel_context.hpp). A backend's stream hands its kernel context to each piece of work;
// the CUDA backend's enqueues the same operations on its stream. Pointers are device memory of
// the context's device; on the host that is ordinary memory. The relu, gelu and layer_norm
// members are this backend's kernels for those layers, which reach them through their
// LayerKernels specializations (layers/); they are not part of the concept.
//
// Kernels<double> exists for the finite-difference tests and the double-precision reference.
//
// Beyond the primitives every backend's context has, this one has linear_forward, a Linear
// layer's GEMM and bias in one call, which Linear uses where a context provides it: the float
// context runs it as one oneDNN matmul with the bias fused (kernels/linear.hpp).

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <variant>

#include "gpipe/backend/host/kernels/elementwise.hpp"
#include "gpipe/backend/host/kernels/gemm.hpp"
#include "gpipe/backend/host/kernels/layer_norm.hpp"
#include "gpipe/backend/host/kernels/linear.hpp"
#include "gpipe/backend/host/kernels/loss.hpp"
#include "gpipe/backend/host/kernels/optimizer.hpp"

namespace gpipe::host {

template <class T>
class Kernels {
 public:
  using value_type = T;

  explicit Kernels(std::size_t device = 0) : device_(device) {}
  std::size_t device() const { return device_; }

  /// C(m, n) = alpha op(A) op(B) + beta C, row-major
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
            const T* a, const T* b, T beta, T* c) {
    host::gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
  /// y (rows, out) = x (rows, in) W^T + b, W (out, in) row-major.
  void linear_forward(std::size_t rows, std::size_t in, std::size_t out, const T* x, const T* w,
                      const T* b, T* y) {
    if (rows == 0) return;
    if constexpr (fused_linear) {
      linear_(rows, in, out, x, w, b, y);
    } else {
      gemm(false, true, rows, out, in, T(1), x, w, T(0), y);
      bias_add(rows, out, b, y);
    }
  }
  void bias_add(std::size_t rows, std::size_t cols, const T* bias, T* y) {
    host::bias_add(rows, cols, bias, y);
  }
  void bias_grad(std::size_t rows, std::size_t cols, const T* dy, T* db) {
    host::bias_grad(rows, cols, dy, db);
  }
  void relu_forward(std::size_t n, const T* x, T* y) { host::relu_forward(n, x, y); }
  void relu_backward(std::size_t n, const T* x, const T* dy, T* dx) {
    host::relu_backward(n, x, dy, dx);
  }
  void gelu_forward(std::size_t n, const T* x, T* y) { host::gelu_forward(n, x, y); }
  void gelu_backward(std::size_t n, const T* x, const T* dy, T* dx) {
    host::gelu_backward(n, x, dy, dx);
  }
  void layer_norm_forward(std::size_t rows, std::size_t cols, double eps, const T* x,
                          const T* gamma, const T* beta, T* y, T* stats) {
    host::layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats);
  }
  void layer_norm_backward_input(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                                 const T* gamma, const T* stats, T* dx) {
    host::layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx);
  }
  void layer_norm_backward_weight(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                                  const T* stats, T* dgamma, T* dbeta) {
    host::layer_norm_backward_weight(rows, cols, x, dy, stats, dgamma, dbeta);
  }
  void add(std::size_t n, const T* a, const T* b, T* y) { host::add(n, a, b, y); }
  void accumulate(std::size_t n, const T* x, T* y) { host::accumulate(n, x, y); }
  void copy(std::size_t n, const T* src, T* dst) { host::copy(n, src, dst); }
  void fill(std::size_t n, T value, T* dst) { host::fill(n, value, dst); }

  /// Copies between host memory and this device's memory.
  template <class U>
  void upload(std::size_t n, const U* host_src, U* dst) {
    host::copy(n, host_src, dst);
  }
  template <class U>
  void download(std::size_t n, const U* src, U* host_dst) {
    host::copy(n, src, host_dst);
  }

  void softmax_cross_entropy(std::size_t rows, std::size_t classes, const T* logits,
                             const std::int32_t* targets, T grad_scale, T* dlogits, T* loss_sum) {
    host::softmax_cross_entropy(rows, classes, logits, targets, grad_scale, dlogits, loss_sum);
  }
  void mse(std::size_t n, const T* y, const T* target, T grad_scale, T* dy, T* loss_sum) {
    host::mse(n, y, target, grad_scale, dy, loss_sum);
  }
  void sgd_update(std::size_t n, T* p, const T* g, T* momentum_buf, double lr, double momentum,
                  double dampening, double weight_decay, bool nesterov, bool first_step) {
    host::sgd_update(n, p, g, momentum_buf, lr, momentum, dampening, weight_decay, nesterov,
                     first_step);
  }
  void adamw_update(std::size_t n, T* p, const T* g, T* m, T* v, double lr, double beta1,
                    double beta2, double eps, double weight_decay, std::size_t step) {
    host::adamw_update(n, p, g, m, v, lr, beta1, beta2, eps, weight_decay, step);
  }

 private:
#ifdef GPIPE_HOST_GEMM_REFERENCE
  static constexpr bool fused_linear = false;
  struct LinearForward {};
#else
  static constexpr bool fused_linear = std::is_same_v<T, float>;
#endif

  std::size_t device_;
  [[no_unique_address]] std::conditional_t<fused_linear, LinearForward, std::monostate> linear_;
};

}  // namespace gpipe::host
