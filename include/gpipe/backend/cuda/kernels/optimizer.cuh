#pragma once
// Optimizer updates with PyTorch's rules (torch.optim.SGD, torch.optim.AdamW, single-tensor
// implementation), in the same float operations as the host reference
// gpipe/backend/host/kernels/optimizer.hpp; hyperparameters arrive in double and are rounded to
// float as there. AdamW also comes as one launch over a whole stage, with per-range weight decay
// and the bf16 copy of the weights written in the same pass (adamw_update_ranges).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/optimizer.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/precision.hpp"

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
GPIPE_CUDA_INLINE void sgd_update(std::size_t n, float* p, const float* g, float* momentum_buf,
                                  double lr, double momentum, double dampening, double weight_decay,
                                  bool nesterov, bool first_step, cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void sgd_update(std::size_t n, float* p, const float* g, float* momentum_buf,
                                  double lr, double momentum, double dampening, double weight_decay,
                                  bool nesterov, bool first_step, cudaStream_t stream) {
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
#endif

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

namespace detail {

// One element's AdamW step, with `decay` = 1 - lr wd: the one expression both AdamW kernels
// inline, so that they round alike.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, float decay,
                                              const AdamWHyper& h) {
  p *= decay;
  m += (g - m) * h.one_minus_beta1;
  v = h.beta2 * v + h.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / h.bias2_sqrt + h.eps;
  p -= h.step_size * m / denom;
}

// The hyperparameters of step t, folded in double and rounded to float.
inline AdamWHyper adamw_hyper(double lr, double beta1, double beta2, double eps,
                              double weight_decay, std::size_t step) {
  const double t = static_cast<double>(step);
  return {static_cast<float>(1 - lr * weight_decay),
          static_cast<float>(1 - beta1),
          static_cast<float>(beta2),
          static_cast<float>(1 - beta2),
          static_cast<float>(lr / (1 - std::pow(beta1, t))),
          static_cast<float>(std::sqrt(1 - std::pow(beta2, t))),
          static_cast<float>(eps)};
}

}  // namespace detail

/// p, g, m, v (n): p *= 1 - lr wd; m += (g - m)(1 - b1); v = b2 v + (1 - b2) g^2;
/// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <int V>
__global__ void adamw_update_kernel(std::size_t n, float* p, const float* g, float* m, float* v,
                                    AdamWHyper h) {
  const std::size_t packs = n / V;
  for (std::size_t i = detail::global_thread(); i < packs; i += detail::grid_threads()) {
    detail::Pack<float, V> pv = detail::load_pack<V>(p + i * V);
    const detail::Pack<float, V> gv = detail::load_pack<V>(g + i * V);
    detail::Pack<float, V> mv = detail::load_pack<V>(m + i * V);
    detail::Pack<float, V> vv = detail::load_pack<V>(v + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j)
      detail::adamw_element(pv.v[j], gv.v[j], mv.v[j], vv.v[j], h.decay, h);
    detail::store_pack<V>(p + i * V, pv);
    detail::store_pack<V>(m + i * V, mv);
    detail::store_pack<V>(v + i * V, vv);
  }
  for (std::size_t i = packs * V + detail::global_thread(); i < n; i += detail::grid_threads())
    detail::adamw_element(p[i], g[i], m[i], v[i], h.decay, h);
}
/// Kernels::adamw_update on `stream`: p, m and v (n) updated in place; `step` counts from 1.
GPIPE_CUDA_INLINE void adamw_update(std::size_t n, float* p, const float* g, float* m, float* v,
                                    double lr, double beta1, double beta2, double eps,
                                    double weight_decay, std::size_t step, cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void adamw_update(std::size_t n, float* p, const float* g, float* m, float* v,
                                    double lr, double beta1, double beta2, double eps,
                                    double weight_decay, std::size_t step, cudaStream_t stream) {
  if (n == 0) return;
  const AdamWHyper h = detail::adamw_hyper(lr, beta1, beta2, eps, weight_decay, step);
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
#endif

/// adamw_update_ranges' runs of weight decay, as one launch takes them (by value, within the 4 KiB
/// of a launch's parameters): run r covers elements [end[r - 1], end[r]) (end[-1] = 0) and
/// decays where bit r % 32 of decays[r / 32] is set. Adjacent ranges of one setting are one run.
struct AdamWRuns {
  static constexpr int capacity = 320;  ///< runs per launch; a stage with more takes more launches
  std::size_t end[capacity];            ///< one past each run's last element
  std::uint32_t decays[capacity / 32];  ///< a bit per run: weight decay applies
  int count;                            ///< runs in use, >= 1
};

namespace detail {

// The run that holds element i: the first r with end[r] > i (i < end[count - 1]).
__device__ __forceinline__ int run_of(const AdamWRuns& runs, std::size_t i) {
  int lo = 0, hi = runs.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (runs.end[mid] > i)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}
// The decay factor of element i, whose run is r or a later one (r advanced to it).
__device__ __forceinline__ float decay_at(const AdamWRuns& runs, std::size_t i, int& r,
                                          const AdamWHyper& h, float no_decay) {
  while (runs.end[r] <= i) ++r;
  return (runs.decays[r / 32] >> (r % 32)) & 1u ? h.decay : no_decay;
}

}  // namespace detail

/// p, g, m, v (n): adamw_update_kernel's step on every element, with h.decay (1 - lr wd) in the
/// runs that decay and no_decay (1 - lr 0) elsewhere; w (n, bf16), unless null, = the updated p
/// rounded to nearest even. Each pack finds its run by binary search over `runs`.
template <int V>
__global__ void adamw_update_ranges_kernel(std::size_t n, float* p, const float* g, float* m,
                                           float* v, bf16* w,
                                           const __grid_constant__ AdamWRuns runs, AdamWHyper h,
                                           float no_decay) {
  const std::size_t packs = n / V;
  for (std::size_t i = detail::global_thread(); i < packs; i += detail::grid_threads()) {
    int r = detail::run_of(runs, i * V);
    detail::Pack<float, V> pv = detail::load_pack<V>(p + i * V);
    const detail::Pack<float, V> gv = detail::load_pack<V>(g + i * V);
    detail::Pack<float, V> mv = detail::load_pack<V>(m + i * V);
    detail::Pack<float, V> vv = detail::load_pack<V>(v + i * V);
    detail::Pack<bf16, V> wv;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float decay = detail::decay_at(runs, i * V + j, r, h, no_decay);
      detail::adamw_element(pv.v[j], gv.v[j], mv.v[j], vv.v[j], decay, h);
      wv.v[j] = detail::narrow<bf16>(pv.v[j]);
    }
    detail::store_pack<V>(p + i * V, pv);
    detail::store_pack<V>(m + i * V, mv);
    detail::store_pack<V>(v + i * V, vv);
    if (w != nullptr) detail::store_pack<V>(w + i * V, wv);
  }
  for (std::size_t i = packs * V + detail::global_thread(); i < n; i += detail::grid_threads()) {
    int r = detail::run_of(runs, i);
    detail::adamw_element(p[i], g[i], m[i], v[i], detail::decay_at(runs, i, r, h, no_decay), h);
    if (w != nullptr) w[i] = detail::narrow<bf16>(p[i]);
  }
}

namespace detail {

// ranges[first, ...) as the runs of one launch (at most AdamWRuns::capacity, adjacent ranges of
// one setting merged), their ends counted from ranges[first].offset; `next` <- the first range
// not taken.
inline AdamWRuns adamw_runs(std::span<const DecayRange> ranges, std::size_t first,
                            std::size_t& next) {
  AdamWRuns runs{};
  const std::size_t at = ranges[first].offset;
  std::size_t i = first;
  for (; i < ranges.size(); ++i) {
    const DecayRange& range = ranges[i];
    const std::size_t end = range.offset + range.size - at;
    const int last = runs.count - 1;
    const bool last_decays = last >= 0 && ((runs.decays[last / 32] >> (last % 32)) & 1u);
    if (last >= 0 && last_decays == range.decays) {
      runs.end[last] = end;
      continue;
    }
    if (runs.count == AdamWRuns::capacity) break;
    runs.end[runs.count] = end;
    if (range.decays) runs.decays[runs.count / 32] |= 1u << (runs.count % 32);
    ++runs.count;
  }
  next = i;
  return runs;
}

}  // namespace detail

/// Kernels::adamw_update_ranges on `stream`: adamw_update's step over all n parameters, weight
/// decay only in the `ranges` that decay (in order, covering [0, n); gpipe::Error otherwise),
/// and p_bf16 (n), unless null, = the updated p rounded to bf16. One launch for up to
/// AdamWRuns::capacity runs of one setting.
GPIPE_CUDA_INLINE void adamw_update_ranges(std::size_t n, float* p, const float* g, float* m,
                                           float* v, std::span<const DecayRange> ranges, double lr,
                                           double beta1, double beta2, double eps,
                                           double weight_decay, std::size_t step, bf16* p_bf16,
                                           cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void adamw_update_ranges(std::size_t n, float* p, const float* g, float* m,
                                           float* v, std::span<const DecayRange> ranges, double lr,
                                           double beta1, double beta2, double eps,
                                           double weight_decay, std::size_t step, bf16* p_bf16,
                                           cudaStream_t stream) {
  gpipe::detail::check_decay_ranges(n, ranges);
  if (n == 0) return;
  const AdamWHyper h = detail::adamw_hyper(lr, beta1, beta2, eps, weight_decay, step);
  const float no_decay = static_cast<float>(1 - lr * 0.0);
  for (std::size_t first = 0, next = 0; first < ranges.size(); first = next) {
    const AdamWRuns runs = detail::adamw_runs(ranges, first, next);
    const std::size_t at = ranges[first].offset, count = runs.end[runs.count - 1];
    if (count == 0) continue;
    bf16* w = p_bf16 == nullptr ? nullptr : p_bf16 + at;
    detail::record_map("adamw_update_ranges_kernel", count, 14, 4 * sizeof(float),
                       3 * sizeof(float) + (w != nullptr ? sizeof(bf16) : 0), stream);
    if (detail::aligned<4>(p + at, g + at, m + at, v + at, w)) {
      GPIPE_CUDA_LAUNCH(adamw_update_ranges_kernel<4>, detail::grid_for(count / 4 + 1),
                        detail::block_size, stream)
      (count, p + at, g + at, m + at, v + at, w, runs, h, no_decay);
    } else {
      GPIPE_CUDA_LAUNCH(adamw_update_ranges_kernel<1>, detail::grid_for(count), detail::block_size,
                        stream)
      (count, p + at, g + at, m + at, v + at, w, runs, h, no_decay);
    }
    GPIPE_CUDA_CHECK_LAUNCH("adamw_update_ranges_kernel");
  }
}
#endif

}  // namespace gpipe::cuda
