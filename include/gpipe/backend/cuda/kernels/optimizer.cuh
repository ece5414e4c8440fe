#pragma once
// Optimizer updates with PyTorch's rules (torch.optim.SGD, torch.optim.AdamW, single-tensor
// implementation), in the same float operations as the host reference
// gpipe/backend/host/kernels/optimizer.hpp; hyperparameters arrive in double and are rounded to
// float as there.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/optimizer.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::cuda {

/// sgd_update's hyperparameters as its kernel takes them: rounded to float, with the tests on
/// momentum and weight decay made once on the host.
struct SgdHyper {
  float lr,                  ///< learning rate
      momentum,              ///< momentum factor (0: plain SGD)
      dampening_complement,  ///< 1 - dampening: the weight of d in the momentum buffer
      weight_decay;          ///< L2 penalty: d = g + weight_decay p
  bool use_momentum,         ///< momentum != 0: the buffer is updated and replaces d
      use_weight_decay,      ///< weight_decay != 0
      nesterov,              ///< d = d + momentum buf instead of buf
      first_step;            ///< the buffer's first update: buf = d, without reading it
};

/// p, g, buf (n): d = g + wd p; buf = first ? d : momentum buf + (1 - dampening) d;
/// d = nesterov ? d + momentum buf : buf (when momentum != 0); p -= lr d
template <int V>
__global__ void sgd_update_kernel(std::size_t n, float* p, const float* g, float* buf, SgdHyper h) {
  auto update = [&h](float& pv, float gv, float& bv) {
    float d = gv;
    if (h.use_weight_decay) d += h.weight_decay * pv;
    if (h.use_momentum) {
      bv = h.first_step ? d : h.momentum * bv + h.dampening_complement * d;
      d = h.nesterov ? d + h.momentum * bv : bv;
    }
    pv -= h.lr * d;
  };
  const std::size_t packs = n / V;
  for (std::size_t i = detail::global_thread(); i < packs; i += detail::grid_threads()) {
    detail::Pack<float, V> pv = detail::load_pack<V>(p + i * V);
    const detail::Pack<float, V> gv = detail::load_pack<V>(g + i * V);
    detail::Pack<float, V> bv{};
    if (h.use_momentum && !h.first_step) bv = detail::load_pack<V>(buf + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) update(pv.v[j], gv.v[j], bv.v[j]);
    detail::store_pack<V>(p + i * V, pv);
    if (h.use_momentum) detail::store_pack<V>(buf + i * V, bv);
  }
  for (std::size_t i = packs * V + detail::global_thread(); i < n; i += detail::grid_threads()) {
    float bv = h.use_momentum && !h.first_step ? buf[i] : 0.0f;
    update(p[i], g[i], bv);
    if (h.use_momentum) buf[i] = bv;
  }
}
/// Kernels::sgd_update on `stream`: p and momentum_buf (n) updated in place; 16-byte packs where
/// all three pointers allow them.
inline void sgd_update(std::size_t n, float* p, const float* g, float* momentum_buf, double lr,
                       double momentum, double dampening, double weight_decay, bool nesterov,
                       bool first_step, cudaStream_t stream) {
  if (n == 0) return;
  const SgdHyper h{static_cast<float>(lr),
                   static_cast<float>(momentum),
                   static_cast<float>(1 - dampening),
                   static_cast<float>(weight_decay),
                   momentum != 0,
                   weight_decay != 0,
                   nesterov,
                   first_step};
  // p and g read, p written; the momentum buffer read (after the first step) and written
  const int buffers_read = 2 + (h.use_momentum && !first_step ? 1 : 0);
  const int buffers_written = 1 + (h.use_momentum ? 1 : 0);
  detail::record_map("sgd_update_kernel", n, 4, buffers_read * sizeof(float),
                     buffers_written * sizeof(float), stream);
  if (detail::aligned<4>(p, g, momentum_buf)) {
    GPIPE_CUDA_LAUNCH(sgd_update_kernel<4>, detail::grid_for(n / 4 + 1), detail::block_size, stream)
    (n, p, g, momentum_buf, h);
  } else {
    GPIPE_CUDA_LAUNCH(sgd_update_kernel<1>, detail::grid_for(n), detail::block_size, stream)
    (n, p, g, momentum_buf, h);
  }
  GPIPE_CUDA_CHECK_LAUNCH("sgd_update_kernel");
}

/// adamw_update's hyperparameters as its kernel takes them: rounded to float, with the step's bias
/// corrections and the decoupled weight decay folded in on the host (in double).
struct AdamWHyper {
  float decay;            ///< 1 - lr wd
  float one_minus_beta1;  ///< 1 - b1
  float beta2,            ///< b2, the second moment's decay
      one_minus_beta2;    ///< 1 - b2
  float step_size;        ///< lr / (1 - b1^t)
  float bias2_sqrt;       ///< sqrt(1 - b2^t)
  float eps;              ///< added to sqrt(v) / sqrt(1 - b2^t), keeps the step finite where v is 0
};

/// p, g, m, v (n): p *= 1 - lr wd; m += (g - m)(1 - b1); v = b2 v + (1 - b2) g^2;
/// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <int V>
__global__ void adamw_update_kernel(std::size_t n, float* p, const float* g, float* m, float* v,
                                    AdamWHyper h) {
  auto update = [&h](float& pv, float gv, float& mv, float& vv) {
    pv *= h.decay;
    mv += (gv - mv) * h.one_minus_beta1;
    vv = h.beta2 * vv + h.one_minus_beta2 * gv * gv;
    const float denom = sqrtf(vv) / h.bias2_sqrt + h.eps;
    pv -= h.step_size * mv / denom;
  };
  const std::size_t packs = n / V;
  for (std::size_t i = detail::global_thread(); i < packs; i += detail::grid_threads()) {
    detail::Pack<float, V> pv = detail::load_pack<V>(p + i * V);
    const detail::Pack<float, V> gv = detail::load_pack<V>(g + i * V);
    detail::Pack<float, V> mv = detail::load_pack<V>(m + i * V);
    detail::Pack<float, V> vv = detail::load_pack<V>(v + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) update(pv.v[j], gv.v[j], mv.v[j], vv.v[j]);
    detail::store_pack<V>(p + i * V, pv);
    detail::store_pack<V>(m + i * V, mv);
    detail::store_pack<V>(v + i * V, vv);
  }
  for (std::size_t i = packs * V + detail::global_thread(); i < n; i += detail::grid_threads())
    update(p[i], g[i], m[i], v[i]);
}
/// Kernels::adamw_update on `stream`: p, m and v (n) updated in place; `step` counts from 1.
inline void adamw_update(std::size_t n, float* p, const float* g, float* m, float* v, double lr,
                         double beta1, double beta2, double eps, double weight_decay,
                         std::size_t step, cudaStream_t stream) {
  if (n == 0) return;
  const double t = static_cast<double>(step);
  const AdamWHyper h{static_cast<float>(1 - lr * weight_decay),
                     static_cast<float>(1 - beta1),
                     static_cast<float>(beta2),
                     static_cast<float>(1 - beta2),
                     static_cast<float>(lr / (1 - std::pow(beta1, t))),
                     static_cast<float>(std::sqrt(1 - std::pow(beta2, t))),
                     static_cast<float>(eps)};
  detail::record_map("adamw_update_kernel", n, 14, 4 * sizeof(float), 3 * sizeof(float), stream);
  if (detail::aligned<4>(p, g, m, v)) {
    GPIPE_CUDA_LAUNCH(adamw_update_kernel<4>, detail::grid_for(n / 4 + 1), detail::block_size,
                      stream)
    (n, p, g, m, v, h);
  } else {
    GPIPE_CUDA_LAUNCH(adamw_update_kernel<1>, detail::grid_for(n), detail::block_size, stream)
    (n, p, g, m, v, h);
  }
  GPIPE_CUDA_CHECK_LAUNCH("adamw_update_kernel");
}

}  // namespace gpipe::cuda
