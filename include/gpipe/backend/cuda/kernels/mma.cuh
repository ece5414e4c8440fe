#pragma once
// The tensor cores' warp-level bf16 matrix multiply-accumulate (PTX
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, sm_80 and later) and the fragment loads
// from shared memory (PTX ldmatrix) that the attention kernels build on. Under
// GPIPE_CUDA_EMULATION both are the emulator's warp-collective operations
// (tests/support/cuda_emulation/device.hpp).
//
// Fragment layouts, as the PTX ISA gives them for this shape: lane = 4 g + q (g = lane / 4 the
// lane's group, q = lane % 4 its place in the group); a 32-bit register holds two bf16, the one
// of the lower column (A) or row (B) in its low half.
//   A (16 x 16, m x k, row-major):  a[0] = A[g][2q, 2q+1]        a[1] = A[g+8][2q, 2q+1]
//                                   a[2] = A[g][2q+8, 2q+9]      a[3] = A[g+8][2q+8, 2q+9]
//   B (16 x 8, k x n, "col"):       b[0] = B[2q, 2q+1][g]        b[1] = B[2q+8, 2q+9][g]
//   C, D (16 x 8, m x n, float):    c[0], c[1] = C[g][2q, 2q+1]  c[2], c[3] = C[g+8][2q, 2q+1]
// So a row of C lives in the 4 lanes of one group (xor shuffles by 1 and 2 combine it), and C's
// registers of two neighbouring n-tiles (columns 16 j .. 16 j + 15), rounded to bf16 and paired,
// are the A fragment of k-step j of a following product (the flash attention's P V).

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/mma.cuh is CUDA code: compile it with nvcc"
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "gpipe's CUDA kernels need sm_80 or later (bf16 mma.sync); set CMAKE_CUDA_ARCHITECTURES"
#endif

#include <cstdint>

#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/model/precision.hpp"

namespace gpipe::cuda::detail {

// d (16 x 8) = a (16 x 16) b (16 x 8) + c, bf16 products accumulated in float, over the warp's
// fragments (layouts above). All 32 lanes of the warp call it together (warp-collective); d may
// be c.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const std::uint32_t (&a)[4],
                                            const std::uint32_t (&b)[2], const float (&c)[4]) {
#ifdef GPIPE_CUDA_EMULATION
  gpipe_cuda_emulation_mma_m16n8k16_bf16(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

// Two floats rounded to bf16 (nearest even) in one register: lo in the low half. On the GPU one
// cvt.rn.bf16x2.f32 (its NaN is the canonical one, narrow's keeps the payload; the same bits
// otherwise).
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
#ifdef __CUDA_ARCH__
  std::uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<std::uint32_t>(narrow<bf16>(lo).bits) |
         (static_cast<std::uint32_t>(narrow<bf16>(hi).bits) << 16);
#endif
}

// r[i] (i < 4) = a lane's register of 8 x 8 matrix i, whose rows lanes 8 i .. 8 i + 7 address
// (8 bf16 each, 16-byte aligned, in shared memory): lane 4 g + q gets elements 2q, 2q+1 of row g,
// or Transposed, rows 2q, 2q+1 of column g. PTX ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16;
// warp-collective like the mma.
template <bool Transposed>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const bf16* row) {
#ifdef GPIPE_CUDA_EMULATION
  gpipe_cuda_emulation_ldmatrix_x4(r, row, Transposed);
#else
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Transposed) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
#endif
}

// The fragment loads below read tiles of bf16 in shared memory, row-major, rows LD elements apart
// (LD a multiple of 8, so that every row starts 16-byte aligned), at offsets that are multiples
// of 8. All lanes of the warp call them together.

// a (16 x 16) = s[r0 + i][k0 + j]: an A fragment.
template <int LD>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const bf16* s, int r0, int k0) {
  const int lane = static_cast<int>(threadIdx.x % 32), i = lane / 8;
  ldmatrix_x4<false>(a, s + (r0 + 8 * (i % 2) + lane % 8) * LD + k0 + 8 * (i / 2));
}

// b0, b1 (16 x 8 each) = s[n0 + j][k0 + i], s[n0 + 8 + j][k0 + i]: the B fragments of two
// neighbouring n-tiles from their transpose (n x k, as K is stored in Q K^T).
template <int LD>
__device__ __forceinline__ void load_b_pair(std::uint32_t (&b0)[2], std::uint32_t (&b1)[2],
                                            const bf16* s, int n0, int k0) {
  const int lane = static_cast<int>(threadIdx.x % 32), i = lane / 8;
  std::uint32_t r[4];
  ldmatrix_x4<false>(r, s + (n0 + 8 * (i / 2) + lane % 8) * LD + k0 + 8 * (i % 2));
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// b0, b1 (16 x 8 each) = s[k0 + i][n0 + j], s[k0 + i][n0 + 8 + j]: the B fragments of two
// neighbouring n-tiles from a k x n tile (as V is stored in P V).
template <int LD>
__device__ __forceinline__ void load_b_pair_transposed(std::uint32_t (&b0)[2],
                                                       std::uint32_t (&b1)[2], const bf16* s,
                                                       int k0, int n0) {
  const int lane = static_cast<int>(threadIdx.x % 32), i = lane / 8;
  std::uint32_t r[4];
  ldmatrix_x4<true>(r, s + (k0 + 8 * (i % 2) + lane % 8) * LD + n0 + 8 * (i / 2));
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

}  // namespace gpipe::cuda::detail
