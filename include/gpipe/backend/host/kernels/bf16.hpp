#pragma once
// float <-> bfloat16 on the host, for mixed precision (bf16 activations, fp32 master weights):
// bf16 is float's sign, 8-bit exponent and top 7 mantissa bits, kept here as its 16 bits.
//
//   to_bf16_bits(f)      one float, round to nearest, ties to even (constexpr)
//   to_bf16(n, x, y)     y(n) = x(n) rounded so, 16 floats at a time on CPUs with AVX-512 (BW),
//                        else four at a time on 16-byte packs
//   from_bf16_bits(b)    exact (a bf16 is a float whose low 16 bits are 0)
//   from_bf16(n, x, y)   y(n) = x(n), exact, 16 or four at a time likewise
//   add_bf16(n, a, b, y) y(n) = a + b summed in float, rounded once
//   store_float_bits / load_float_bits   a float kept exactly in two bf16 slots
//
// Rounding is gpipe::to_bf16_bits' (model/precision.hpp), here on many lanes at once: every path
// gives the same bits. The AVX-512 path is compiled for that target alone (a function attribute)
// and chosen at run time, so the library still runs on any x86-64. AVX512-BF16's vcvtneps2bf16 is
// not used: it treats denormal inputs as 0, which this does not.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gpipe/backend/host/kernels/elementwise.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::host {
using gpipe::from_bf16_bits;
using gpipe::to_bf16_bits;
}  // namespace gpipe::host

// Helpers live in gpipe::detail: a gpipe::host::detail would hide it from the other host headers.
namespace gpipe::detail {

// Bf16Lanes<L>: vectors of L floats' bits (Bits) and of L bf16s' bits (Half).
template <int Lanes>
struct Bf16Lanes;
template <>
struct Bf16Lanes<1> {
  typedef std::uint32_t Bits __attribute__((vector_size(4)));
  typedef std::uint16_t Half __attribute__((vector_size(2)));
};
template <>
struct Bf16Lanes<4> {  // 16-byte packs of floats
  typedef std::uint32_t Bits __attribute__((vector_size(16)));
  typedef std::uint16_t Half __attribute__((vector_size(8)));
};
template <>
struct Bf16Lanes<16> {  // AVX-512's 64 bytes (vpmovdw narrows without saturation)
  typedef std::uint32_t Bits __attribute__((vector_size(64)));
  typedef std::uint16_t Half __attribute__((vector_size(32)));
};

// y = x converted, Lanes at a time, as many as n allows; returns how many it converted. X float:
// rounded as to_bf16_bits; X std::uint16_t: widened exactly. Always inlined, so that an AVX-512
// caller gets AVX-512 code.
template <int Lanes, class X, class Y>
[[gnu::always_inline]] inline std::size_t bf16_lanes(std::size_t n, const X* x, Y* y) {
  using Bits = typename Bf16Lanes<Lanes>::Bits;
  using Half = typename Bf16Lanes<Lanes>::Half;
  const std::size_t packed = n - n % Lanes;
  for (std::size_t i = 0; i < packed; i += Lanes) {
    if constexpr (std::is_same_v<X, float>) {
      Bits u;
      std::memcpy(&u, x + i, sizeof u);
      const Bits rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      const Bits nan = reinterpret_cast<Bits>((u & 0x7fffffffu) > 0x7f800000u);  // all ones: NaN
      const Bits quiet = (u >> 16) | 0x0040u;
      const Half b = __builtin_convertvector((rounded & ~nan) | (quiet & nan), Half);
      std::memcpy(y + i, &b, sizeof b);
    } else {
      Half b;
      std::memcpy(&b, x + i, sizeof b);
      const Bits u = __builtin_convertvector(b, Bits) << 16;
      std::memcpy(y + i, &u, sizeof u);
    }
  }
  return packed;
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

// bf16_lanes<16>, compiled for AVX-512 alone.
template <class X, class Y>
__attribute__((target("avx512f,avx512bw"))) inline std::size_t bf16_lanes_avx512(std::size_t n,
                                                                                 const X* x, Y* y) {
  return bf16_lanes<16>(n, x, y);
}

}  // namespace gpipe::detail
#endif

namespace gpipe::detail {

// y(n) = x(n) converted as bf16_lanes: 16 at a time where the CPU has AVX-512, then 4, then 1.
template <class X, class Y>
void convert_bf16(std::size_t n, const X* x, Y* y) {
  std::size_t done = 0;
#ifdef GPIPE_BF16_AVX512
  if (bf16_avx512()) done = bf16_lanes_avx512(n, x, y);
#endif
  done += bf16_lanes<4>(n - done, x + done, y + done);
  bf16_lanes<1>(n - done, x + done, y + done);
}

}  // namespace gpipe::detail

namespace gpipe::host {

/// y(n) = x(n) as bf16 bits, each as to_bf16_bits rounds it.
inline void to_bf16(std::size_t n, const float* x, std::uint16_t* y) {
  gpipe::detail::convert_bf16(n, x, y);
}

/// y(n) = the floats that x(n)'s bf16 bits hold (exact).
inline void from_bf16(std::size_t n, const std::uint16_t* x, float* y) {
  gpipe::detail::convert_bf16(n, x, y);
}

/// to_bf16 into gpipe::bf16 storage.
inline void to_bf16(std::size_t n, const float* x, bf16* y) {
  to_bf16(n, x, reinterpret_cast<std::uint16_t*>(y));
}
/// from_bf16 from gpipe::bf16 storage.
inline void from_bf16(std::size_t n, const bf16* x, float* y) {
  from_bf16(n, reinterpret_cast<const std::uint16_t*>(x), y);
}

/// y(n) = a + b, each widened exactly, summed in float and rounded once (y may be a or b): the
/// bits of KernelContext<bf16>::add, on the calling thread alone.
inline void add_bf16(std::size_t n, const bf16* a, const bf16* b, bf16* y) {
  constexpr std::size_t chunk = 256;
  float wide_a[chunk], wide_b[chunk];
  for (std::size_t i = 0; i < n; i += chunk) {
    const std::size_t c = std::min(chunk, n - i);
    from_bf16(c, a + i, wide_a);
    from_bf16(c, b + i, wide_b);
    add(c, wide_a, wide_b, wide_a);
    to_bf16(c, wide_a, y + i);
  }
}

/// A float's 32 bits in two bf16 slots, high half first (float statistics in a bf16 stash).
inline void store_float_bits(float f, bf16* two) {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  two[0] = bf16::from_bits(static_cast<std::uint16_t>(bits >> 16));
  two[1] = bf16::from_bits(static_cast<std::uint16_t>(bits & 0xffffu));
}
/// The float that store_float_bits kept in two, exactly.
inline float load_float_bits(const bf16* two) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(two[0].bits) << 16 | two[1].bits);
}

}  // namespace gpipe::host
