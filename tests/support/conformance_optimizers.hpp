#pragma once
// Backend conformance, part 2: optimizer steps on a pipeline equal PyTorch's update rules
// applied to the unpipelined model's gradients (the rules written again here, in double, from
// torch.optim's documentation), and equal the same steps on one device of the same backend.
//
// Instantiated per backend with a factory as in conformance_equivalence.hpp (which also says
// what a factory provides; here parameter_tolerance):
//   TEST_CASE_TEMPLATE_INVOKE(conformance_sgd, Factory);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_momentum, Factory);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_nesterov, Factory);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_adamw, Factory);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_adamw_matrices, Factory);

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpipe/model.hpp"
#include "gpipe/optim.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace gpipe::test::conformance {

inline constexpr std::size_t optimizer_rows = 12;
inline constexpr int optimizer_steps = 4;

struct SgdReference {
  explicit SgdReference(optim::SGDOptions options) : o(options) {}
  optim::SGDOptions o;
  NamedTensors buf;
  void update(NamedTensors& params, const NamedTensors& grads, int t) {
    for (auto& [name, p] : params) {
      std::vector<double>& b = buf[name];
      b.resize(p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        double d = grads.at(name)[i] + o.weight_decay * p[i];
        if (o.momentum != 0) {
          b[i] = t == 1 ? d : o.momentum * b[i] + (1 - o.dampening) * d;
          d = o.nesterov ? d + o.momentum * b[i] : b[i];
        }
        p[i] -= o.lr * d;
      }
    }
  }
};

struct AdamWReference {
  explicit AdamWReference(optim::AdamWOptions options) : o(options) {}
  optim::AdamWOptions o;
  NamedTensors m, v;
  std::map<std::string, std::size_t> dims;  // per parameter name; check_steps fills it
  void update(NamedTensors& params, const NamedTensors& grads, int t) {
    for (auto& [name, p] : params) {
      std::vector<double>&mm = m[name], &vv = v[name];
      mm.resize(p.size());
      vv.resize(p.size());
      // nanoGPT's groups: with Decay::matrices, tensors of one dimension are not decayed
      const bool decays = o.decay == optim::Decay::all || dims.at(name) >= 2;
      const double wd = decays ? o.weight_decay : 0.0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double g = grads.at(name)[i];
        p[i] *= 1 - o.lr * wd;
        mm[i] = o.beta1 * mm[i] + (1 - o.beta1) * g;
        vv[i] = o.beta2 * vv[i] + (1 - o.beta2) * g * g;
        const double m_hat = mm[i] / (1 - std::pow(o.beta1, t));
        const double v_hat = vv[i] / (1 - std::pow(o.beta2, t));
        p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
      }
    }
  }
};

template <class Factory, class Optimizer, class Reference>
void check_steps(const Optimizer& optimizer, Reference reference) {
  using Backend = typename Factory::backend_type;
  const std::vector<float> x = random_inputs(optimizer_rows, Model3::in_features, 21);
  const std::vector<std::int32_t> y = random_classes(optimizer_rows, L6::out_features, 22);

  Backend backend = Factory::make(3);
  Trainer<Model3, SoftmaxCrossEntropy, Backend> trainer(
      backend, {.micro_batches = 5, .remat = Remat::always, .seed = 3});
  Backend single_backend = Factory::make(1);
  Trainer<Model1, SoftmaxCrossEntropy, Backend> single(single_backend,
                                                       {.micro_batches = 1, .seed = 3});
  NamedTensors expected = parameters_of(trainer);
  if constexpr (requires { reference.dims; })
    for (const ParameterInfo& info : trainer.parameter_info())
      reference.dims[info.name] = info.shape.size();

  for (int t = 1; t <= optimizer_steps; ++t) {
    CAPTURE(t);
    const ReferenceResult ref = reference_step<Model1, SoftmaxCrossEntropy>(expected, x, y);
    reference.update(expected, ref.gradients, t);
    trainer.zero_grad();
    trainer.forward_backward(x, y);
    trainer.step(optimizer);
    single.zero_grad();
    single.forward_backward(x, y);
    single.step(optimizer);

    const NamedTensors got = parameters_of(trainer), got_single = parameters_of(single);
    for (const auto& entry : expected) {
      const std::string& name = entry.first;  // not a structured binding: CAPTURE's lambda
      const std::vector<double>& p = entry.second;
      CAPTURE(name);
      // Parameters move by lr-sized steps; compare against the parameter scale.
      CHECK(relative_error(got.at(name), p) < Factory::parameter_tolerance);
      CHECK(relative_error(got.at(name), got_single.at(name)) < Factory::parameter_tolerance);
    }
  }
}

}  // namespace gpipe::test::conformance

TEST_CASE_TEMPLATE_DEFINE("SGD steps on a pipeline equal torch.optim.SGD on the unpipelined model",
                          Factory, conformance_sgd) {
  using namespace gpipe;
  test::conformance::check_steps<Factory>(optim::SGD({.lr = 0.1}),
                                          test::conformance::SgdReference({.lr = 0.1}));
}

TEST_CASE_TEMPLATE_DEFINE("SGD with momentum, dampening and weight decay equals torch.optim.SGD",
                          Factory, conformance_sgd_momentum) {
  using namespace gpipe;
  const optim::SGDOptions o{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  test::conformance::check_steps<Factory>(optim::SGD(o), test::conformance::SgdReference(o));
}

TEST_CASE_TEMPLATE_DEFINE("SGD with Nesterov momentum equals torch.optim.SGD", Factory,
                          conformance_sgd_nesterov) {
  using namespace gpipe;
  const optim::SGDOptions o{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.001, .nesterov = true};
  test::conformance::check_steps<Factory>(optim::SGD(o), test::conformance::SgdReference(o));
}

TEST_CASE_TEMPLATE_DEFINE(
    "AdamW steps on a pipeline equal torch.optim.AdamW on the unpipelined "
    "model",
    Factory, conformance_adamw) {
  using namespace gpipe;
  test::conformance::check_steps<Factory>(optim::AdamW(),
                                          test::conformance::AdamWReference(optim::AdamWOptions{}));
  const optim::AdamWOptions o{
      .lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  test::conformance::check_steps<Factory>(optim::AdamW(o), test::conformance::AdamWReference(o));
}

TEST_CASE_TEMPLATE_DEFINE(
    "AdamW with Decay::matrices decays only tensors of two or more dimensions, as nanoGPT's "
    "two groups of torch.optim.AdamW",
    Factory, conformance_adamw_matrices) {
  using namespace gpipe;
  // a weight decay large enough that decaying a bias or LayerNorm parameter shows
  const optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 5.0, .decay = optim::Decay::matrices};
  test::conformance::check_steps<Factory>(optim::AdamW(o), test::conformance::AdamWReference(o));
}
