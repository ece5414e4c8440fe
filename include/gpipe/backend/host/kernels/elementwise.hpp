#pragma once
// Elementwise and broadcast kernels of the host backend: bias, activations, copies.

#include <cmath>
#include <cstddef>
#include <numbers>

namespace gpipe::host {

// y(rows, cols) += bias(cols)
template <class T>
void bias_add(std::size_t rows, std::size_t cols, const T* bias, T* y) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
}

// db(cols) += sum over rows of dy(rows, cols)
template <class T>
void bias_grad(std::size_t rows, std::size_t cols, const T* dy, T* db) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) db[c] += dy[r * cols + c];
}

template <class T>
void relu_forward(std::size_t n, const T* x, T* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}

// dx = dy * [x > 0]  (the subgradient at 0 is 0, as in PyTorch)
template <class T>
void relu_backward(std::size_t n, const T* x, const T* dy, T* dx) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = x[i] > T(0) ? dy[i] : T(0);
}

// Exact GELU: y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
template <class T>
void gelu_forward(std::size_t n, const T* x, T* y) {
  const T inv_sqrt2 = T(1) / std::numbers::sqrt2_v<T>;
  for (std::size_t i = 0; i < n; ++i) y[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * inv_sqrt2));
}

// dx = dy * (Phi(x) + x * phi(x))
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

// y = a + b (y may alias a or b)
template <class T>
void add(std::size_t n, const T* a, const T* b, T* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// y += x
template <class T>
void accumulate(std::size_t n, const T* x, T* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

template <class T>
void copy(std::size_t n, const T* src, T* dst) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
}

template <class T>
void fill(std::size_t n, T value, T* dst) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = value;
}

}  // namespace gpipe::host
