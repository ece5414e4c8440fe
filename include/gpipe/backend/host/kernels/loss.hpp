#pragma once
// Loss kernels: each writes the loss summed over its rows and the gradient of
// (grad_scale * that sum) with respect to its input, so that micro-batches accumulate to the
// mini-batch mean when grad_scale = 1 / (mini-batch normalizer). A target of
// gpipe::ignore_index (-100) adds nothing to the loss and gets a zero gradient row.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpipe/backend/host/kernels/simd.hpp"
#include "gpipe/backend/host/kernels/softmax.hpp"
#include "gpipe/model/loss.hpp"

namespace gpipe::host {

/// One row of softmax_cross_entropy: z (classes) its logits, target its class; writes the row's
/// dlogits to g (classes; g may be z) and returns its loss, -log softmax(z)[target], in double.
/// An ignored target (ignore_index) gives loss 0 and g = 0.
template <class T>
double softmax_cross_entropy_row(std::size_t classes, const T* z, std::int32_t target, T grad_scale,
                                 T* g) {
  if (target == ignore_index) {
    std::fill_n(g, classes, T(0));
    return 0;
  }
  const auto t = static_cast<std::size_t>(target);
  const T z_target = z[t];  // before g, which may be z, is written
  const T max = detail::row_max(z, classes);
  const double sum = detail::exp_shifted(z, max, classes, g);
  const double loss = std::log(sum) + max - z_target;
  const T scale = static_cast<T>(grad_scale / sum);
  simd::transform(
      classes, [scale](auto e) { return e * scale; }, g, g);
  g[t] -= grad_scale;
  return loss;
}

/// logits (rows, classes), targets (rows) class ids in [0, classes) or ignore_index, already
/// validated. loss_sum[0] = sum_r -log softmax(logits_r)[t_r] over the rows not ignored;
/// dlogits = grad_scale * (softmax - onehot), 0 on an ignored row
/// One exp per logit (float: simd::exp, within 2e-7 of e^x), summed in double; the row's exps
/// wait in dlogits for the sum. The rows' losses are summed in double, in row order.
template <class T>
void softmax_cross_entropy(std::size_t rows, std::size_t classes, const T* logits,
                           const std::int32_t* targets, T grad_scale, T* dlogits, T* loss_sum) {
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r)
    total += softmax_cross_entropy_row(classes, logits + r * classes, targets[r], grad_scale,
                                       dlogits + r * classes);
  loss_sum[0] = static_cast<T>(total);
}

/// y, target (n); loss_sum[0] = sum (y - t)^2;  dy = grad_scale * 2 (y - t)
template <class T>
void mse(std::size_t n, const T* y, const T* target, T grad_scale, T* dy, T* loss_sum) {
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(y[i]) - target[i];
    total += d * d;
    dy[i] = static_cast<T>(grad_scale * 2.0 * d);
  }
  loss_sum[0] = static_cast<T>(total);
}

}  // namespace gpipe::host
