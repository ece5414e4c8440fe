#pragma once
// Loss kernels: each writes the loss summed over its rows to loss_sum[0] (device memory, one
// float, overwritten) and the gradient of grad_scale * that sum with respect to its input. Inputs
// and gradients are stored as T (float, or gpipe::bf16 under gpipe::MixedBf16: widened on load,
// rounded once on store); the math, the targets and the loss are float. Host reference:
// gpipe/backend/host/kernels/loss.hpp (which computes in double; these in float). Sums run in
// fixed trees and a final single-block pass, so results do not depend on timing. A target of
// gpipe::ignore_index (-100) adds 0 to the loss and gets a zero gradient row, as on the host.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/loss.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/model/loss.hpp"

namespace gpipe::cuda {

/// out[0] = sum of partial(n), one block of 1024 threads, in a fixed order. (The bound makes the
/// compiler keep it within 64 registers a thread, so that the launch cannot run out of them.)
template <class T>
__global__ void __launch_bounds__(1024) sum_kernel(std::size_t n, const T* partial, T* out) {
  __shared__ T buf[32];
  T sum = 0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) sum += partial[i];
  sum = detail::block_sum(sum, buf);
  if (threadIdx.x == 0) out[0] = sum;
}
/// out[0] = sum of partial(n), overwritten, on `stream`; one block, in a fixed order.
GPIPE_CUDA_INLINE void sum(std::size_t n, const float* partial, float* out, cudaStream_t stream);
#if GPIPE_CUDA_DEFINITIONS
GPIPE_CUDA_INLINE void sum(std::size_t n, const float* partial, float* out, cudaStream_t stream) {
  detail::record_kernel("sum_kernel", {n, 0, 0}, static_cast<double>(n), detail::bytes_of<float>(n),
                        sizeof(float), stream);
  GPIPE_CUDA_LAUNCH(sum_kernel<float>, 1, 1024, stream)(n, partial, out);
  GPIPE_CUDA_CHECK_LAUNCH("sum_kernel");
}
#endif

/// One block per row r of logits (rows, classes), target t = targets[r]:
///   loss[r] = logsumexp(z_r) - z_r[t]          (into partial(rows))
///   dlogits_r = grad_scale * (softmax(z_r) - onehot(t))     (dlogits may be logits)
/// The row's max and sum of exponentials come from one online pass; the second pass reads the
/// row again (from L1/L2 where it is still there) and writes the gradient. V-wide packs
/// (classes % V == 0, rows aligned). An ignored target (ignore_index) gives loss 0 and a zero
/// row of dlogits without reading the logits; any other target outside [0, classes) (the Trainer
/// rejects those before) gives a NaN loss rather than a wild read.
template <int V, class T>
__global__ void softmax_cross_entropy_forward_kernel(std::size_t rows, std::size_t classes,
                                                     const T* logits, const std::int32_t* targets,
                                                     float grad_scale, T* dlogits, float* partial) {
  __shared__ float buf[32];
  const std::size_t row = blockIdx.x;
  if (row >= rows) return;  // the whole block leaves together
  const T* z = logits + row * classes;
  const std::int32_t t = targets[row];
  if (t == ignore_index) {  // the whole block leaves together here too
    detail::Pack<float, V> zero;
#pragma unroll
    for (int j = 0; j < V; ++j) zero.v[j] = 0.0f;
    for (std::size_t p = threadIdx.x; p < classes / V; p += blockDim.x)
      detail::store_narrowed<V>(dlogits + row * classes + p * V, zero);
    if (threadIdx.x == 0) partial[row] = 0.0f;
    return;
  }
  const bool valid = t >= 0 && static_cast<std::size_t>(t) < classes;
  // read before the barriers of block_max: dlogits may be logits, written after them
  const float z_target = threadIdx.x == 0 && valid ? detail::widen(z[t]) : 0.0f;
  const std::size_t packs = classes / V;
  float m = -INFINITY, s = 0;  // running max and sum of exp(z - m) of this thread's entries
  for (std::size_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const detail::Pack<float, V> v = detail::load_widened<V>(z + p * V);
    float pack_max = v.v[0];
#pragma unroll
    for (int j = 1; j < V; ++j) pack_max = fmaxf(pack_max, v.v[j]);
    if (pack_max > m) {
      s *= expf(m - pack_max);  // 0 while m is -inf (s is 0 then too)
      m = pack_max;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) s += expf(v.v[j] - m);
  }
  const float row_max = detail::block_max(m, buf);
  const float row_sum = detail::block_sum(m == -INFINITY ? 0.0f : s * expf(m - row_max), buf);
  const float log_sum = row_max + logf(row_sum);

  const std::size_t target = valid ? static_cast<std::size_t>(t) : classes;
  for (std::size_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const detail::Pack<float, V> v = detail::load_widened<V>(z + p * V);
    detail::Pack<float, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float prob = expf(v.v[j] - log_sum);
      out.v[j] = grad_scale * (prob - (p * V + j == target ? 1.0f : 0.0f));
    }
    detail::store_narrowed<V>(dlogits + row * classes + p * V, out);
  }
  if (threadIdx.x == 0) partial[row] = valid ? log_sum - z_target : NAN;
}
/// Floats of scratch that softmax_cross_entropy_forward needs.
inline std::size_t softmax_cross_entropy_scratch(std::size_t rows) { return rows; }
/// Kernels::softmax_cross_entropy on `stream`, one launch (a block per row, 16-byte packs where
/// the rows allow them): the rows' losses into `scratch` (softmax_cross_entropy_scratch(rows)
/// floats), then their sum into loss_sum[0]; dlogits (rows, classes) overwritten, and may be
/// logits. No rows or no classes: loss_sum[0] = 0.
template <class T>
void softmax_cross_entropy_forward(std::size_t rows, std::size_t classes, const T* logits,
                                   const std::int32_t* targets, float grad_scale, T* dlogits,
                                   float* loss_sum, float* scratch, cudaStream_t stream) {
  if (rows == 0 || classes == 0) {
    detail::record_launch({.kernel = "cudaMemsetAsync",
                           .bytes_written = sizeof(float),
                           .kind = LaunchKind::memset,
                           .stream = stream});
    GPIPE_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(float), stream));
    return;
  }
  // One block per row; launches of at most 2^26 rows keep grid.x far inside its limit.
  constexpr std::size_t max_rows = std::size_t{1} << 26;
  constexpr int V = 16 / sizeof(T);  // 4 floats, 8 bf16
  constexpr auto packed = &softmax_cross_entropy_forward_kernel<V, T>;
  constexpr auto scalar = &softmax_cross_entropy_forward_kernel<1, T>;
  for (std::size_t first = 0; first < rows; first += max_rows) {
    const std::size_t count = std::min(rows - first, max_rows);
    const T* z = logits + first * classes;
    T* dz = dlogits + first * classes;
    // the logits read (their second pass from cache: counted once), dlogits and losses written
    detail::record_kernel(
        "softmax_cross_entropy_forward_kernel", {count, classes, 0},
        5.0 * static_cast<double>(count * classes),
        detail::bytes_of<T>(count * classes) + detail::bytes_of<std::int32_t>(count),
        detail::bytes_of<T>(count * classes) + detail::bytes_of<float>(count), stream);
    if (classes % V == 0 && detail::aligned<V>(z, dz)) {
      GPIPE_CUDA_LAUNCH(packed, static_cast<unsigned>(count), detail::threads_for_row(classes / V),
                        stream)
      (count, classes, z, targets + first, grad_scale, dz, scratch + first);
    } else {
      GPIPE_CUDA_LAUNCH(scalar, static_cast<unsigned>(count), detail::threads_for_row(classes),
                        stream)
      (count, classes, z, targets + first, grad_scale, dz, scratch + first);
    }
    GPIPE_CUDA_CHECK_LAUNCH("softmax_cross_entropy_forward_kernel");
  }
  sum(rows, scratch, loss_sum, stream);
}

/// d = y - target over n elements: dy = grad_scale * 2 d (dy may be y); each block's sum of d^2
/// into partial(gridDim.x)
template <int V, class T>
__global__ void mse_forward_kernel(std::size_t n, const T* y, const float* target, float grad_scale,
                                   T* dy, float* partial) {
  __shared__ float buf[32];
  const float scale2 = 2.0f * grad_scale;
  float acc = 0;
  const std::size_t packs = n / V;
  for (std::size_t p = detail::global_thread(); p < packs; p += detail::grid_threads()) {
    const detail::Pack<float, V> yv = detail::load_widened<V>(y + p * V);
    const detail::Pack<float, V> tv = detail::load_pack<V>(target + p * V);
    detail::Pack<float, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = yv.v[j] - tv.v[j];
      acc += d * d;
      out.v[j] = scale2 * d;
    }
    detail::store_narrowed<V>(dy + p * V, out);
  }
  for (std::size_t i = packs * V + detail::global_thread(); i < n; i += detail::grid_threads()) {
    const float d = detail::widen(y[i]) - target[i];
    acc += d * d;
    dy[i] = detail::narrow<T>(scale2 * d);
  }
  acc = detail::block_sum(acc, buf);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
/// The most blocks mse_forward launches; each writes one partial sum, so this is its scratch.
inline constexpr unsigned mse_max_blocks = 1024;
/// Floats of scratch that mse_forward needs.
inline std::size_t mse_scratch() { return mse_max_blocks; }
/// Kernels::mse on `stream`: each block's sum of (y - target)^2 into `scratch` (mse_scratch()
/// floats), then their sum into loss_sum[0]; dy(n) overwritten, and may be y. n == 0:
/// loss_sum[0] = 0.
template <class T>
void mse_forward(std::size_t n, const T* y, const float* target, float grad_scale, T* dy,
                 float* loss_sum, float* scratch, cudaStream_t stream) {
  if (n == 0) {
    detail::record_launch({.kernel = "cudaMemsetAsync",
                           .bytes_written = sizeof(float),
                           .kind = LaunchKind::memset,
                           .stream = stream});
    GPIPE_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(float), stream));
    return;
  }
  const bool vectorized = detail::aligned<4>(y, target, dy);
  const unsigned blocks = std::min(detail::grid_for(vectorized ? n / 4 + 1 : n), mse_max_blocks);
  detail::record_kernel("mse_forward_kernel", {n, 0, 0}, 4.0 * static_cast<double>(n),
                        detail::bytes_of<T>(n) + detail::bytes_of<float>(n),
                        detail::bytes_of<T>(n) + detail::bytes_of<float>(blocks), stream);
  constexpr auto packed = &mse_forward_kernel<4, T>;
  constexpr auto scalar = &mse_forward_kernel<1, T>;
  if (vectorized) {
    GPIPE_CUDA_LAUNCH(packed, blocks, detail::block_size, stream)
    (n, y, target, grad_scale, dy, scratch);
  } else {
    GPIPE_CUDA_LAUNCH(scalar, blocks, detail::block_size, stream)
    (n, y, target, grad_scale, dy, scratch);
  }
  GPIPE_CUDA_CHECK_LAUNCH("mse_forward_kernel");
  sum(blocks, scratch, loss_sum, stream);
}

}  // namespace gpipe::cuda
