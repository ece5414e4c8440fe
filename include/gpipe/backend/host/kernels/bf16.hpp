#pragma once
// float <-> bfloat16 on the host, for mixed precision (bf16 activations, fp32 master weights):
// bf16 is float's sign, 8-bit exponent and top 7 mantissa bits, kept here as its 16 bits.
//
//   to_bf16_bits(f)      one float, round to nearest, ties to even (constexpr)
//   to_bf16(n, x, y)     y(n) = x(n) rounded so, four floats at a time on 16-byte packs
//   from_bf16_bits(b)    exact (a bf16 is a float whose low 16 bits are 0)
//   from_bf16(n, x, y)   y(n) = x(n), exact
//
// Rounding works on float's bits: adding 0x7fff plus the kept part's lowest bit and dropping the
// low 16 bits rounds the magnitude to nearest, ties to even, for normal and denormal floats alike
// (a carry runs from the mantissa into the exponent: the largest finite floats round to infinity,
// the largest denormals to the smallest normal). NaN is the one input that rule would break (a
// payload only in the low bits would round to infinity): it stays NaN, made quiet, sign kept.
// AVX512-BF16's vcvtneps2bf16 is not used: it treats denormal inputs as 0, which this does not.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gpipe/backend/host/kernels/simd.hpp"

namespace gpipe::host {

/// The bf16 bits of `f`: rounded to nearest, ties to even; NaN stays a (quiet) NaN.
constexpr std::uint16_t to_bf16_bits(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// The float that bf16 bits `b` hold (exact).
constexpr float from_bf16_bits(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

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

namespace gpipe::host {

/// y(n) = x(n) as bf16 bits, each as to_bf16_bits rounds it.
inline void to_bf16(std::size_t n, const float* x, std::uint16_t* y) {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    gpipe::detail::Bf16Bits4 u;
    std::memcpy(&u, x + i, sizeof u);
    const gpipe::detail::Bf16Half4 b = gpipe::detail::to_bf16_bits(u);
    std::memcpy(y + i, &b, sizeof b);
  }
  for (; i < n; ++i) y[i] = to_bf16_bits(x[i]);
}

/// y(n) = the floats that x(n)'s bf16 bits hold (exact).
inline void from_bf16(std::size_t n, const std::uint16_t* x, float* y) {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    gpipe::detail::Bf16Half4 b;
    std::memcpy(&b, x + i, sizeof b);
    const auto u = __builtin_convertvector(b, gpipe::detail::Bf16Bits4) << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
  for (; i < n; ++i) y[i] = from_bf16_bits(x[i]);
}

}  // namespace gpipe::host
