#pragma once
// Asynchronous copies from global to shared memory (PTX cp.async, sm_80 and later), so that a
// kernel loads its next tile while it computes on the current one. Under GPIPE_CUDA_EMULATION
// the emulator (tests/support/cuda_emulation/device.hpp) performs each group of copies only when
// a wait covers it, the latest moment a GPU may: a kernel that reads a tile before waiting for
// it reads stale data there, and fails its tests.
//
// Contract, per thread: cp_async_16 issues a copy into the thread's open group; cp_async_commit
// closes the group; cp_async_wait<N>() returns once at most the N most recent closed groups are
// still in flight. Other threads see the copied data after that wait and a __syncthreads.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/async_copy.cuh is CUDA code: compile it with nvcc"
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "gpipe's CUDA kernels need sm_80 or later (cp.async); set CMAKE_CUDA_ARCHITECTURES"
#endif

namespace gpipe::cuda::detail {

// 16 bytes from src (global memory, 16-byte aligned) to dst (shared memory, 16-byte aligned),
// or, when !fill, 16 zero bytes to dst (src not read, but a valid address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool fill) {
#ifdef GPIPE_CUDA_EMULATION
  gpipe_cuda_emulation_cp_async(dst, src, 16, fill);
#else
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(fill ? 16 : 0)
               : "memory");
#endif
}

// Closes the calling thread's group of copies.
__device__ __forceinline__ void cp_async_commit() {
#ifdef GPIPE_CUDA_EMULATION
  gpipe_cuda_emulation_cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most the N most recent of the calling thread's closed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef GPIPE_CUDA_EMULATION
  gpipe_cuda_emulation_cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace gpipe::cuda::detail
