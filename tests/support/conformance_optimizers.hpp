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
//   TEST_CASE_TEMPLATE_INVOKE(conformance_adamw_ranges, Factory);
//   TEST_CASE_TEMPLATE_INVOKE(conformance_bf16_weights, Factory);
//
// The last two: AdamW over a whole stage in one call (adamw_update_ranges, with its fused bf16
// copy) equals the per-range calls bit for bit; and under MixedBf16 the bf16 weights a step reads
// are its float parameters rounded, however they were last written.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model.hpp"
#include "gpipe/model/kernel_context.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/optim.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"
#include "support/temp_path.hpp"

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

// Tensors of one and two dimensions at odd offsets, sizes not multiples of 4 (an empty one too),
// then `alternating` more of 1 to 5 elements whose kinds alternate: with many, more runs of one
// weight-decay setting than one CUDA launch takes.
inline std::vector<optim::ParameterRange> mixed_tensors(std::size_t alternating) {
  const std::size_t shapes[][2] = {{7, 1}, {15, 2}, {1, 1},  {1, 1}, {192, 2},  {13, 1},  {4, 2},
                                   {5, 1}, {0, 2},  {37, 2}, {3, 1}, {1031, 2}, {129, 1}, {6, 2}};
  std::vector<optim::ParameterRange> out;
  std::size_t at = 0;
  for (const auto& [size, dims] : shapes) {
    out.push_back({at, size, dims});
    at += size;
  }
  for (std::size_t i = 0; i < alternating; ++i) {
    out.push_back({at, 1 + i % 5, 1 + i % 2});
    at += 1 + i % 5;
  }
  return out;
}

// Three AdamW steps over `tensors` (Decay::matrices) on arrays `misalign` elements past an
// allocation's start: one adamw_update per tensor (weight decay 0 for one dimension), against
// optim::AdamW's update in one call with and without its bf16 copy. p, m and v agree bit for bit,
// and the copy holds the parameters rounded to bf16 by the host's definition.
template <class Factory>
void check_adamw_ranges(const std::vector<optim::ParameterRange>& tensors, std::size_t misalign) {
  using Backend = typename Factory::backend_type;
  using Kernels = typename Backend::Kernels;
  const std::size_t n = tensors.back().offset + tensors.back().size, k = misalign;
  const optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 5.0, .decay = optim::Decay::matrices};
  const optim::AdamW adamw(o);
  Backend backend = Factory::make(1);
  // per path: p (n), m and v (2 n); and the gradient, the copy
  std::vector<typename Backend::template Buffer<float>> p, state;
  for (int path = 0; path < 3; ++path) {
    p.push_back(backend.template allocate<float>(0, n + k, MemoryKind::other));
    state.push_back(backend.template allocate<float>(0, 2 * n + k, MemoryKind::other));
  }
  auto g = backend.template allocate<float>(0, n + k, MemoryKind::other);
  auto w = backend.template allocate<bf16>(0, n + k, MemoryKind::other);
  const std::vector<float> p0 = random_inputs(n, 1, 41), zeros(2 * n, 0.0f);
  for (int path = 0; path < 3; ++path)
    backend.submit(0, {"upload"}, [&, path](Kernels& c) {
      c.upload(n, p0.data(), p[path].data() + k);
      c.upload(2 * n, zeros.data(), state[path].data() + k);
    });
  for (std::size_t t = 1; t <= 3; ++t) {
    CAPTURE(t);
    const std::vector<float> grads = random_inputs(n, 1, 41 + t);
    backend.submit(0, {"steps"}, [&](Kernels& c) {
      c.upload(n, grads.data(), g.data() + k);
      float *p0d = p[0].data() + k, *s0 = state[0].data() + k;
      for (const optim::ParameterRange& r : tensors)
        c.adamw_update(r.size, p0d + r.offset, g.data() + k + r.offset, s0 + r.offset,
                       s0 + n + r.offset, o.lr, o.beta1, o.beta2, o.eps,
                       r.dims >= 2 ? o.weight_decay : 0.0, t);
      adamw.update(c, n, p[1].data() + k, g.data() + k, state[1].data() + k, t,
                   std::span<const optim::ParameterRange>(tensors), w.data() + k);
      adamw.update(c, n, p[2].data() + k, g.data() + k, state[2].data() + k, t,
                   std::span<const optim::ParameterRange>(tensors));
    });
    backend.synchronize();
    std::vector<std::vector<float>> got(3, std::vector<float>(3 * n));
    std::vector<bf16> copy(n);
    backend.submit(0, {"download"}, [&](Kernels& c) {
      for (int path = 0; path < 3; ++path) {
        c.download(n, p[path].data() + k, got[path].data());
        c.download(2 * n, state[path].data() + k, got[path].data() + n);
      }
      c.download(n, w.data() + k, copy.data());
    });
    backend.synchronize();
    CHECK(std::memcmp(got[1].data(), got[0].data(), 3 * n * sizeof(float)) == 0);
    CHECK(std::memcmp(got[2].data(), got[0].data(), 3 * n * sizeof(float)) == 0);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += copy[i].bits != bf16(got[0][i]).bits;
    CHECK(wrong == 0);
  }
}

// `trainer`'s forward (predict, and a step's loss) equals bit for bit that of `fresh`, a trainer
// of the same configuration whose parameters are set to trainer's just now (so that its bf16
// weights are rounded anew): trainer's bf16 weights are its parameters rounded.
template <class Trainer>
void check_forward_as_fresh(Trainer& trainer, Trainer& fresh, const std::vector<float>& x,
                            const std::vector<std::int32_t>& y) {
  for (const ParameterInfo& info : trainer.parameter_info())
    fresh.set_parameter(info.name, trainer.parameter(info.name));
  const std::vector<float> got = trainer.predict(x), want = fresh.predict(x);
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  trainer.zero_grad();
  fresh.zero_grad();
  const float loss = trainer.forward_backward(x, y), fresh_loss = fresh.forward_backward(x, y);
  CHECK(std::memcmp(&loss, &fresh_loss, sizeof(float)) == 0);
  trainer.zero_grad();
  fresh.zero_grad();
}

}  // namespace gpipe::test::conformance

TEST_CASE_TEMPLATE_DEFINE(
    "MixedBf16: the bf16 weights a forward reads are its parameters rounded, after a fused AdamW "
    "step and after every other write of the parameters",
    Factory, conformance_bf16_weights) {
  using namespace gpipe;
  using namespace gpipe::test;
  using Backend = typename Factory::backend_type;
  using Tr = Trainer<Model3, SoftmaxCrossEntropy, Backend, GPipe, MixedBf16>;
  // ties across devices (stages 0 and 2) and within one (stage 1)
  const std::vector<Tie> ties{{.parameter = "5.2.bias", .to = "0.bias"},
                              {.parameter = "4.bias", .to = "2.bias"}};
  const std::vector<float> x = random_inputs(conformance::optimizer_rows, Model3::in_features, 51);
  const std::vector<std::int32_t> y =
      random_classes(conformance::optimizer_rows, L6::out_features, 52);
  Backend backend = Factory::make(3), fresh_backend = Factory::make(3);
  Tr trainer(backend, {.micro_batches = 2, .seed = 3, .ties = ties});
  Tr fresh(fresh_backend, {.micro_batches = 2, .seed = 5, .ties = ties});
  const optim::AdamW adamw({.lr = 1e-2, .weight_decay = 0.1, .decay = optim::Decay::matrices});
  const auto train = [&](const auto& optimizer) {
    trainer.zero_grad();
    trainer.forward_backward(x, y);
    trainer.step(optimizer);
  };
  const auto check = [&] { conformance::check_forward_as_fresh(trainer, fresh, x, y); };
  train(adamw);  // the first step rounds; its update writes the copy
  check();
  train(adamw);
  check();
  std::vector<float> w = trainer.parameter("2.weight");
  for (float& v : w) v *= 2;
  trainer.set_parameter("2.weight", w);
  check();
  train(optim::SGD({.lr = 0.1}));  // an update without the fused copy
  check();
  train(adamw);
  const TempPath dir("gpipe_bf16_weights", "");
  trainer.save_checkpoint(dir.path());
  train(adamw);
  trainer.load_checkpoint(dir.path());
  check();
  train(adamw);
  const TempPath file;
  fresh.save(file.path());  // fresh's parameters now: trainer's before the last step
  trainer.load(file.path());
  check();
}

TEST_CASE_TEMPLATE_DEFINE(
    "AdamW over a stage in one call (adamw_update_ranges, with its bf16 copy) equals one "
    "adamw_update per tensor bit for bit",
    Factory, conformance_adamw_ranges) {
  using namespace gpipe;
  using namespace gpipe::test::conformance;
  static_assert(has_adamw_ranges<typename Factory::backend_type::Kernels>);
  for (const std::size_t misalign : {0u, 1u}) {
    CAPTURE(misalign);
    check_adamw_ranges<Factory>(mixed_tensors(0), misalign);
    check_adamw_ranges<Factory>(mixed_tensors(900), misalign);  // several launches on CUDA
  }
  SUBCASE("ranges that leave a gap or miss the end are a gpipe::Error") {
    using Backend = typename Factory::backend_type;
    Backend backend = Factory::make(1);
    auto a = backend.template allocate<float>(0, 16, MemoryKind::other);
    for (const std::vector<DecayRange>& bad :
         {std::vector<DecayRange>{{0, 4, true}, {5, 4, false}},
          std::vector<DecayRange>{{0, 4, true}, {4, 4, false}}}) {
      backend.submit(0, {"bad ranges"}, [&](typename Backend::Kernels& c) {
        c.adamw_update_ranges(10, a.data(), a.data(), a.data(), a.data(), bad, 0.1, 0.9, 0.99, 1e-8,
                              0.1, 1, nullptr);
      });
      CHECK_THROWS_AS(backend.synchronize(), Error);
    }
  }
}

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
