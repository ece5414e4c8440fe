// Optimizer steps on a pipeline equal PyTorch's update rules applied to the unpipelined model's
// gradients: the rules are written again here, in double, from torch.optim's documentation.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

constexpr std::size_t rows = 12;
constexpr int steps = 4;

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
  void update(NamedTensors& params, const NamedTensors& grads, int t) {
    for (auto& [name, p] : params) {
      std::vector<double>&mm = m[name], &vv = v[name];
      mm.resize(p.size());
      vv.resize(p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double g = grads.at(name)[i];
        p[i] *= 1 - o.lr * o.weight_decay;
        mm[i] = o.beta1 * mm[i] + (1 - o.beta1) * g;
        vv[i] = o.beta2 * vv[i] + (1 - o.beta2) * g * g;
        const double m_hat = mm[i] / (1 - std::pow(o.beta1, t));
        const double v_hat = vv[i] / (1 - std::pow(o.beta2, t));
        p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
      }
    }
  }
};

template <class Optimizer, class Reference>
void check_steps(const Optimizer& optimizer, Reference reference) {
  const std::vector<float> x = random_inputs(rows, Model3::in_features, 21);
  const std::vector<std::int32_t> y = random_classes(rows, L6::out_features, 22);

  host::Backend backend(3);
  Trainer<Model3, SoftmaxCrossEntropy, host::Backend> trainer(
      backend, {.micro_batches = 5, .remat = Remat::always, .seed = 3});
  host::Backend single_backend(1);
  Trainer<Model1, SoftmaxCrossEntropy, host::Backend> single(single_backend,
                                                             {.micro_batches = 1, .seed = 3});
  NamedTensors expected = parameters_of(trainer);

  for (int t = 1; t <= steps; ++t) {
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
    for (const auto& [name, p] : expected) {
      CAPTURE(name);
      // Parameters move by lr-sized steps; compare against the parameter scale.
      CHECK(relative_error(got.at(name), p) < 1e-5);
      CHECK(relative_error(got.at(name), got_single.at(name)) < 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("SGD steps on a pipeline equal torch.optim.SGD on the unpipelined model") {
  check_steps(optim::SGD({.lr = 0.1}), SgdReference({.lr = 0.1}));
}

TEST_CASE("SGD with momentum, dampening and weight decay equals torch.optim.SGD") {
  const optim::SGDOptions o{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  check_steps(optim::SGD(o), SgdReference(o));
}

TEST_CASE("SGD with Nesterov momentum equals torch.optim.SGD") {
  const optim::SGDOptions o{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.001, .nesterov = true};
  check_steps(optim::SGD(o), SgdReference(o));
}

TEST_CASE("AdamW steps on a pipeline equal torch.optim.AdamW on the unpipelined model") {
  check_steps(optim::AdamW(), AdamWReference(optim::AdamWOptions{}));
  const optim::AdamWOptions o{.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6,
                              .weight_decay = 0.1};
  check_steps(optim::AdamW(o), AdamWReference(o));
}

TEST_CASE("bad optimizer hyperparameters are a gpipe::Error") {
  CHECK_THROWS_AS(optim::SGD({.lr = -1}), Error);
  CHECK_THROWS_AS(optim::SGD({.lr = 0.1, .nesterov = true}), Error);
  CHECK_THROWS_AS(optim::AdamW({.beta1 = 1.0}), Error);
  CHECK_THROWS_AS(optim::AdamW({.beta2 = -0.1}), Error);
  CHECK_THROWS_AS(optim::AdamW({.eps = -1}), Error);
}
