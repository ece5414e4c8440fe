// The tensor cores' bf16 mma (gpipe/backend/cuda/kernels/mma.cuh) on the CPU emulator
// (tests/support/cuda_emulation/device.hpp): fragments placed by the PTX ISA's layouts, written
// out here index by index, against a plain product in double; exact on small integers (whose
// products and sums float holds exactly), within a 16-term float sum's error on random bf16; the
// shared-memory fragment loads (ldmatrix, plain and transposed) against the same layouts; a lane
// missing from the warp, or a misaligned ldmatrix row, an error.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpipe/backend/cuda/kernels/mma.cuh"
#include "support/errors.hpp"

namespace {

namespace cu = gpipe::cuda;
using gpipe::bf16;

std::uint32_t pair(const bf16* p, int second) {
  return static_cast<std::uint32_t>(p[0].bits) | static_cast<std::uint32_t>(p[second].bits) << 16;
}

// Warp w of the block: d_w = a_w b_w + c_w, for a (16 x 16, row-major), b (16 x 8, row-major
// k x n), c and d (16 x 8) of each warp one after another; fragments placed by the layouts of
// mma.cuh's top comment. `repeat` > 1 accumulates into d that many times (d = c on the way).
__global__ void mma_kernel(const bf16* a, const bf16* b, const float* c, float* d, int repeat) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, q = 2 * (lane % 4);
  a += warp * 256, b += warp * 128, c += warp * 128, d += warp * 128;
  const std::uint32_t af[4] = {pair(a + g * 16 + q, 1), pair(a + (g + 8) * 16 + q, 1),
                               pair(a + g * 16 + q + 8, 1), pair(a + (g + 8) * 16 + q + 8, 1)};
  const std::uint32_t bf[2] = {pair(b + q * 8 + g, 8), pair(b + (q + 8) * 8 + g, 8)};
  float acc[4] = {c[g * 8 + q], c[g * 8 + q + 1], c[(g + 8) * 8 + q], c[(g + 8) * 8 + q + 1]};
  for (int i = 0; i < repeat; ++i) cu::detail::mma_16x8x16(acc, af, bf, acc);
  d[g * 8 + q] = acc[0], d[g * 8 + q + 1] = acc[1];
  d[(g + 8) * 8 + q] = acc[2], d[(g + 8) * 8 + q + 1] = acc[3];
}

// d_t = a b_t + c_t for the two n-tiles t of a 16 x 16 b (b_0 at b, b_1 at b + 128, each 16 x 8
// row-major k x n; c_t, d_t likewise): a from shared memory by load_a, b by load_b_pair from its
// transpose or by load_b_pair_transposed from itself, each at an offset inside its array; one
// warp.
__global__ void mma_shared_kernel(const bf16* a, const bf16* b, const float* c, float* d,
                                  bool transposed) {
  struct alignas(16) Tiles {
    bf16 a[20][24], b[24][24];
  };
  __shared__ Tiles s;
  for (int i = static_cast<int>(threadIdx.x); i < 256; i += 32) {
    s.a[i / 16 + 4][i % 16 + 8] = a[i];
    const int k = i % 128 / 8, n = 8 * (i / 128) + i % 8;
    if (transposed)
      s.b[k + 3][n + 8] = b[i];
    else
      s.b[n + 5][k + 8] = b[i];
  }
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, q = 2 * (lane % 4);
  std::uint32_t af[4], bf[2][2];
  cu::detail::load_a<24>(af, &s.a[0][0], 4, 8);
  if (transposed)
    cu::detail::load_b_pair_transposed<24>(bf[0], bf[1], &s.b[0][0], 3, 8);
  else
    cu::detail::load_b_pair<24>(bf[0], bf[1], &s.b[0][0], 5, 8);
  for (int t = 0; t < 2; ++t) {
    const float* ct = c + 128 * t;
    float* dt = d + 128 * t;
    float acc[4] = {ct[g * 8 + q], ct[g * 8 + q + 1], ct[(g + 8) * 8 + q], ct[(g + 8) * 8 + q + 1]};
    cu::detail::mma_16x8x16(acc, af, bf[t], acc);
    dt[g * 8 + q] = acc[0], dt[g * 8 + q + 1] = acc[1];
    dt[(g + 8) * 8 + q] = acc[2], dt[(g + 8) * 8 + q + 1] = acc[3];
  }
}

// ldmatrix from rows one element past 16-byte alignment: a fault on a GPU.
__global__ void misaligned_ldmatrix_kernel(float* d) {
  struct alignas(16) Tile {
    bf16 v[32][16];
  };
  __shared__ Tile s;
  std::uint32_t r[4];
  cu::detail::ldmatrix_x4<false>(r, &s.v[threadIdx.x][1]);
  d[threadIdx.x] = static_cast<float>(r[0]);
}

// Lane 5 leaves before the mma: undefined on a GPU.
__global__ void early_exit_mma_kernel(float* d) {
  if (threadIdx.x == 5) return;
  const std::uint32_t a[4] = {}, b[2] = {};
  float acc[4] = {};
  cu::detail::mma_16x8x16(acc, a, b, acc);
  d[threadIdx.x] = acc[0];
}

struct Problem {
  std::vector<bf16> a, b;
  std::vector<float> c;
  // (warps, 16, 8) in double: repeat (a b) + c
  std::vector<double> reference(int warps, int repeat = 1) const {
    std::vector<double> d(static_cast<std::size_t>(warps) * 128);
    for (int w = 0; w < warps; ++w)
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
          double sum = 0;
          for (int k = 0; k < 16; ++k)
            sum += double(float(a[w * 256 + i * 16 + k])) * double(float(b[w * 128 + k * 8 + j]));
          d[w * 128 + i * 8 + j] = repeat * sum + c[w * 128 + i * 8 + j];
        }
    return d;
  }
};

// Small integers in [-range, range] (range > 0), else normal random values.
Problem make_problem(int warps, int range, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> integer(-range, range);
  std::normal_distribution<float> normal;
  auto value = [&] { return range > 0 ? static_cast<float>(integer(rng)) : normal(rng); };
  Problem p;
  for (int i = 0; i < warps * 256; ++i) p.a.push_back(bf16(value()));
  for (int i = 0; i < warps * 128; ++i) p.b.push_back(bf16(value()));
  for (int i = 0; i < warps * 128; ++i) p.c.push_back(range > 0 ? value() * 16 : value());
  return p;
}

}  // namespace

TEST_SUITE("tensor-core mma, emulated") {
  TEST_CASE("integer operands: d = a b + c exactly, each warp its own product") {
    const Problem p = make_problem(3, 8, 1);
    std::vector<float> d(3 * 128, std::nanf(""));
    GPIPE_CUDA_LAUNCH(mma_kernel, 1, 96, nullptr)(p.a.data(), p.b.data(), p.c.data(), d.data(), 1);
    const std::vector<double> ref = p.reference(3);
    for (std::size_t i = 0; i < d.size(); ++i) REQUIRE(double(d[i]) == ref[i]);
  }

  TEST_CASE("integer operands, accumulated: d = c, then d += a b three times") {
    const Problem p = make_problem(1, 5, 2);
    std::vector<float> d(128, std::nanf(""));
    GPIPE_CUDA_LAUNCH(mma_kernel, 1, 32, nullptr)(p.a.data(), p.b.data(), p.c.data(), d.data(), 3);
    const std::vector<double> ref = p.reference(1, 3);
    for (std::size_t i = 0; i < d.size(); ++i) REQUIRE(double(d[i]) == ref[i]);
  }

  TEST_CASE("random bf16 operands: within a 16-term float sum's rounding") {
    const Problem p = make_problem(2, 0, 3);
    std::vector<float> d(2 * 128, std::nanf(""));
    GPIPE_CUDA_LAUNCH(mma_kernel, 1, 64, nullptr)(p.a.data(), p.b.data(), p.c.data(), d.data(), 1);
    const std::vector<double> ref = p.reference(2);
    for (std::size_t i = 0; i < d.size(); ++i) {
      // each of the 16 sums rounds by at most half an ulp of a partial sum, bounded by the sum
      // of magnitudes
      double magnitude = std::abs(double(p.c[i]));
      const std::size_t w = i / 128, row = i % 128 / 8, col = i % 8;
      for (std::size_t k = 0; k < 16; ++k)
        magnitude += std::abs(double(float(p.a[w * 256 + row * 16 + k])) *
                              double(float(p.b[w * 128 + k * 8 + col])));
      CHECK(std::abs(double(d[i]) - ref[i]) <= 16 * std::ldexp(magnitude, -24));
    }
  }

  TEST_CASE("fragments loaded from shared memory by ldmatrix, plain and transposed") {
    // two warps' a, b and c: warp 0's a times the b of both, as one 16 x 16 b
    const Problem p = make_problem(2, 8, 4);
    Problem two = p;
    std::copy(p.a.begin(), p.a.begin() + 256, two.a.begin() + 256);
    const std::vector<double> ref = two.reference(2);
    for (const bool transposed : {false, true}) {
      CAPTURE(transposed);
      std::vector<float> d(256, std::nanf(""));
      GPIPE_CUDA_LAUNCH(mma_shared_kernel, 1, 32, nullptr)
      (p.a.data(), p.b.data(), p.c.data(), d.data(), transposed);
      for (std::size_t i = 0; i < d.size(); ++i) REQUIRE(double(d[i]) == ref[i]);
    }
  }

  TEST_CASE("pack_bf16 rounds each half to nearest even") {
    const float lo = 1.0f + std::ldexp(1.0f, -8), hi = -3.0f - std::ldexp(3.0f, -9);
    const std::uint32_t r = cu::detail::pack_bf16(lo, hi);
    CHECK((r & 0xffffu) == bf16(lo).bits);
    CHECK((r >> 16) == bf16(hi).bits);
    CHECK(float(bf16(lo)) == 1.0f);  // a tie, to even
  }

  TEST_CASE("an mma that a lane has left, a warp of 16 lanes, a misaligned ldmatrix: errors") {
    std::vector<float> d(128);
    const Problem p = make_problem(1, 2, 5);
    CHECK(gpipe::test::contains(gpipe::test::error_of([&] {
                                  GPIPE_CUDA_LAUNCH(early_exit_mma_kernel, 1, 32, nullptr)
                                  (d.data());
                                }),
                                "mma.sync.aligned.m16n8k16 in warp 0 of block (0, 0, 0) names "
                                "lane 5, which has exited"));
    CHECK(gpipe::test::contains(gpipe::test::error_of([&] {
                                  GPIPE_CUDA_LAUNCH(mma_kernel, 1, 16, nullptr)
                                  (p.a.data(), p.b.data(), p.c.data(), d.data(), 1);
                                }),
                                "which the block does not have"));
    CHECK(gpipe::test::contains(gpipe::test::error_of([&] {
                                  GPIPE_CUDA_LAUNCH(misaligned_ldmatrix_kernel, 1, 32, nullptr)
                                  (d.data());
                                }),
                                "not 16-byte aligned"));
  }
}
