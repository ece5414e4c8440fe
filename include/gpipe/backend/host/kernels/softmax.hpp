#pragma once
// The two passes of a softmax over one row, shared by the loss and the attention core: the row's
// maximum, and the exps shifted by it with their sum. float runs on SIMD packs (simd::exp);
// double, the precision of the tests' references, on std::exp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "gpipe/backend/host/kernels/simd.hpp"

namespace gpipe::detail {

// The largest of z[0, n), n > 0 (a NaN after z[0] is passed over, as by a plain max loop).
template <class T>
T row_max(const T* z, std::size_t n) {
  T max = z[0];
  std::size_t tail = 0;  // where the scalar loop starts
  if constexpr (std::is_same_v<T, float>) {
    constexpr std::size_t w = host::simd::width_v<float>;
    tail = n - n % w;
    host::simd::Pack<float> packed = host::simd::Pack<float>{} + max;
    for (std::size_t c = 0; c < tail; c += w) {
      const auto v = host::simd::load(z + c);
      packed = v > packed ? v : packed;
    }
    for (std::size_t lane = 0; lane < w; ++lane) max = packed[lane] > max ? packed[lane] : max;
  }
  for (std::size_t c = tail; c < n; ++c) max = z[c] > max ? z[c] : max;
  return max;
}

// out[c] = e^(z[c] - shift) for c < n; returns their sum, in double. float: simd::exp on packs,
// summed in float over runs of 256 elements and in double across runs.
template <class T>
double exp_shifted(const T* z, T shift, std::size_t n, T* out) {
  double sum = 0;
  if constexpr (std::is_same_v<T, float>) {
    namespace simd = host::simd;
    constexpr std::size_t w = simd::width_v<float>, run = 256;
    const std::size_t tail = n - n % w;
    for (std::size_t start = 0; start < tail; start += run) {
      simd::Pack<float> partial{};
      const std::size_t end = std::min(tail, start + run);
      for (std::size_t c = start; c < end; c += w) {
        const auto e = simd::exp(simd::load(z + c) - shift);
        simd::store(out + c, e);
        partial += e;
      }
      for (std::size_t lane = 0; lane < w; ++lane) sum += partial[lane];
    }
    for (std::size_t c = tail; c < n; ++c) sum += out[c] = simd::exp(z[c] - shift);
  } else {
    for (std::size_t c = 0; c < n; ++c) sum += out[c] = std::exp(z[c] - shift);
  }
  return sum;
}

}  // namespace gpipe::detail
