#pragma once
// Short SIMD vectors for the host backend's elementwise kernels, as GCC/Clang vector extensions:
// they compile to SIMD instructions at every optimization level (GCC's -O2 vectorizes no loop
// whose trip count is unknown), and exact aliasing of an input and the output is fine, since each
// pack is loaded before it is stored. 16 bytes: the width every x86-64 and AArch64 CPU has, and
// enough for loops that move data rather than compute on it.
//
//   transform(n, f, out, in...):  out[i] = f(in[i]...) for i < n; f is called with packs of
//                                 width_v<T> elements, then with scalars for the tail, so it is a
//                                 generic lambda written with +, -, *, /, comparisons and ?:.
//   exp(x), tanh(x):              float, or a Pack<float>: the same arithmetic on every lane, so
//                                 a pack's lanes and the scalar tail agree bit for bit; about
//                                 20 times the throughput of libm's expf / tanhf called per
//                                 element.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace gpipe::host::simd {

/// PackOf<T>::type: the 16-byte vector of T, for T float or double (see Pack).
template <class T>
struct PackOf;
/// Four floats.
template <>
struct PackOf<float> {
  /// Four floats in one 16-byte vector register.
  typedef float type __attribute__((vector_size(16)));
};
/// Two doubles.
template <>
struct PackOf<double> {
  /// Two doubles in one 16-byte vector register.
  typedef double type __attribute__((vector_size(16)));
};
/// Pack<T>: width_v<T> elements of T.
template <class T>
using Pack = typename PackOf<T>::type;
/// The number of elements of T in a Pack<T>: 4 for float, 2 for double.
template <class T>
inline constexpr std::size_t width_v = sizeof(Pack<T>) / sizeof(T);

/// The width_v<T> elements at p, which need no alignment.
template <class T>
Pack<T> load(const T* p) {
  Pack<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
/// Writes v's width_v<T> elements to p, which needs no alignment.
template <class T>
void store(T* p, const Pack<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

/// out[i] = f(in[i]...) for i < n: f gets packs of width_v<T> elements, then scalars for the
/// tail (see the top of this file). An input may be out itself, exactly (not shifted).
template <class T, class F, class... In>
void transform(std::size_t n, F f, T* out, const In*... in) {
  constexpr std::size_t w = width_v<T>;
  const std::size_t packed = n - n % w;
  for (std::size_t i = 0; i < packed; i += w) store(out + i, f(load(in + i)...));
  for (std::size_t j = 0; j < n % w; ++j) out[packed + j] = f(in[packed + j]...);
}

/// BitsOf<V>::type: the unsigned 32-bit integers of a float or of a Pack<float>, V's bits as
/// exp() builds them.
template <class V>
struct BitsOf {
  /// One float's bits.
  using type = std::uint32_t;
};
/// The bits of a Pack<float>.
template <>
struct BitsOf<Pack<float>> {
  /// Four 32-bit lanes, one per float of the pack.
  typedef std::uint32_t type __attribute__((vector_size(16)));
};

/// e^x for x a float or a Pack<float>. x = n ln 2 + r with |r| <= ln(2) / 2 (Cody-Waite: ln 2 in
/// two parts, the first exact in few bits, so that n ln2_hi is exact), e^r by its Taylor series to
/// r^7 (the first term left out is below 6e-9 relative), times 2^n built in the exponent bits.
/// Relative error below 2e-7 (tests/backend/host/test_kernels.cpp sweeps it against
/// double). x above 88.72 gives inf; x below -86.9 gives 0 (e^x there is below 1.8e-38, about
/// the smallest normal float: no denormals); NaN stays NaN.
template <class V>
V exp(V x) {
  using Bits = typename BitsOf<V>::type;
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f;  // 355 / 512
  constexpr float ln2_lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds x log2(e) to an integer n (|n| < 2^22) and leaves n in the low
  // bits of the sum.
  constexpr float round_magic = 12582912.0f;
  const V shifted = x * log2e + round_magic;
  const V n = shifted - round_magic;
  const V r = (x - n * ln2_hi) - n * ln2_lo;
  V p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^(n - 1) from its exponent field, then times 2: n = 128 (x up to 88.72) stays finite.
  const Bits n_bits = std::bit_cast<Bits>(shifted) - std::bit_cast<std::uint32_t>(round_magic);
  const V half_scale = std::bit_cast<V>((n_bits + 126u) << 23);
  const V y = p * half_scale * 2.0f;
  const V zero{};
  return x < -86.9f ? zero : (x > 88.7228f ? zero + std::numeric_limits<float>::infinity() : y);
}

/// tanh x for x a float or a Pack<float>: (1 - e) / (1 + e) with e = e^(-2|x|), sign restored.
/// Absolute error below 2e-7 for every x (relative error grows for |x| below 1e-2, where
/// 1 - e cancels): meant for tanh added to 1, as in GELU's tanh form, not as a general tanh.
template <class V>
V tanh(V x) {
  const V magnitude = x < 0.0f ? -x : x;
  const V e = simd::exp(magnitude * -2.0f);
  const V t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

}  // namespace gpipe::host::simd
