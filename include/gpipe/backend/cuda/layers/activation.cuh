#pragma once
// ReLU, GELU and LayerNorm on the CUDA backend: the kernels of kernels/elementwise.cuh and
// kernels/layer_norm.cuh (which the kernel conformance tests check against the host's), launched
// on the context's stream; detail::CudaElementwise serves every elementwise layer (GELUTanh too).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/activation.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>
#include <cstdint>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/kernels/layer_norm.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/model/activation.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/layer_norm.hpp"

namespace gpipe::cuda {

/// stash(rows, 2) = the bits of stats(r, 1) (rstd): high half, then low half (bf16 LayerNorm).
__global__ void layer_norm_stash_rstd_kernel(std::size_t rows, const float* stats, bf16* stash) {
  for (std::size_t r = detail::global_thread(); r < rows; r += detail::grid_threads()) {
    const std::uint32_t bits = detail::bits_of_float(stats[2 * r + 1]);
    stash[2 * r].bits = static_cast<std::uint16_t>(bits >> 16);
    stash[2 * r + 1].bits = static_cast<std::uint16_t>(bits & 0xffffu);
  }
}

/// stats(rows, 2) = (mean of x's row in float, rstd from the stash's bits); one warp per row.
__global__ void layer_norm_stats_from_stash_kernel(std::size_t rows, std::size_t cols,
                                                   const float* x, const bf16* stash,
                                                   float* stats) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = detail::global_thread() / 32; r < rows; r += detail::grid_threads() / 32) {
    float sum = 0;
    for (std::size_t c = lane; c < cols; c += 32) sum += x[r * cols + c];
    sum = detail::warp_sum(sum);
    if (lane == 0) {
      stats[2 * r] = sum / static_cast<float>(cols);
      stats[2 * r + 1] = detail::float_of_bits(static_cast<std::uint32_t>(stash[2 * r].bits) << 16 |
                                               stash[2 * r + 1].bits);
    }
  }
}

}  // namespace gpipe::cuda

namespace gpipe {

namespace detail {

// The kernels of an elementwise layer op on the CUDA backend: Math's (kernels/elementwise.cuh) on
// the context's stream, for float or bf16 activations (bf16: widened on load, float math, rounded
// once on store).
template <class Math, class T>
struct CudaElementwise {
  // y(n) = Math::forward(x); y may be x.
  static void forward(cuda::KernelContext<T>& k, std::size_t n, const T* x, T* y) {
    cuda::activation_forward<Math>(n, x, y, k.stream());
  }
  // dx(n) = Math::backward(x, dy); x is the forward's input.
  static void backward(cuda::KernelContext<T>& k, std::size_t n, const T* x, const T* dy, T* dx) {
    cuda::activation_backward<Math>(n, x, dy, dx, k.stream());
  }
};

}  // namespace detail

/// ReLU's kernels on the CUDA backend: cuda::ReluMath's.
template <class T>
struct LayerKernels<ReluOp, cuda::KernelContext<T>> : detail::CudaElementwise<cuda::ReluMath, T> {};
/// GELU's (exact, erf) kernels on the CUDA backend: cuda::GeluMath's.
template <class T>
struct LayerKernels<GeluOp, cuda::KernelContext<T>> : detail::CudaElementwise<cuda::GeluMath, T> {};

/// LayerNorm's kernels on the CUDA backend (kernels/layer_norm.cuh) on (rows, cols), on the
/// context's stream, the weight gradient's partial sums in its scratch; the forward's stats (rows,
/// 2) = (mean, rstd) kept for the two backward ops.
template <>
struct LayerKernels<LayerNormOp, cuda::KernelContext<float>> {
  /// y(rows, cols) = (x - mean) rstd gamma + beta per row, rstd = 1 / sqrt(biased variance +
  /// eps); writes stats(rows, 2).
  static void forward(cuda::KernelContext<float>& k, std::size_t rows, std::size_t cols, double eps,
                      const float* x, const float* gamma, const float* beta, float* y,
                      float* stats) {
    cuda::layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats, k.stream());
  }
  /// dx(rows, cols), overwritten, from x, dy, gamma and the forward's stats.
  static void backward_input(cuda::KernelContext<float>& k, std::size_t rows, std::size_t cols,
                             const float* x, const float* dy, const float* gamma,
                             const float* stats, float* dx) {
    cuda::layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx, k.stream());
  }
  /// dgamma(cols) += sum over rows of dy xhat, dbeta(cols) += sum over rows of dy.
  static void backward_weight(cuda::KernelContext<float>& k, std::size_t rows, std::size_t cols,
                              const float* x, const float* dy, const float* stats, float* dgamma,
                              float* dbeta) {
    cuda::layer_norm_backward_weight(
        rows, cols, x, dy, stats, dgamma, dbeta,
        k.scratch(cuda::layer_norm_backward_weight_scratch(rows, cols)), k.stream());
  }
};

/// LayerNorm on bf16 activations (gpipe::MixedBf16): x and dy widened to float into the
/// context's wide() scratch, the float kernels above run there, the results rounded once. The
/// statistics stay float: a row's two stash slots hold rstd's 32 bits (high half first, as on
/// the host), and the backward ops recompute the mean from x (a float sum per row: within a few
/// float ulps of the forward's, which LayerNorm's gradient bound allows for).
template <>
struct LayerKernels<LayerNormOp, cuda::KernelContext<bf16>> {
  /// y = (x - mean) rstd gamma + beta per row, rounded to bf16; stats(rows, 2) = rstd's bits.
  static void forward(cuda::KernelContext<bf16>& k, std::size_t rows, std::size_t cols, double eps,
                      const bf16* x, const float* gamma, const float* beta, bf16* y, bf16* stats) {
    if (rows == 0 || cols == 0) return;
    const std::size_t n = k.padded(rows * cols);
    float* w = k.wide(2 * n + k.padded(2 * rows));
    k.convert(rows * cols, x, w);
    cuda::layer_norm_forward(rows, cols, eps, w, gamma, beta, w + n, w + 2 * n, k.stream());
    k.convert(rows * cols, w + n, y);
    namespace d = cuda::detail;
    d::record_kernel("layer_norm_stash_rstd_kernel", {rows, 0, 0}, 0, d::bytes_of<float>(2 * rows),
                     d::bytes_of<bf16>(2 * rows), k.stream());
    GPIPE_CUDA_LAUNCH(cuda::layer_norm_stash_rstd_kernel, cuda::detail::grid_for(rows),
                      cuda::detail::block_size, k.stream())
    (rows, w + 2 * n, stats);
    GPIPE_CUDA_CHECK_LAUNCH("layer_norm_stash_rstd_kernel");
  }
  /// dx(rows, cols), overwritten, as the float kernel computes it from the widened x and dy and
  /// the (mean, rstd) of stats_from_stash, rounded to bf16.
  static void backward_input(cuda::KernelContext<bf16>& k, std::size_t rows, std::size_t cols,
                             const bf16* x, const bf16* dy, const float* gamma, const bf16* stats,
                             bf16* dx) {
    if (rows == 0 || cols == 0) return;
    const Widened w = widen(k, rows, cols, x, dy, stats, rows * cols);
    cuda::layer_norm_backward_input(rows, cols, w.x, w.dy, gamma, w.stats, w.out, k.stream());
    k.convert(rows * cols, w.out, dx);
  }
  /// dgamma(cols) += column sums of dy xhat, dbeta(cols) += column sums of dy, in float.
  static void backward_weight(cuda::KernelContext<bf16>& k, std::size_t rows, std::size_t cols,
                              const bf16* x, const bf16* dy, const bf16* stats, float* dgamma,
                              float* dbeta) {
    if (rows == 0 || cols == 0) return;
    const Widened w = widen(k, rows, cols, x, dy, stats, 0);
    cuda::layer_norm_backward_weight(
        rows, cols, w.x, w.dy, w.stats, dgamma, dbeta,
        k.scratch(cuda::layer_norm_backward_weight_scratch(rows, cols)), k.stream());
  }

 private:
  // A backward op's float operands in the context's wide() scratch (widen() writes all but out).
  struct Widened {
    float* x;      // (rows, cols)
    float* dy;     // (rows, cols)
    float* stats;  // (rows, 2) = (mean recomputed from x, rstd from the stash)
    float* out;    // `out` floats for the op's result
  };
  static Widened widen(cuda::KernelContext<bf16>& k, std::size_t rows, std::size_t cols,
                       const bf16* x, const bf16* dy, const bf16* stash, std::size_t out) {
    const std::size_t n = k.padded(rows * cols), s = k.padded(2 * rows);
    float* w = k.wide(2 * n + s + out);
    const Widened widened{w, w + n, w + 2 * n, w + 2 * n + s};
    k.convert(rows * cols, x, widened.x);
    k.convert(rows * cols, dy, widened.dy);
    namespace d = cuda::detail;
    d::record_kernel("layer_norm_stats_from_stash_kernel", {rows, cols, 0},
                     static_cast<double>(rows * cols),
                     d::bytes_of<float>(rows * cols) + d::bytes_of<bf16>(2 * rows),
                     d::bytes_of<float>(2 * rows), k.stream());
    GPIPE_CUDA_LAUNCH(cuda::layer_norm_stats_from_stash_kernel, cuda::detail::grid_for(32 * rows),
                      cuda::detail::block_size, k.stream())
    (rows, cols, widened.x, stash, widened.stats);
    GPIPE_CUDA_CHECK_LAUNCH("layer_norm_stats_from_stash_kernel");
    return widened;
  }
};

}  // namespace gpipe
