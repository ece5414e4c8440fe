#pragma once
// Precision: which scalar type a model's activations are kept in, chosen by a Trainer's fifth
// template argument.
//
//   gpipe::Fp32       everything in float (the default)
//   gpipe::MixedBf16  activations, stashes, hand-overs between stages and GEMM inputs in bf16;
//                     master weights, gradients, optimizer state, GEMM accumulation, LayerNorm
//                     statistics, softmax and the loss in float
//
// gpipe::bf16 is the storage type: float's sign, 8-bit exponent and top 7 mantissa bits, kept
// as its 16 bits. It converts to float exactly and from float rounded to nearest, ties to even;
// it has no arithmetic of its own, so every computation on it is float arithmetic on its value.
// A kernel context's value_type is the activations' type; master_t<value_type> is the type of
// parameters, gradients and losses (float for bf16, the type itself otherwise).
//
// Rounding works on float's bits: adding 0x7fff plus the kept part's lowest bit and dropping the
// low 16 bits rounds the magnitude to nearest, ties to even, for normal and denormal floats alike
// (a carry runs from the mantissa into the exponent: the largest finite floats round to infinity,
// the largest denormals to the smallest normal). NaN is the one input that rule would break (a
// payload only in the low bits would round to infinity): it stays NaN, made quiet, sign kept.

#include <bit>
#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace gpipe {

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

/// bfloat16 storage (see the top of this file): 2 bytes, converts to float exactly, from float
/// rounded to nearest even. Trivial, so arrays of it are plain memory.
struct bf16 {
  /// The 16 bits: float's top half.
  std::uint16_t bits;

  bf16() = default;
  /// `f` rounded to nearest, ties to even (a double is first rounded to float).
  explicit constexpr bf16(float f) : bits(to_bf16_bits(f)) {}
  /// `d` rounded to float, then to bf16.
  explicit constexpr bf16(double d) : bf16(static_cast<float>(d)) {}
  /// The value with these bits.
  static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 v;
    v.bits = b;
    return v;
  }
  /// Its value, exactly.
  constexpr operator float() const { return from_bf16_bits(bits); }
};
static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

/// master_t<T>: the type of parameters, gradients and losses for activations of type T: float
/// for bf16, T itself for float (and for double, in the finite-difference tests).
template <class T>
struct master_type {
  /// T itself.
  using type = T;
};
/// bf16 activations keep float master weights.
template <>
struct master_type<bf16> {
  /// float: bf16 keeps too few bits to accumulate in.
  using type = float;
};
/// The master type for activations of type T (see master_type).
template <class T>
using master_t = typename master_type<T>::type;

/// Everything in float: a Trainer's default precision.
struct Fp32 {
  /// The scalar type of activations, stashes and hand-overs.
  using activation_type = float;
  /// Its name in benchmark labels and messages.
  static constexpr std::string_view name = "fp32";
};

/// bf16 activations, stashes, hand-overs and GEMM inputs; float master weights, gradients,
/// optimizer state, GEMM accumulation, LayerNorm statistics, softmax and loss.
struct MixedBf16 {
  /// The scalar type of activations, stashes and hand-overs.
  using activation_type = bf16;
  /// Its name in benchmark labels and messages.
  static constexpr std::string_view name = "bf16";
};

/// precision<P>: Fp32 or MixedBf16 (a type naming its activation_type, float or bf16).
template <class P>
concept precision = requires {
  typename P::activation_type;
  { P::name } -> std::convertible_to<std::string_view>;
}
&&(std::same_as<typename P::activation_type, float> ||
   std::same_as<typename P::activation_type, bf16>);

}  // namespace gpipe
