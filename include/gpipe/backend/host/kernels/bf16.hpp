#pragma once
// float <-> bfloat16 on the host, for mixed precision (bf16 activations, fp32 master weights):
// bf16 is float's sign, 8-bit exponent and top 7 mantissa bits, kept here as its 16 bits.
//
//   to_bf16_bits(f)      one float, round to nearest, ties to even (constexpr)
//   to_bf16(n, x, y)     y(n) = x(n) rounded so, 16 floats at a time on CPUs with AVX-512 (BW),
//                        else four at a time on 16-byte packs
//   from_bf16_bits(b)    exact (a bf16 is a float whose low 16 bits are 0)
//   from_bf16(n, x, y)   y(n) = x(n), exact, 16 or four at a time likewise
//
// Rounding is gpipe::to_bf16_bits' (model/precision.hpp), here on many lanes at once: every path
// gives the same bits. The AVX-512 path is compiled for that target alone (a function attribute)
// and chosen at run time, so the library still runs on any x86-64. AVX512-BF16's vcvtneps2bf16 is
// not used: it treats denormal inputs as 0, which this does not.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gpipe/backend/host/kernels/simd.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::host {
using gpipe::from_bf16_bits;
using gpipe::to_bf16_bits;
}  // namespace gpipe::host

// Helpers live in gpipe::detail: a gpipe::host::detail would hide it from the other host headers.
namespace gpipe::detail {

using Bf16Bits4 = host::simd::BitsOf<host::simd::Pack<float>>::type;
typedef std::uint16_t Bf16Half4 __attribute__((vector_size(8)));

// to_bf16_bits on the four lanes of u (a float pack's bits).
inline Bf16Half4 to_bf16_bits(Bf16Bits4 u) {
  const Bf16Bits4 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const Bf16Bits4 nan =
      reinterpret_cast<Bf16Bits4>((u & 0x7fffffffu) > 0x7f800000u);  // all ones where NaN
  const Bf16Bits4 quiet = (u >> 16) | 0x0040u;
  return __builtin_convertvector((rounded & ~nan) | (quiet & nan), Bf16Half4);
}

}  // namespace gpipe::detail

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GPIPE_BF16_AVX512 1
namespace gpipe::detail {

// Whether this CPU runs AVX-512 F and BW (asked once).
inline bool bf16_avx512() {
  static const bool supported =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return supported;
}

// to_bf16 on 16 lanes at a time (vpmovdw narrows without saturation); returns how many it did.
__attribute__((target("avx512f,avx512bw"))) inline std::size_t to_bf16_avx512(std::size_t n,
                                                                              const float* x,
                                                                              std::uint16_t* y) {
  typedef std::uint32_t Bits16 __attribute__((vector_size(64)));
  typedef std::uint16_t Half16 __attribute__((vector_size(32)));
  const std::size_t packed = n - n % 16;
  for (std::size_t i = 0; i < packed; i += 16) {
    Bits16 u;
    std::memcpy(&u, x + i, sizeof u);
    const Bits16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const Bits16 nan = (Bits16)((u & 0x7fffffffu) > 0x7f800000u);  // all ones where NaN
    const Bits16 quiet = (u >> 16) | 0x0040u;
    const Half16 b = __builtin_convertvector((rounded & ~nan) | (quiet & nan), Half16);
    std::memcpy(y + i, &b, sizeof b);
  }
  return packed;
}

// from_bf16 on 16 lanes at a time; returns how many it did.
__attribute__((target("avx512f,avx512bw"))) inline std::size_t from_bf16_avx512(
    std::size_t n, const std::uint16_t* x, float* y) {
  typedef std::uint32_t Bits16 __attribute__((vector_size(64)));
  typedef std::uint16_t Half16 __attribute__((vector_size(32)));
  const std::size_t packed = n - n % 16;
  for (std::size_t i = 0; i < packed; i += 16) {
    Half16 b;
    std::memcpy(&b, x + i, sizeof b);
    const Bits16 u = __builtin_convertvector(b, Bits16) << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
  return packed;
}

}  // namespace gpipe::detail
#endif

namespace gpipe::host {

/// y(n) = x(n) as bf16 bits, each as to_bf16_bits rounds it.
inline void to_bf16(std::size_t n, const float* x, std::uint16_t* y) {
#ifdef GPIPE_BF16_AVX512
  if (gpipe::detail::bf16_avx512()) {
    const std::size_t done = gpipe::detail::to_bf16_avx512(n, x, y);
    n -= done, x += done, y += done;
  }
#endif
  const std::size_t packed = n - n % 4;
  for (std::size_t i = 0; i < packed; i += 4) {
    gpipe::detail::Bf16Bits4 u;
    std::memcpy(&u, x + i, sizeof u);
    const gpipe::detail::Bf16Half4 b = gpipe::detail::to_bf16_bits(u);
    std::memcpy(y + i, &b, sizeof b);
  }
  for (std::size_t j = 0; j < n % 4; ++j) y[packed + j] = to_bf16_bits(x[packed + j]);
}

/// y(n) = the floats that x(n)'s bf16 bits hold (exact).
inline void from_bf16(std::size_t n, const std::uint16_t* x, float* y) {
#ifdef GPIPE_BF16_AVX512
  if (gpipe::detail::bf16_avx512()) {
    const std::size_t done = gpipe::detail::from_bf16_avx512(n, x, y);
    n -= done, x += done, y += done;
  }
#endif
  const std::size_t packed = n - n % 4;
  for (std::size_t i = 0; i < packed; i += 4) {
    gpipe::detail::Bf16Half4 b;
    std::memcpy(&b, x + i, sizeof b);
    const auto u = __builtin_convertvector(b, gpipe::detail::Bf16Bits4) << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
  for (std::size_t j = 0; j < n % 4; ++j) y[packed + j] = from_bf16_bits(x[packed + j]);
}

/// to_bf16 into gpipe::bf16 storage.
inline void to_bf16(std::size_t n, const float* x, bf16* y) {
  to_bf16(n, x, reinterpret_cast<std::uint16_t*>(y));
}
/// from_bf16 from gpipe::bf16 storage.
inline void from_bf16(std::size_t n, const bf16* x, float* y) {
  from_bf16(n, reinterpret_cast<const std::uint16_t*>(x), y);
}

}  // namespace gpipe::host
