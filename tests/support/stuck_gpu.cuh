#pragma once
// Work stuck on the GPU, for the tests of the CUDA backends' deadlines (cuda/test_errors.cu,
// mpi/test_cuda_pipeline.cu): a layer whose forward of one micro-batch holds its device's compute
// stream, as a kernel that does not end.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "tests/support/stuck_gpu.cuh is CUDA code: compile it with nvcc"
#endif

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>

#include "gpipe/cuda.cuh"
#include "support/faulty_layer.hpp"

namespace gpipe::test::stuck {

// While `armed`, the forward of the micro-batch of faulty_rows rows holds its device's compute
// stream until `released`, as a kernel that does not end: a host function on the stream, checked
// when the stream gets there, so that a CUDA graph captured unarmed holds when replayed armed.
inline std::atomic<bool> armed{false}, held{false}, released{false};

inline void CUDART_CB hold(void*) {
  if (!armed) return;
  held = true;
  while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

template <std::size_t N>
struct HoldingIdentity : ParameterFree {
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr std::size_t stash_per_row = 0;
  static constexpr std::size_t grad_stash_per_row = 0;

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    if (a.rows == faulty_rows) GPIPE_CUDA_CHECK(cudaLaunchHostFunc(ctx.stream(), &hold, nullptr));
    ctx.copy(a.rows * N, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * N, a.dy, a.dx);
  }
};

// Disarms and releases the hold when a test case ends, however it ends.
struct HoldGuard {
  HoldGuard() { armed = held = released = false; }
  ~HoldGuard() {
    armed = false;
    released = true;
  }
};

}  // namespace gpipe::test::stuck
