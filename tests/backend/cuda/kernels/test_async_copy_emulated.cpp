// Asynchronous copies to shared memory (gpipe/backend/cuda/kernels/async_copy.cuh) on the CPU
// emulator: copies and zero fills land, and only at the wait that covers their group (the
// latest moment a GPU may land them), so that a kernel that reads too early fails here.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "gpipe/backend/cuda/kernels/async_copy.cuh"

namespace {

namespace cu = gpipe::cuda;

struct alignas(16) Chunk {
  std::uint32_t v[4];
};

// Thread i copies chunk i of `in` into shared memory (zeros where i is odd) and, after waiting,
// writes it to out[i]; before[i] is what it read there before waiting (-1s were there).
__global__ void copy_kernel(const Chunk* in, Chunk* out, Chunk* before) {
  __shared__ Chunk s[64];
  const unsigned i = threadIdx.x;
  for (std::uint32_t& x : s[i].v) x = 0xffffffffu;
  cu::detail::cp_async_16(&s[i], &in[i], i % 2 == 0);
  cu::detail::cp_async_commit();
  before[i] = s[i];
  cu::detail::cp_async_wait<0>();
  __syncthreads();
  out[i] = s[63 - i];  // another thread's copy: visible after the wait and the barrier
}

// Two groups: after wait<1> the first has landed, the second not yet; after wait<0> both.
__global__ void groups_kernel(const Chunk* in, Chunk* seen) {
  __shared__ Chunk s[2];
  s[0] = Chunk{}, s[1] = Chunk{};
  cu::detail::cp_async_16(&s[0], &in[0], true);
  cu::detail::cp_async_commit();
  cu::detail::cp_async_16(&s[1], &in[1], true);
  cu::detail::cp_async_commit();
  cu::detail::cp_async_wait<1>();
  seen[0] = s[0], seen[1] = s[1];
  cu::detail::cp_async_wait<0>();
  seen[2] = s[1];
}

}  // namespace

TEST_SUITE("asynchronous copies, emulated") {
  TEST_CASE("copies and zero fills land at the wait, visible to the block after a barrier") {
    std::vector<Chunk> in(64), out(64), before(64);
    for (std::uint32_t i = 0; i < 64; ++i) in[i] = Chunk{{i, i + 1, i + 2, i + 3}};
    GPIPE_CUDA_LAUNCH(copy_kernel, 1, 64, nullptr)(in.data(), out.data(), before.data());
    for (std::uint32_t i = 0; i < 64; ++i) {
      const std::uint32_t from = 63 - i;
      for (int j = 0; j < 4; ++j) {
        REQUIRE(out[i].v[j] == (from % 2 == 0 ? in[from].v[j] : 0u));
        REQUIRE(before[i].v[j] == 0xffffffffu);
      }
    }
  }

  TEST_CASE("a wait lands the older groups and leaves the most recent ones in flight") {
    std::vector<Chunk> in{Chunk{{1, 2, 3, 4}}, Chunk{{5, 6, 7, 8}}}, seen(3);
    GPIPE_CUDA_LAUNCH(groups_kernel, 1, 32, nullptr)(in.data(), seen.data());
    CHECK(seen[0].v[3] == 4u);
    CHECK(seen[1].v[0] == 0u);  // still in flight
    CHECK(seen[2].v[0] == 5u);
  }
}
