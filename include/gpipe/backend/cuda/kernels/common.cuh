#pragma once
// What the CUDA kernels share: packed (16-byte) loads, grid-stride loops, warp and block sums,
// the launch macro. Kernels are templates (on the pack width V), so that a header-only library
// may define them in every translation unit that includes it.
//
// The CUDA backend's headers also compile with a host compiler under GPIPE_CUDA_EMULATION, for
// tests only: tests/support/cuda_emulation/device.hpp then supplies threadIdx, __syncthreads,
// __shfl_xor_sync and GPIPE_CUDA_LAUNCH and runs each launch on the CPU thread by thread, and
// tests/support/cuda_emulation.hpp the CUDA runtime, cuBLAS and NCCL around it, so that
// the kernels and the backend are tested where no GPU is present.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/common.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/linkage.cuh"
#include "gpipe/model/precision.hpp"

#ifndef GPIPE_CUDA_LAUNCH
/// `GPIPE_CUDA_LAUNCH(kernel, grid, block, stream)(args...)` is
/// `kernel<<<grid, block, 0, stream>>>(args...)`, no dynamic shared memory; the tests' CUDA
/// emulation defines its own, which runs the launch on the CPU.
#define GPIPE_CUDA_LAUNCH(kernel, grid, block, stream) kernel<<<grid, block, 0, stream>>>
#endif

namespace gpipe::cuda::detail {

inline constexpr int block_size = 256;

// Pack<T, V>: V consecutive elements, aligned so that one instruction moves them (V = 4 floats:
// a 16-byte load).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <int V, class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& pack) {
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

// Whether every pointer may be read in V-wide packs.
template <int V, class... T>
bool aligned(const T*... p) {
  return ((reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * V) == 0) && ...);
}

// Blocks for a grid-stride loop over `items`: one item per thread, capped (the loop covers the
// rest).
inline unsigned grid_for(std::size_t items, int block = block_size) {
  const std::size_t blocks = (items + static_cast<std::size_t>(block) - 1) / block;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, std::size_t{1} << 20));
}

__device__ __forceinline__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

// Storage types of the kernels' arrays: float, and gpipe::bf16 (gpipe::MixedBf16's activations),
// which every kernel widens to float on load and rounds to nearest even on store, as the host
// (gpipe/model/precision.hpp: the same bits, NaN kept quiet).
__host__ __device__ __forceinline__ float float_of_bits(std::uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
__host__ __device__ __forceinline__ std::uint32_t bits_of_float(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}
// The float value of a stored element (exact).
__host__ __device__ __forceinline__ float widen(float v) { return v; }
__host__ __device__ __forceinline__ float widen(bf16 v) {
  return float_of_bits(static_cast<std::uint32_t>(v.bits) << 16);
}
// A float stored as T: itself, or rounded to the nearest bf16 (ties to even).
template <class T>
__host__ __device__ __forceinline__ T narrow(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else {
    static_assert(std::is_same_v<T, bf16>, "gpipe: CUDA kernels store float or gpipe::bf16");
    const std::uint32_t u = bits_of_float(f);
    bf16 r;
    r.bits = (u & 0x7fffffffu) > 0x7f800000u
                 ? static_cast<std::uint16_t>((u >> 16) | 0x0040u)
                 : static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
  }
}
// A V-wide pack of T at p (aligned for Pack<T, V>), widened to float.
template <int V, class T>
__device__ __forceinline__ Pack<float, V> load_widened(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return load_pack<V>(p);
  } else {
    const Pack<T, V> v = load_pack<V>(p);
    Pack<float, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = widen(v.v[j]);
    return out;
  }
}
// p[0, V) = v stored as T (each element rounded once for bf16); p aligned for Pack<T, V>.
template <int V, class T>
__device__ __forceinline__ void store_narrowed(T* p, const Pack<float, V>& v) {
  if constexpr (std::is_same_v<T, float>) {
    store_pack<V>(p, v);
  } else {
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = narrow<T>(v.v[j]);
    store_pack<V>(p, out);
  }
}

// y[i] = f(in_0[i], in_1[i], ...) for i < n, V elements per load, f on the inputs widened to
// float and its result stored as Y (float or bf16). y may alias an input: each pack is read whole
// before it is written. The calling thread takes packs first, first + stride, ... and then the
// tail's elements likewise: a lane's share of a row that a warp holds (first = lane, stride 32).
template <int V, class F, class Y, class... In>
__device__ __forceinline__ void map_strided(std::size_t n, std::size_t first, std::size_t stride,
                                            F f, Y* y, const In*... in) {
  const std::size_t packs = n / V;
  for (std::size_t p = first; p < packs; p += stride) {
    Pack<Y, V> out;
    [&](const auto&... args) {
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = narrow<Y>(f(widen(args.v[j])...));
    }(load_pack<V>(in + p * V)...);
    store_pack<V>(y + p * V, out);
  }
  for (std::size_t i = packs * V + first; i < n; i += stride) y[i] = narrow<Y>(f(widen(in[i])...));
}
// map_strided over the whole grid (a grid-stride loop).
template <int V, class F, class Y, class... In>
__device__ __forceinline__ void map(std::size_t n, F f, Y* y, const In*... in) {
  map_strided<V>(n, global_thread(), grid_threads(), f, y, in...);
}

// Sum over a warp; every lane gets it.
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <class T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. `buf` is
// 32 elements of shared memory; the fixed tree makes the result independent of timing.
template <class T>
__device__ T block_sum(T v, T* buf) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // buf may still be read by a previous call
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? buf[lane] : T(0));
}
template <class T>
__device__ T block_max(T v, T* buf) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? buf[lane] : buf[0]);
}

// A power of two in [32, max_threads] threads, about one per element of a row of `n`.
inline int threads_for_row(std::size_t n, int max_threads = 512) {
  int threads = 32;
  while (threads < max_threads && static_cast<std::size_t>(threads) < n) threads *= 2;
  return threads;
}

}  // namespace gpipe::cuda::detail
