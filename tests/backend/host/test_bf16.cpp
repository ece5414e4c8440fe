// float <-> bf16 (backend/host/kernels/bf16.hpp) against a reference written here from the
// definition of rounding: of the two bf16 values around a float (its top 16 bits, and the next
// bf16 away from zero), the nearer in double, the one with an even last bit on a tie. Checked on
// every 97th float bit pattern of all 2^32 and on every float that lies exactly halfway between
// two bf16 values of a few binades (the ties), normal and denormal; infinities, zeros and NaN;
// the four-at-a-time path against the scalar one at every tail length; and bf16 -> float exact.

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "gpipe/backend/host/kernels.hpp"  // after bf16.hpp: which must not hide gpipe::detail
#include "gpipe/backend/host/kernels/bf16.hpp"

namespace {

using gpipe::host::from_bf16_bits;
using gpipe::host::to_bf16_bits;

// The bf16 bits nearest to finite `f` (ties to even), by distances in double.
std::uint16_t reference_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto toward_zero = static_cast<std::uint16_t>(u >> 16);
  const auto away = static_cast<std::uint16_t>(toward_zero + 1);  // the next magnitude up
  const double x = std::fabs(static_cast<double>(f));
  const double low = std::fabs(static_cast<double>(from_bf16_bits(toward_zero)));
  // the next magnitude up may be infinity: as a value, 2^128, where the rounding of float's
  // largest values to infinity is decided
  const double high = (away & 0x7fffu) == 0x7f80u
                          ? std::ldexp(1.0, 128)
                          : std::fabs(static_cast<double>(from_bf16_bits(away)));
  if (x - low < high - x) return toward_zero;
  if (high - x < x - low) return away;
  return (toward_zero & 1u) == 0 ? toward_zero : away;
}

void check_one(float f) {
  if (std::isnan(f)) {
    const std::uint16_t b = to_bf16_bits(f);
    CHECK(std::isnan(from_bf16_bits(b)));
    CHECK((b & 0x0040u) != 0);  // quiet
    CHECK(std::signbit(from_bf16_bits(b)) == std::signbit(f));
    return;
  }
  CAPTURE(std::bit_cast<std::uint32_t>(f));
  CHECK(to_bf16_bits(f) == reference_bf16(f));
}

}  // namespace

TEST_SUITE("host kernels: bf16") {
  TEST_CASE("float -> bf16 rounds to nearest, ties to even, on a sweep of all floats") {
    // through to_bf16 (its packs) and to_bf16_bits, 4096 patterns at a time
    constexpr std::uint64_t stride = 97, batch = 4096;
    std::vector<float> x(batch);
    std::vector<std::uint16_t> bits(batch);
    std::uint64_t checked = 0, wrong = 0;
    std::uint32_t first_wrong = 0;
    for (std::uint64_t start = 0; start < (std::uint64_t{1} << 32); start += stride * batch) {
      std::size_t n = 0;
      for (std::uint64_t u = start; u < (std::uint64_t{1} << 32) && n < batch; u += stride)
        x[n++] = std::bit_cast<float>(static_cast<std::uint32_t>(u));
      gpipe::host::to_bf16(n, x.data(), bits.data());
      for (std::size_t i = 0; i < n; ++i) {
        const bool nan = std::isnan(x[i]);
        const bool right = nan ? std::isnan(from_bf16_bits(bits[i])) && (bits[i] & 0x0040u) != 0
                               : bits[i] == reference_bf16(x[i]) && bits[i] == to_bf16_bits(x[i]);
        if (!right && wrong++ == 0) first_wrong = std::bit_cast<std::uint32_t>(x[i]);
        ++checked;
      }
    }
    CAPTURE(first_wrong);
    CHECK(checked == ((std::uint64_t{1} << 32) + stride - 1) / stride);
    CHECK(wrong == 0);
  }

  TEST_CASE("ties go to the even neighbour, for normal and denormal floats") {
    // a float halfway between two bf16 values: low 16 bits 0x8000
    for (std::uint32_t high : {0x0000u, 0x0001u, 0x007fu, 0x0080u, 0x3f80u, 0x3f81u, 0x7f7eu,
                               0x7f7fu, 0x8001u, 0xbf80u, 0xbf81u, 0xff7fu}) {
      const float tie = std::bit_cast<float>(high << 16 | 0x8000u);
      CAPTURE(high);
      check_one(tie);
      CHECK(to_bf16_bits(tie) == ((high & 1u) == 0 ? high : high + 1));
      check_one(std::nextafter(tie, 0.0f));                                    // below: down
      check_one(std::nextafter(tie, std::numeric_limits<float>::infinity()));  // above: up
    }
    // float's largest value rounds to infinity, as the reference's 2^128 says
    CHECK(to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80u);
    CHECK(to_bf16_bits(-std::numeric_limits<float>::max()) == 0xff80u);
  }

  TEST_CASE("infinities and zeros are exact; NaN stays a quiet NaN with its sign") {
    constexpr float inf = std::numeric_limits<float>::infinity();
    CHECK(to_bf16_bits(inf) == 0x7f80u);
    CHECK(to_bf16_bits(-inf) == 0xff80u);
    CHECK(to_bf16_bits(0.0f) == 0x0000u);
    CHECK(to_bf16_bits(-0.0f) == 0x8000u);
    // a signalling NaN whose payload is only in the low bits: rounding would make it infinity
    for (std::uint32_t nan : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0xffc0ffffu})
      check_one(std::bit_cast<float>(nan));
  }

  TEST_CASE("to_bf16 and from_bf16 on arrays equal the scalar conversions at every tail") {
    std::vector<float> x;
    for (std::uint32_t i = 0; i < 41; ++i)
      x.push_back(std::bit_cast<float>(0x3f808000u + i * 0x01234567u));  // ties, NaNs, infs
    for (std::size_t n = 0; n <= x.size(); ++n) {
      CAPTURE(n);
      std::vector<std::uint16_t> bits(n + 1, 0xabcd);
      gpipe::host::to_bf16(n, x.data(), bits.data());
      for (std::size_t i = 0; i < n; ++i) CHECK(bits[i] == to_bf16_bits(x[i]));
      CHECK(bits[n] == 0xabcd);  // nothing written past n
      std::vector<float> back(n);
      gpipe::host::from_bf16(n, bits.data(), back.data());
      for (std::size_t i = 0; i < n; ++i)
        CHECK(std::bit_cast<std::uint32_t>(back[i]) == static_cast<std::uint32_t>(bits[i]) << 16);
    }
  }
}
