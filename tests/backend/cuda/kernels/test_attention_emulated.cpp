// The CUDA flash attention kernels (gpipe/backend/cuda/kernels/attention.cuh), compiled by the
// host compiler and run on the CPU emulator (tests/support/cuda_emulation/device.hpp), against
// the attention's definition evaluated whole in double (tests/support/attention_reference.hpp):
// every head-size tiling (up to 32, 64 and 128), T within one tile and over several, GPT-2's
// packing, grouped-query heads with q, k, v anywhere in a row, and document ids; float and bf16,
// bf16 of head sizes 16, 32, 48, 64 and 128 on the tensor-core kernels (the emulator's mma).
// Buffers end at an inaccessible page (a read or write past one faults), dqkv's columns outside
// the heads must keep their value, and a second backward (warps in another order) the same bits.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpipe/backend/cuda/kernels/attention.cuh"
#include "support/attention_reference.hpp"
#include "support/guarded_buffer.hpp"
#include "support/relative_error.hpp"

namespace {

using gpipe::AttentionGeometry;
using gpipe::test::AttentionProblem;
using gpipe::test::AttentionResult;
using gpipe::test::relative_error;

constexpr double untouched = 7.0;

struct Case {
  const char* name;
  AttentionGeometry g;
  bool documents;
};
const Case cases[] = {
    {"d 8, T within one tile", AttentionGeometry::packed(2, 9, 3, 8), false},
    {"d 8, T over three tiles, documents", AttentionGeometry::packed(2, 70, 2, 8), true},
    {"d 40 (tiles for 64), T over three tiles", AttentionGeometry::packed(1, 75, 2, 40), false},
    {"d 100 (tiles of 16 rows for 128), documents", AttentionGeometry::packed(1, 40, 2, 100), true},
    // 4 query heads on 2 key/value heads: k at column 1, v at 13, q at 25, 3 spare columns
    {"grouped-query heads, q, k, v anywhere", {2, 70, 4, 2, 6, 52, 25, 1, 13}, false},
    {"grouped-query heads, documents", {2, 45, 6, 2, 5, 50, 0, 30, 40}, true},
    {"one key/value head for all", {1, 50, 4, 1, 16, 96, 0, 64, 80}, true},
    // head sizes that bf16 takes to the tensor cores (attention_mma.cuh): tiles of 64 rows
    {"d 64, T over three tiles", AttentionGeometry::packed(2, 150, 2, 64), false},
    {"d 64, documents, one key/value head for two", {2, 70, 2, 1, 64, 256, 0, 128, 192}, true},
    // q, k, v at odd columns: fragments loaded one bf16 at a time
    {"d 32 (padded to 64), grouped-query heads at odd columns",
     {2, 100, 4, 2, 32, 260, 129, 1, 65},
     false},
    {"d 48 (padded to 64), grouped-query heads, documents",
     {1, 130, 6, 2, 48, 480, 0, 288, 384},
     true},
    {"d 128, grouped-query heads, documents", {2, 90, 4, 2, 128, 1024, 0, 512, 768}, true},
};

// Device buffers that end at a guard page.
class Buffers {
 public:
  template <class T>
  T* put(const std::vector<T>& v) {
    buffers_.push_back(std::make_unique<gpipe::test::GuardedBuffer>(v.size() * sizeof(T), 0));
    T* p = static_cast<T*>(buffers_.back()->data());
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  bool intact() const {
    for (const auto& b : buffers_)
      if (!b->tail_intact()) return false;
    return true;
  }

 private:
  std::vector<std::unique_ptr<gpipe::test::GuardedBuffer>> buffers_;
};

// The kernels on the problem with T storage; results widened to double. The backward runs twice,
// its second dqkv compared bit for bit with its first.
template <class T>
AttentionResult run(const AttentionProblem& p) {
  namespace cu = gpipe::cuda;
  const AttentionGeometry& g = p.g;
  const std::size_t hd = g.heads * g.head_size;
  Buffers mem;
  std::vector<T> qkv_h, dout_h;
  for (double v : p.qkv) qkv_h.push_back(T(static_cast<float>(v)));
  for (double v : p.dout) dout_h.push_back(T(static_cast<float>(v)));
  const T* qkv = mem.put(qkv_h);
  const T* dout = mem.put(dout_h);
  T* o = mem.put(std::vector<T>(g.rows() * hd, T(std::nanf(""))));
  T* dqkv = mem.put(std::vector<T>(g.rows() * g.ld, T(static_cast<float>(untouched))));
  float* lse = mem.put(std::vector<float>(g.rows() * g.heads, std::nanf("")));
  float* delta = mem.put(std::vector<float>(g.rows() * g.heads, std::nanf("")));
  const std::int32_t* document = p.documents() == nullptr ? nullptr : mem.put(p.document);
  cu::flash_attention_forward(g, qkv, o, lse, document, nullptr);
  cu::flash_attention_backward(g, qkv, o, lse, dout, dqkv, delta, document, nullptr);
  const std::vector<T> first(dqkv, dqkv + g.rows() * g.ld);
  cu::flash_attention_backward(g, qkv, o, lse, dout, dqkv, delta, document, nullptr);
  CHECK(std::memcmp(first.data(), dqkv, first.size() * sizeof(T)) == 0);
  REQUIRE_MESSAGE(mem.intact(), "a kernel wrote past a buffer");
  AttentionResult r;
  for (std::size_t i = 0; i < g.rows() * hd; ++i) r.o.push_back(float(o[i]));
  for (std::size_t i = 0; i < g.rows() * g.heads; ++i) r.lse.push_back(lse[i]);
  for (std::size_t i = 0; i < g.rows() * g.ld; ++i) r.dqkv.push_back(float(dqkv[i]));
  return r;
}

// The reference's dqkv with `untouched` outside the heads.
std::vector<double> expected_dqkv(const AttentionProblem& p, const AttentionResult& ref) {
  const AttentionGeometry& g = p.g;
  std::vector<double> out(ref.dqkv.size(), untouched);
  const std::size_t d = g.head_size;
  for (std::size_t r = 0; r < g.rows(); ++r)
    for (const auto [first, width] : {std::array<std::size_t, 2>{g.q, g.heads * d},
                                      std::array<std::size_t, 2>{g.k, g.kv_heads * d},
                                      std::array<std::size_t, 2>{g.v, g.kv_heads * d}})
      for (std::size_t c = first; c < first + width; ++c)
        out[r * g.ld + c] = ref.dqkv[r * g.ld + c];
  return out;
}

}  // namespace

TEST_SUITE("cuda flash attention, emulated") {
  TEST_CASE("float: the definition within float's error, deterministic, in bounds") {
    for (const Case& c : cases) {
      CAPTURE(c.name);
      const AttentionProblem p(c.g, 11, c.documents);
      const AttentionResult ref = p.reference(), got = run<float>(p);
      CHECK(relative_error(got.o, ref.o) < 1e-5);
      CHECK(relative_error(got.lse, ref.lse) < 1e-5);
      CHECK(relative_error(got.dqkv, expected_dqkv(p, ref)) < 1e-5);
    }
  }

  TEST_CASE("bf16: the definition on the bf16 values, o and dqkv rounded once") {
    // as the host's bf16 test: o and dqkv rounded once (2^-8 relative), the backward reads the
    // rounded o; lse in float
    for (const Case& c : cases) {
      CAPTURE(c.name);
      AttentionProblem p(c.g, 12, c.documents);
      for (double& v : p.qkv) v = float(gpipe::bf16(v));
      for (double& v : p.dout) v = float(gpipe::bf16(v));
      CAPTURE(gpipe::cuda::detail::mma_takes(c.g.head_size));  // on the tensor cores
      const AttentionResult ref = p.reference(), got = run<gpipe::bf16>(p);
      CHECK(relative_error(got.o, ref.o) < 1.5 / 256);
      CHECK(relative_error(got.lse, ref.lse) < 1e-5);
      CHECK(relative_error(got.dqkv, expected_dqkv(p, ref)) < 3.0 / 256);
    }
  }

  TEST_CASE("a head size beyond 128 is a gpipe::Error that names the limit") {
    const AttentionGeometry g = AttentionGeometry::packed(1, 4, 1, 129);
    std::vector<float> qkv(g.rows() * g.ld), o(g.rows() * 129), lse(g.rows());
    try {
      gpipe::cuda::flash_attention_forward(g, qkv.data(), o.data(), lse.data(), nullptr, nullptr);
      FAIL("no error");
    } catch (const gpipe::Error& e) {
      CHECK(std::string(e.what()).find("up to 128") != std::string::npos);
    }
  }
}
