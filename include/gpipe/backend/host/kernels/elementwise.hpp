#pragma once
// Elementwise and broadcast kernels of the host backend: bias, activations, copies. The
// arithmetic ones run on SIMD packs (kernels/simd.hpp); GELU calls std::erf and std::exp per
// element.

#include <cmath>
#include <cstddef>
#include <cstring>
#include <numbers>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/host/kernels/simd.hpp"

namespace gpipe::host {

/// y(rows, cols) += bias(cols), on every row
template <class T>
void bias_add(std::size_t rows, std::size_t cols, const T* bias, T* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    T* row = y + r * cols;
    simd::transform(
        cols, [](auto v, auto b) { return v + b; }, row, row, bias);
  }
}

/// db(cols) += sum over rows of dy(rows, cols), dy's rows `ld` elements apart (a column block of
/// a wider dy)
template <class T>
void bias_grad(std::size_t rows, std::size_t cols, const T* dy, T* db, std::size_t ld) {
  for (std::size_t r = 0; r < rows; ++r)
    simd::transform(
        cols, [](auto acc, auto g) { return acc + g; }, db, db, dy + r * ld);
}

/// db(cols) += sum over rows of dy(rows, cols)
template <class T>
void bias_grad(std::size_t rows, std::size_t cols, const T* dy, T* db) {
  bias_grad(rows, cols, dy, db, cols);
}

/// y = max(x, 0) (y may be x)
template <class T>
void relu_forward(std::size_t n, const T* x, T* y) {
  simd::transform(
      n,
      [](auto v) {
        const decltype(v) zero{};
        return v > zero ? v : zero;
      },
      y, x);
}

/// dx = dy * [x > 0]  (the subgradient at 0 is 0, as in PyTorch)
template <class T>
void relu_backward(std::size_t n, const T* x, const T* dy, T* dx) {
  simd::transform(
      n,
      [](auto v, auto g) {
        const decltype(v) zero{};
        return v > zero ? g : zero;
      },
      dx, x, dy);
}

/// Exact GELU: y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
template <class T>
void gelu_forward(std::size_t n, const T* x, T* y) {
  const T inv_sqrt2 = T(1) / std::numbers::sqrt2_v<T>;
  for (std::size_t i = 0; i < n; ++i) y[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * inv_sqrt2));
}

/// dx = dy * (Phi(x) + x * phi(x))
template <class T>
void gelu_backward(std::size_t n, const T* x, const T* dy, T* dx) {
  const T inv_sqrt2 = T(1) / std::numbers::sqrt2_v<T>;
  const T inv_sqrt_2pi = std::numbers::inv_sqrtpi_v<T> * inv_sqrt2;
  for (std::size_t i = 0; i < n; ++i) {
    const T cdf = T(0.5) * (T(1) + std::erf(x[i] * inv_sqrt2));
    const T pdf = inv_sqrt_2pi * std::exp(T(-0.5) * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

/// y = a + b (y may alias a or b)
template <class T>
void add(std::size_t n, const T* a, const T* b, T* y) {
  simd::transform(
      n, [](auto u, auto v) { return u + v; }, y, a, b);
}

/// y += x
template <class T>
void accumulate(std::size_t n, const T* x, T* y) {
  simd::transform(
      n, [](auto u, auto v) { return u + v; }, y, y, x);
}

/// dst = src (distinct buffers)
template <class T>
void copy(std::size_t n, const T* src, T* dst) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(T));
}

/// dst = value
template <class T>
void fill(std::size_t n, T value, T* dst) {
  const simd::Pack<T> pack = simd::Pack<T>{} + value;
  std::size_t i = 0;
  for (; i + simd::width_v<T> <= n; i += simd::width_v<T>) simd::store(dst + i, pack);
  for (; i < n; ++i) dst[i] = value;
}

/// x *= alpha
template <class T>
void scale(std::size_t n, T alpha, T* x) {
  simd::transform(
      n, [alpha](auto u) { return u * alpha; }, x, x);
}

/// The sum of squares of one chunk x(n), n <= detail::squares_chunk, in the fixed order of
/// backend/common.hpp.
template <class T>
double chunk_sum_of_squares(std::size_t n, const T* x) {
  using detail::squares_lanes;
  // Lane j adds x[j]^2, x[j + lanes]^2, ... in that order; taken a row of lanes at a time, the
  // lanes' adds are independent of each other (and vectorize), unlike lane after lane.
  double lane[squares_lanes] = {};
  std::size_t row = 0;
  for (; row + squares_lanes <= n; row += squares_lanes)
    for (std::size_t j = 0; j < squares_lanes; ++j) {
      const double v = static_cast<double>(x[row + j]);
      lane[j] += v * v;
    }
  for (std::size_t j = 0; row + j < n; ++j) {
    const double v = static_cast<double>(x[row + j]);
    lane[j] += v * v;
  }
  for (std::size_t half = squares_lanes / 2; half > 0; half /= 2)
    for (std::size_t j = 0; j < half; ++j) lane[j] += lane[j + half];
  return lane[0];
}

}  // namespace gpipe::host
