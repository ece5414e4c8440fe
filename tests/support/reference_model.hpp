#pragma once
// The unpipelined reference: the same layers run one after another on the whole mini-batch, in
// double precision, on one thread, with no micro-batches, streams or schedule. What every
// pipelined configuration must reproduce. The cross-entropy (ignored targets included) is written
// here from its definition, not taken from the loss kernels.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/backend/host.hpp"
#include "gpipe/model.hpp"
#include "support/relative_error.hpp"

namespace gpipe::test {

using NamedTensors = std::map<std::string, std::vector<double>>;

struct ReferenceResult {
  double loss = 0;
  NamedTensors gradients;
};

// Parameters of a trainer by name, widened to double.
template <class Trainer>
NamedTensors parameters_of(const Trainer& trainer) {
  NamedTensors out;
  for (const ParameterInfo& info : trainer.parameter_info()) {
    const std::vector<float> p = trainer.parameter(info.name);
    out[info.name] = std::vector<double>(p.begin(), p.end());
  }
  return out;
}

template <class Trainer>
NamedTensors gradients_of(const Trainer& trainer) {
  NamedTensors out;
  for (const ParameterInfo& info : trainer.parameter_info()) {
    const std::vector<float> g = trainer.gradient(info.name);
    out[info.name] = std::vector<double>(g.begin(), g.end());
  }
  return out;
}

// Cross-entropy of logits (rows, classes) against class ids `targets` (rows), -100 ignored:
// returns the mean over the rows not ignored and writes its gradient to dlogits (rows, classes),
// from softmax's definition (the max subtracted, sums in long double).
inline double reference_cross_entropy(std::size_t rows, std::size_t classes,
                                      const std::vector<double>& logits,
                                      std::span<const std::int32_t> targets,
                                      std::vector<double>& dlogits) {
  std::size_t counted = 0;
  for (const std::int32_t t : targets) counted += t == -100 ? 0 : 1;
  dlogits.assign(rows * classes, 0.0);
  long double total = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    if (targets[r] == -100) continue;
    const double* z = logits.data() + r * classes;
    const double max = *std::max_element(z, z + classes);
    long double sum = 0;
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<long double>(z[c] - max));
    const auto t = static_cast<std::size_t>(targets[r]);
    total += std::log(sum) + max - z[t];
    for (std::size_t c = 0; c < classes; ++c)
      dlogits[r * classes + c] = static_cast<double>(
          (std::exp(static_cast<long double>(z[c] - max)) / sum - (c == t ? 1.0L : 0.0L)) /
          static_cast<long double>(counted));
  }
  return static_cast<double>(total / static_cast<long double>(counted));
}

// Loss and gradients of the mini-batch mean loss of Model at `params`, for x (rows, in) and the
// loss's targets y; document: each row's document id (packed documents), or empty for none.
template <class Model, class Loss>
ReferenceResult reference_step(const NamedTensors& params, std::span<const float> x,
                               std::span<const typename Loss::target_type> y,
                               std::span<const std::int32_t> document = {}) {
  const std::int32_t* ids = document.empty() ? nullptr : document.data();
  constexpr std::size_t K = Model::num_stages;
  const std::size_t rows = x.size() / Model::in_features;
  const std::vector<ParameterInfo> infos = Model::parameters();
  host::Kernels<double> k;

  // Flat per-stage arrays from the named tensors.
  std::vector<std::vector<double>> p(K), g(K);
  for (std::size_t s = 0; s < K; ++s) {
    p[s].assign(Model::stage_num_params[s], 0.0);
    g[s].assign(Model::stage_num_params[s], 0.0);
  }
  for (const ParameterInfo& info : infos) {
    const std::vector<double>& v = params.at(info.name);
    std::copy(v.begin(), v.end(), p[info.stage].begin() + static_cast<std::ptrdiff_t>(info.offset));
  }

  // acts[s] = input of stage s (rows, in_s); acts[K] = model output.
  std::vector<std::vector<double>> acts(K + 1), stash(K), grad_stash(K);
  acts[0].assign(x.begin(), x.end());
  [&]<std::size_t... S>(std::index_sequence<S...>) {
    (
        [&] {
          using St = typename Model::template stage_t<S>;
          acts[S + 1].assign(rows * St::out_features, 0.0);
          stash[S].assign(rows * St::stash_per_row, 0.0);
          std::vector<double> ws(rows * workspace_per_row_v<St>);
          St::forward(k, ForwardArgs<double>{rows, acts[S].data(), acts[S + 1].data(), p[S].data(),
                                             stash[S].data(), ws.data(), nullptr, ids});
        }(),
        ...);
  }
  (std::make_index_sequence<K>{});

  constexpr std::size_t out = Model::out_features;
  std::vector<double> dy(rows * out);
  double loss = 0;
  if constexpr (std::is_same_v<typename Loss::target_type, float>) {
    const double normalizer = static_cast<double>(rows * out);
    std::vector<double> target(y.begin(), y.end());
    double loss_sum = 0;
    k.mse(rows * out, acts[K].data(), target.data(), 1.0 / normalizer, dy.data(), &loss_sum);
    loss = loss_sum / normalizer;
  } else {
    loss = reference_cross_entropy(rows, out, acts[K], y, dy);
  }

  [&]<std::size_t... S>(std::index_sequence<S...>) {
    (
        [&] {
          constexpr std::size_t s = K - 1 - S;
          using St = typename Model::template stage_t<s>;
          std::vector<double> dx(rows * St::in_features);
          grad_stash[s].assign(rows * St::grad_stash_per_row, 0.0);
          std::vector<double> ws(rows * workspace_per_row_v<St>);
          St::backward_input(
              k, BackwardInputArgs<double>{rows, acts[s].data(), dy.data(), dx.data(), p[s].data(),
                                           stash[s].data(), grad_stash[s].data(), ws.data(),
                                           nullptr, nullptr, ids});
          St::backward_weight(k, BackwardWeightArgs<double>{
                                     rows, acts[s].data(), dy.data(), p[s].data(), stash[s].data(),
                                     grad_stash[s].data(), g[s].data(), ws.data(), ids});
          dy = std::move(dx);
        }(),
        ...);
  }
  (std::make_index_sequence<K>{});

  ReferenceResult result;
  result.loss = loss;
  for (const ParameterInfo& info : infos) {
    const auto begin = g[info.stage].begin() + static_cast<std::ptrdiff_t>(info.offset);
    result.gradients[info.name] =
        std::vector<double>(begin, begin + static_cast<std::ptrdiff_t>(info.size));
  }
  return result;
}

}  // namespace gpipe::test
