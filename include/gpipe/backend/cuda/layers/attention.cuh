#pragma once
// The causal attention core on the CUDA backend: the flash attention kernels of
// gpipe/backend/cuda/kernels/attention.cuh on the device's compute stream, one specialization for
// float and bf16 activations (the kernels load either, compute in float; lse and the backward's
// delta are float, master_t of both). Nothing beyond the layer's stash (lse) and workspace
// (delta) is allocated, whatever T.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/attention.cuh is CUDA code: compile it with nvcc"
#endif

#include <cstddef>
#include <cstdint>

#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/attention.cuh"
#include "gpipe/model/attention.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe {

/// The causal attention core on the CUDA backend, T float or bf16 (CausalAttentionOp's contract;
/// head sizes up to cuda::flash_attention_max_head_size, else a gpipe::Error).
template <class T>
struct LayerKernels<CausalAttentionOp, cuda::KernelContext<T>> {
  /// qkv (rows, g.ld) -> o (rows, H d) and lse (rows, H), both overwritten.
  static void forward(cuda::KernelContext<T>& k, const AttentionGeometry& g, const T* qkv, T* o,
                      float* lse, const std::int32_t* document = nullptr) {
    cuda::flash_attention_forward(g, qkv, o, lse, document, k.stream());
  }
  /// dqkv's q, k and v heads (rows, g.ld), overwritten, from the forward's qkv, o and lse and
  /// dout (rows, H d); delta (rows, H) is scratch. Deterministic.
  static void backward(cuda::KernelContext<T>& k, const AttentionGeometry& g, const T* qkv,
                       const T* o, const float* lse, const T* dout, T* dqkv, float* delta,
                       const std::int32_t* document = nullptr) {
    cuda::flash_attention_backward(g, qkv, o, lse, dout, dqkv, delta, document, k.stream());
  }
};

}  // namespace gpipe
