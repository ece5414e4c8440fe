#pragma once
// gpipe::cuda::KernelContext<float>: the CUDA backend's kernel context, the same members with the
// same meaning as gpipe::host::KernelContext<float> (see gpipe/backend/host/kernels.hpp):
// primitives only, a layer's own kernels (ReLU, GELU, LayerNorm, attention, embedding) being its
// LayerKernels specialization in layers/. Every operation is enqueued on the virtual device's
// compute stream and returns at once; pointers are device memory of that device (copy also accepts
// memory of other GPUs). The backend hands each piece of work the context of the work's device,
// with that device's GPU current.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "gpipe/backend/cuda/device.cuh"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels/bias.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/kernels/gemm.cuh"
#include "gpipe/backend/cuda/kernels/layer_norm.cuh"
#include "gpipe/backend/cuda/kernels/linear.cuh"
#include "gpipe/backend/cuda/kernels/loss.cuh"
#include "gpipe/backend/cuda/kernels/optimizer.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"

#if GPIPE_CUDA_NCCL
#include <nccl.h>
#endif

namespace gpipe::cuda {

class Backend;

/// The CUDA backend's kernel context for activations of type T: float (below) or bf16
/// (kernels_bf16.cuh). A layer's kernels written once for both precisions specialize
/// `LayerKernels<MyOp, cuda::KernelContext<T>>`.
template <class T>
class KernelContext;
template <>
class KernelContext<bf16>;

/// The CUDA backend's kernel context for one virtual device: the primitives of
/// `gpipe::kernel_context`, with the meaning of `gpipe::host::KernelContext<float>`'s. Each
/// operation is enqueued on the device's compute stream (stream()) and returns before the GPU has
/// run it; pointers are device memory of this device's GPU unless a member says otherwise. Only the
/// Backend makes one, and hands it to each piece of work with the device's GPU current. A launch
/// that fails throws `gpipe::Error` at once; a fault inside a kernel surfaces at
/// Backend::synchronize().
template <>
class KernelContext<float> {
 public:
  /// Element type of every primitive's arrays: the kernels compute in FP32.
  using value_type = float;

  /// Index of the virtual device (0..K-1) whose work this context issues.
  std::size_t device() const { return s_->index; }
  /// CUDA device ordinal of the GPU this virtual device runs on (several may share one).
  int gpu() const { return s_->gpu->id; }
  /// The device's compute stream: every primitive is enqueued on it, and a layer's own kernels (its
  /// `LayerKernels` specialization) must be launched on it to stay in the device's order.
  cudaStream_t stream() const { return s_->compute; }
  /// The device's copy stream, on which receive() runs peer copies and NCCL receives from other
  /// GPUs; receive() orders it against stream() with events.
  cudaStream_t copy_stream() const { return s_->copy; }
  /// The device's cuBLAS handle: bound to stream(), in the math mode of BackendOptions::tf32.
  cublasHandle_t blas() const { return s_->blas; }
  /// `floats` of kernel scratch, valid for work enqueued on the compute stream until the next
  /// call (growing it frees the old block in stream order), for the primitives below and for a
  /// layer's own kernels (LayerNorm's weight gradient). Not counted in memory_stats.
  float* scratch(std::size_t floats) {
    return detail::grow_scratch(*s_, s_->scratch, s_->scratch_floats, floats);
  }
  /// The device's context for bf16 activations (gpipe::MixedBf16): the same device, stream and
  /// cuBLAS handle, made on first use (gpipe/backend/cuda/kernels_bf16.cuh).
  KernelContext<bf16>& bf16_context();

  /// C(m, n) = alpha op(A) op(B) + beta C, row-major
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
            const float* a, const float* b, float beta, float* c) {
    cuda::gemm(s_->blas, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, s_->compute);
  }
  /// y (rows, out) = x (rows, in) W^T + b (out), W (out, in) row-major, y overwritten: Linear's
  /// forward as one cuBLASLt GEMM that adds b in its epilogue (kernels/linear.cuh), or gemm then
  /// bias_add where cuBLASLt has no algorithm for it.
  void linear_forward(std::size_t rows, std::size_t in, std::size_t out, const float* x,
                      const float* w, const float* b, float* y) {
    if (linear_forward_lt(*s_, rows, in, out, x, w, b, y)) return;
    gemm(false, true, rows, out, in, 1, x, w, 0, y);
    bias_add(rows, out, b, y);
  }
  /// dx (rows, in) = (dy (rows, out) W) * GELUTanh'(pre (rows, in)), overwritten: the input
  /// gradient through a GELUTanh and the Linear after it, as one cuBLASLt GEMM with GELU's
  /// derivative in its epilogue (kernels/linear.cuh). False, with nothing enqueued, where
  /// cuBLASLt cannot.
  bool linear_backward_input_gelu_tanh(std::size_t rows, std::size_t in, std::size_t out,
                                       const float* dy, const float* w, const float* pre,
                                       float* dx) {
    return linear_backward_input_gelu_tanh_lt(*s_, rows, in, out, dy, w, pre, dx);
  }
  /// dW (out, in) += dy^T x and db (out) += the column sums of dy (rows, out), x (rows, in):
  /// Linear's weight gradient as one cuBLASLt GEMM that sums dy's columns in its epilogue
  /// (kernels/linear.cuh; db accumulated, deterministic), or gemm then bias_grad where cuBLASLt
  /// has no algorithm for it. May grow the context's scratch.
  void linear_backward_weight(std::size_t rows, std::size_t in, std::size_t out, const float* dy,
                              const float* x, float* dw, float* db) {
    if (linear_backward_weight_lt(*s_, rows, in, out, dy, x, dw, db, scratch(out))) return;
    gemm(true, false, out, in, rows, 1, dy, x, 1, dw);
    bias_grad(rows, out, dy, db);
  }
  /// y(rows, cols) += bias(cols), broadcast over the rows.
  void bias_add(std::size_t rows, std::size_t cols, const float* bias, float* y) {
    bias_add_forward(rows, cols, bias, y, s_->compute);
  }
  /// db(cols) += column sums of dy(rows, cols): accumulated, not overwritten. Deterministic (fixed
  /// order, no atomics); may grow the context's scratch.
  void bias_grad(std::size_t rows, std::size_t cols, const float* dy, float* db) {
    bias_grad_backward(rows, cols, dy, db, scratch(bias_grad_scratch(rows, cols)), s_->compute);
  }
  /// y(n) = a + b; y may alias a or b.
  void add(std::size_t n, const float* a, const float* b, float* y) {
    cuda::add(n, a, b, y, s_->compute);
  }
  /// y(n) += x.
  void accumulate(std::size_t n, const float* x, float* y) {
    cuda::accumulate(n, x, y, s_->compute);
  }
  /// dst <- src, device to device; src may be on another GPU (a peer copy).
  void copy(std::size_t n, const float* src, float* dst) {
    copy_bytes(n * sizeof(float), src, dst);
  }
  /// dst(n) = value.
  void fill(std::size_t n, float value, float* dst) { cuda::fill(n, value, dst, s_->compute); }
  /// x(n) *= alpha.
  void scale(std::size_t n, float alpha, float* x) { cuda::scale(n, alpha, x, s_->compute); }
  /// out[0] (one double of this device's memory) = the sum of x(n)'s squares in double, in the
  /// fixed order of gpipe::detail::squares_chunk (backend/common.hpp): the host's bits.
  void sum_of_squares(std::size_t n, const float* x, double* out) {
    const std::size_t chunks =
        (n + gpipe::detail::squares_chunk - 1) / gpipe::detail::squares_chunk;
    // doubles in the float scratch (256-byte aligned), at least one
    auto* chunk_sums = reinterpret_cast<double*>(scratch(2 * std::max<std::size_t>(chunks, 1)));
    cuda::sum_of_squares(n, x, out, chunk_sums, s_->compute);
  }

  /// dst(n) on this device <- host_src(n) in host memory (pageable or not), in stream order,
  /// through pinned staging blocks: host_src may be reused as soon as upload returns. While the
  /// device is captured into a CUDA graph, host_src must be pinned memory (cudaHostAlloc)
  /// and is read by each launch of the graph instead.
  template <class U>
  void upload(std::size_t n, const U* host_src, U* dst) {
    const auto* src = reinterpret_cast<const unsigned char*>(host_src);
    auto* out = reinterpret_cast<unsigned char*>(dst);
    record_copy("upload", n * sizeof(U), LaunchKind::host_copy);
    if (s_->capturing) {
      require_pinned(host_src, "upload from");
      GPIPE_CUDA_CHECK(
          cudaMemcpyAsync(out, src, n * sizeof(U), cudaMemcpyHostToDevice, s_->compute));
      return;
    }
    through_staging(n * sizeof(U), [&](void* block, std::size_t at, std::size_t chunk) {
      std::memcpy(block, src + at, chunk);
      GPIPE_CUDA_CHECK(
          cudaMemcpyAsync(out + at, block, chunk, cudaMemcpyHostToDevice, s_->compute));
    });
  }
  /// host_dst(n) in host memory <- src(n) on this device, in stream order: host_dst holds the data
  /// only once the backend has synchronized (a host function on the stream copies each staged block
  /// there), so it must outlive that. While the device is captured into a CUDA graph, host_dst
  /// must be pinned memory, written by each launch of the graph.
  template <class U>
  void download(std::size_t n, const U* src, U* host_dst) {
    const auto* in = reinterpret_cast<const unsigned char*>(src);
    auto* out = reinterpret_cast<unsigned char*>(host_dst);
    record_copy("download", n * sizeof(U), LaunchKind::host_copy);
    if (s_->capturing) {
      require_pinned(host_dst, "download to");
      GPIPE_CUDA_CHECK(
          cudaMemcpyAsync(out, in, n * sizeof(U), cudaMemcpyDeviceToHost, s_->compute));
      return;
    }
    through_staging(n * sizeof(U), [&](void* block, std::size_t at, std::size_t chunk) {
      GPIPE_CUDA_CHECK(cudaMemcpyAsync(block, in + at, chunk, cudaMemcpyDeviceToHost, s_->compute));
      // The stream copies the block on to host_dst when it gets there.
      auto* job = new HostCopy{block, out + at, chunk, s_->downloads_abandoned};
      const cudaError_t error = cudaLaunchHostFunc(s_->compute, &HostCopy::run, job);
      if (error != cudaSuccess) delete job;
      GPIPE_CUDA_CHECK(error);
    });
  }

  /// logits (rows, classes), targets (rows) class ids in [0, classes) or ignore_index (-100):
  /// loss_sum[0] = sum over the rows not ignored of -log softmax(logits_r)[t_r] (one float of
  /// device memory, overwritten), dlogits (rows, classes) = grad_scale (softmax - onehot(t)), 0 on
  /// an ignored row, overwritten. Float throughout (the host sums in double); any other target out
  /// of range gives a NaN loss.
  void softmax_cross_entropy(std::size_t rows, std::size_t classes, const float* logits,
                             const std::int32_t* targets, float grad_scale, float* dlogits,
                             float* loss_sum) {
    softmax_cross_entropy_forward(rows, classes, logits, targets, grad_scale, dlogits, loss_sum,
                                  scratch(softmax_cross_entropy_scratch(rows)), s_->compute);
  }
  /// y, target (n): loss_sum[0] = sum of (y - target)^2 (overwritten), dy(n) = grad_scale 2
  /// (y - target) (overwritten).
  void mse(std::size_t n, const float* y, const float* target, float grad_scale, float* dy,
           float* loss_sum) {
    mse_forward(n, y, target, grad_scale, dy, loss_sum, scratch(mse_scratch()), s_->compute);
  }
  /// torch.optim.SGD's step on p(n) with gradient g(n), in place: d = g + weight_decay p; when
  /// momentum != 0, momentum_buf(n) = first_step ? d : momentum momentum_buf + (1 - dampening) d
  /// and d = nesterov ? d + momentum momentum_buf : momentum_buf; then p -= lr d. momentum_buf is
  /// not touched when momentum is 0, and not read on the first step.
  void sgd_update(std::size_t n, float* p, const float* g, float* momentum_buf, double lr,
                  double momentum, double dampening, double weight_decay, bool nesterov,
                  bool first_step) {
    cuda::sgd_update(n, p, g, momentum_buf, lr, momentum, dampening, weight_decay, nesterov,
                     first_step, s_->compute);
  }
  /// torch.optim.AdamW's step on p(n) with gradient g(n), in place, m and v (n) the moment
  /// estimates, `step` the 1-based step t: p *= 1 - lr weight_decay; m += (g - m)(1 - beta1); v =
  /// beta2 v + (1 - beta2) g^2; p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
  void adamw_update(std::size_t n, float* p, const float* g, float* m, float* v, double lr,
                    double beta1, double beta2, double eps, double weight_decay, std::size_t step) {
    cuda::adamw_update(n, p, g, m, v, lr, beta1, beta2, eps, weight_decay, step, s_->compute);
  }
  /// adamw_update over all n parameters in one launch (gpipe::has_adamw_ranges): weight_decay
  /// only in the `ranges` that decay (in order, covering [0, n); else gpipe::Error); where p_bf16
  /// is not null, p_bf16(n) = the updated p rounded to bf16 in the same pass.
  void adamw_update_ranges(std::size_t n, float* p, const float* g, float* m, float* v,
                           std::span<const DecayRange> ranges, double lr, double beta1,
                           double beta2, double eps, double weight_decay, std::size_t step,
                           bf16* p_bf16) {
    cuda::adamw_update_ranges(n, p, g, m, v, ranges, lr, beta1, beta2, eps, weight_decay, step,
                              p_bf16, s_->compute);
  }

  /// The transport's half of a stage-to-stage hand-over (gpipe::transport::CudaHandOver): dst (n)
  /// on this device <- src (n) on the sender's, after everything enqueued on this device's compute
  /// stream so far (which includes the wait for the sender's event), and before everything enqueued
  /// after. On one GPU: a device-to-device copy on the compute stream. Across GPUs: a peer copy,
  /// or an NCCL send/recv pair when the backend uses NCCL, on the copy stream.
  template <class U>
  void receive(std::size_t n, const U* src, U* dst) {
    const std::size_t bytes = n * sizeof(U);
    if (bytes == 0) return;
    record_copy("receive", bytes, LaunchKind::device_copy);
    const int src_gpu = s_->multi_gpu ? detail::gpu_of(src) : gpu();
    if (src_gpu == gpu()) {
      GPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_->compute));
      return;
    }
    GPIPE_CUDA_CHECK(cudaEventRecord(s_->ready, s_->compute));
    GPIPE_CUDA_CHECK(cudaStreamWaitEvent(s_->copy, s_->ready, 0));
    if (s_->nccl) {
      nccl_receive(bytes, src, src_gpu, dst);
    } else {
      GPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, gpu(), src, src_gpu, bytes, s_->copy));
    }
    GPIPE_CUDA_CHECK(cudaEventRecord(s_->done, s_->copy));
    GPIPE_CUDA_CHECK(cudaStreamWaitEvent(s_->compute, s_->done, 0));
  }

 private:
  // Moves `bytes` between host and device memory through the pinned staging blocks, in stream
  // order: move(block, offset, chunk) enqueues each block's share, and the block returns to the
  // pool once the stream has passed its last use.
  template <class Move>
  void through_staging(std::size_t bytes, Move move) {
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t chunk = std::min(bytes - done, detail::HostStaging::block_bytes);
      detail::HostStaging::Block& block = s_->staging.acquire();
      move(block.data, done, chunk);
      s_->staging.release(block, s_->compute);
      done += chunk;
    }
  }
  friend class Backend;
  explicit KernelContext(detail::DeviceState& state) : s_(&state) {}

  // A graph replays a copy with the addresses it captured: host memory that is not pinned would
  // be copied synchronously at capture, and not at launch.
  static void require_pinned(const void* host, std::string_view what) {
    cudaPointerAttributes attributes{};
    const bool pinned = cudaPointerGetAttributes(&attributes, host) == cudaSuccess &&
                        attributes.type == cudaMemoryTypeHost;
    (void)cudaGetLastError();
    if (!pinned)
      throw Error("gpipe: a CUDA graph cannot capture an " + std::string(what) +
                  " host memory that is not pinned");
  }

  // The launch record of a copy of `bytes` (read once, written once) on the compute stream.
  void record_copy(std::string_view name, std::size_t bytes, LaunchKind kind) const {
    const auto b = static_cast<double>(bytes);
    detail::record_launch({.kernel = name,
                           .shape = {bytes, 0, 0},
                           .bytes_read = b,
                           .bytes_written = b,
                           .kind = kind,
                           .stream = s_->compute});
  }

  struct HostCopy {
    const void* src;
    void* dst;
    std::size_t bytes;
    std::shared_ptr<std::atomic<bool>> abandoned;  // DeviceState::downloads_abandoned
    static void CUDART_CB run(void* job) {
      auto* self = static_cast<HostCopy*>(job);
      if (!self->abandoned->load(std::memory_order_acquire))
        std::memcpy(self->dst, self->src, self->bytes);
      delete self;
    }
  };

  void copy_bytes(std::size_t bytes, const void* src, void* dst) {
    if (bytes == 0) return;
    record_copy("copy", bytes, LaunchKind::device_copy);
    if (s_->multi_gpu) {
      const int src_gpu = detail::gpu_of(src), dst_gpu = detail::gpu_of(dst);
      if (src_gpu != dst_gpu) {
        GPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_gpu, src, src_gpu, bytes, s_->compute));
        return;
      }
    }
    GPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_->compute));
  }

  /// NCCL send on the sender GPU's send stream, receive on this device's copy stream, as one
  /// group; the sender's buffer is free once both have finished.
  void nccl_receive(std::size_t bytes, const void* src, int src_gpu, void* dst) {
#if GPIPE_CUDA_NCCL
    detail::GpuState* sender = nullptr;
    for (detail::GpuState& g : *s_->gpus)
      if (g.id == src_gpu) sender = &g;
    if (sender == nullptr || sender->comm == nullptr)
      throw Error("gpipe: receive from GPU " + std::to_string(src_gpu) +
                  ", which has no NCCL communicator in this backend");
    GPIPE_CUDA_CHECK(cudaStreamWaitEvent(sender->send, s_->ready, 0));
    GPIPE_NCCL_CHECK(ncclGroupStart());
    const ncclResult_t sent = ncclSend(src, bytes, ncclUint8, s_->gpu->rank,
                                       static_cast<ncclComm_t>(sender->comm), sender->send);
    const ncclResult_t received = ncclRecv(dst, bytes, ncclUint8, sender->rank,
                                           static_cast<ncclComm_t>(s_->gpu->comm), s_->copy);
    GPIPE_NCCL_CHECK(ncclGroupEnd());
    GPIPE_NCCL_CHECK(sent);
    GPIPE_NCCL_CHECK(received);
    GPIPE_CUDA_CHECK(cudaEventRecord(sender->send_done, sender->send));
    GPIPE_CUDA_CHECK(cudaStreamWaitEvent(s_->compute, sender->send_done, 0));
#else
    (void)bytes, (void)src, (void)src_gpu, (void)dst;
    throw Error("gpipe: this build of the CUDA backend has no NCCL (GPIPE_CUDA_NCCL is 0)");
#endif
  }

  friend class KernelContext<bf16>;
  detail::DeviceState* s_;
  // made by bf16_context(), shared by copies of this context
  std::shared_ptr<KernelContext<bf16>> bf16_;
};

/// The float context's former name, kept for layers written outside the library, which
/// specialize `LayerKernels<MyOp, cuda::Kernels>`: the same type.
using Kernels = KernelContext<float>;
/// The bf16 context's former name, kept as `Kernels` is.
using Bf16Kernels = KernelContext<bf16>;

}  // namespace gpipe::cuda

#include "gpipe/backend/cuda/kernels_bf16.cuh"
