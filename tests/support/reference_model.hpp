#pragma once
// The unpipelined reference: the same layers run one after another on the whole mini-batch, in
// double precision, on one thread, with no micro-batches, streams or schedule. What every
// pipelined configuration must reproduce.

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

// Loss and gradients of the mini-batch mean loss of Model at `params`, for x (rows, in) and the
// loss's targets y.
template <class Model, class Loss>
ReferenceResult reference_step(const NamedTensors& params, std::span<const float> x,
                               std::span<const typename Loss::target_type> y) {
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
                                             stash[S].data(), ws.data()});
        }(),
        ...);
  }
  (std::make_index_sequence<K>{});

  constexpr std::size_t out = Model::out_features;
  const double normalizer = Loss::normalizer(rows, out);
  std::vector<double> dy(rows * out);
  double loss_sum = 0;
  if constexpr (std::is_same_v<typename Loss::target_type, float>) {
    std::vector<double> target(y.begin(), y.end());
    k.mse(rows * out, acts[K].data(), target.data(), 1.0 / normalizer, dy.data(), &loss_sum);
  } else {
    k.softmax_cross_entropy(rows, out, acts[K].data(), y.data(), 1.0 / normalizer, dy.data(),
                            &loss_sum);
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
                                           stash[s].data(), grad_stash[s].data(), ws.data()});
          St::backward_weight(k, BackwardWeightArgs<double>{
                                     rows, acts[s].data(), dy.data(), p[s].data(), stash[s].data(),
                                     grad_stash[s].data(), g[s].data(), ws.data()});
          dy = std::move(dx);
        }(),
        ...);
  }
  (std::make_index_sequence<K>{});

  ReferenceResult result;
  result.loss = loss_sum / normalizer;
  for (const ParameterInfo& info : infos) {
    const auto begin = g[info.stage].begin() + static_cast<std::ptrdiff_t>(info.offset);
    result.gradients[info.name] =
        std::vector<double>(begin, begin + static_cast<std::ptrdiff_t>(info.size));
  }
  return result;
}

}  // namespace gpipe::test
