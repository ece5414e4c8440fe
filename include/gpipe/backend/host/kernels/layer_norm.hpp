#pragma once
// LayerNorm over the last dimension, affine: y = (x - mean) * rstd * gamma + beta,
// rstd = 1 / sqrt(var + eps) with the biased variance, as torch.nn.LayerNorm.
// Row statistics are kept as stats(rows, 2) = (mean, rstd) for the backward kernels.

#include <cmath>
#include <cstddef>

namespace gpipe::host {

/// Per row of x(rows, cols): y = (x - mean) * rstd * gamma(cols) + beta(cols), and
/// stats(rows, 2) = (mean, rstd); the statistics are computed in double.
template <class T>
void layer_norm_forward(std::size_t rows, std::size_t cols, double eps, const T* x, const T* gamma,
                        const T* beta, T* y, T* stats) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    double sum = 0;
    for (std::size_t c = 0; c < cols; ++c) sum += xr[c];
    const double mean = sum / static_cast<double>(cols);
    double sq = 0;
    for (std::size_t c = 0; c < cols; ++c) sq += (xr[c] - mean) * (xr[c] - mean);
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(cols) + eps);
    for (std::size_t c = 0; c < cols; ++c)
      y[r * cols + c] = static_cast<T>((xr[c] - mean) * rstd) * gamma[c] + beta[c];
    stats[2 * r] = static_cast<T>(mean);
    stats[2 * r + 1] = static_cast<T>(rstd);
  }
}

/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,  xhat = (x - mean) * rstd
template <class T>
void layer_norm_backward_input(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                               const T* gamma, const T* stats, T* dx) {
  for (std::size_t r = 0; r < rows; ++r) {
    const double mean = stats[2 * r], rstd = stats[2 * r + 1];
    double sum_g = 0, sum_gx = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      const double g = static_cast<double>(dy[r * cols + c]) * gamma[c];
      const double xhat = (x[r * cols + c] - mean) * rstd;
      sum_g += g;
      sum_gx += g * xhat;
    }
    const double n = static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const double g = static_cast<double>(dy[r * cols + c]) * gamma[c];
      const double xhat = (x[r * cols + c] - mean) * rstd;
      dx[r * cols + c] = static_cast<T>(rstd * (g - sum_g / n - xhat * sum_gx / n));
    }
  }
}

/// dgamma(cols) += sum_rows dy * xhat,  dbeta(cols) += sum_rows dy, for x and dy whose rows are
/// `ld` apart (a block of columns of wider ones, as a team's column blocks are)
template <class T>
void layer_norm_backward_weight(std::size_t rows, std::size_t cols, const T* x, const T* dy,
                                const T* stats, T* dgamma, T* dbeta, std::size_t ld) {
  for (std::size_t r = 0; r < rows; ++r) {
    const double mean = stats[2 * r], rstd = stats[2 * r + 1];
    for (std::size_t c = 0; c < cols; ++c) {
      const T xhat = static_cast<T>((x[r * ld + c] - mean) * rstd);
      dgamma[c] += dy[r * ld + c] * xhat;
      dbeta[c] += dy[r * ld + c];
    }
  }
}

}  // namespace gpipe::host
