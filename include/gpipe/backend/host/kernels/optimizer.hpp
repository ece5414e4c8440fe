#pragma once
// Optimizer update kernels with PyTorch's update rules (torch.optim.SGD, torch.optim.AdamW,
// single-tensor "for-loop" implementation, maximize=False, amsgrad=False).

#include <cmath>
#include <cstddef>

namespace gpipe::host {

/// d = g + wd p; buf = first ? d : momentum buf + (1 - dampening) d;
/// d = nesterov ? d + momentum buf : buf (when momentum != 0); p -= lr d
template <class T>
void sgd_update(std::size_t n, T* p, const T* g, T* momentum_buf, double lr, double momentum,
                double dampening, double weight_decay, bool nesterov, bool first_step) {
  for (std::size_t i = 0; i < n; ++i) {
    T d = g[i];
    if (weight_decay != 0) d += static_cast<T>(weight_decay) * p[i];
    if (momentum != 0) {
      T& b = momentum_buf[i];
      b = first_step ? d : static_cast<T>(momentum) * b + static_cast<T>(1 - dampening) * d;
      d = nesterov ? d + static_cast<T>(momentum) * b : b;
    }
    p[i] -= static_cast<T>(lr) * d;
  }
}

/// p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps),  t = step >= 1
template <class T>
void adamw_update(std::size_t n, T* p, const T* g, T* m, T* v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, std::size_t step) {
  const double t = static_cast<double>(step);
  const double bias1 = 1 - std::pow(beta1, t);
  const double bias2_sqrt = std::sqrt(1 - std::pow(beta2, t));
  const T step_size = static_cast<T>(lr / bias1);
  const T decay = static_cast<T>(1 - lr * weight_decay);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] *= decay;
    m[i] += (g[i] - m[i]) * static_cast<T>(1 - beta1);
    v[i] = static_cast<T>(beta2) * v[i] + static_cast<T>(1 - beta2) * g[i] * g[i];
    const T denom = std::sqrt(v[i]) / static_cast<T>(bias2_sqrt) + static_cast<T>(eps);
    p[i] -= step_size * m[i] / denom;
  }
}

}  // namespace gpipe::host
