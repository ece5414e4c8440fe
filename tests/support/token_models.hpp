#pragma once
// What the token-model tests (GPT, Llama; tests/runtime/) share: random token ids, a pipelined
// step against the unpipelined double-precision model, and devices with a team of threads
// against one thread each.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/reference_model.hpp"

namespace gpipe::test {

// n token ids below `vocabulary`, from `seed`.
inline std::vector<std::int32_t> random_tokens(std::size_t n, std::size_t vocabulary,
                                               std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> out(n);
  for (std::int32_t& t : out) t = static_cast<std::int32_t>(rng.next_u64() % vocabulary);
  return out;
}

// Float pipelined runs against the double reference: relative to each tensor's largest entry.
inline constexpr double token_gradient_tolerance = 2e-6;
inline constexpr double token_loss_tolerance = 1e-6;

// One step of Model under Schedule, M = m, `remat`, on (tokens, targets) and, where given, each
// token's document: the loss and every gradient equal reference_step's for the same parameters.
template <class Model, class Schedule>
void check_token_step(std::size_t m, Remat remat, std::span<const std::int32_t> tokens,
                      std::span<const std::int32_t> targets,
                      std::span<const std::int32_t> documents = {}) {
  CAPTURE(Model::num_stages);
  CAPTURE(m);
  CAPTURE(to_string(remat));
  host::Backend backend(Model::num_stages / Schedule::chunks_per_device);
  Trainer<Model, SoftmaxCrossEntropy, host::Backend, Schedule> trainer(
      backend, {.micro_batches = m, .remat = remat, .seed = 3});
  const float loss = documents.empty() ? trainer.forward_backward(tokens, targets)
                                       : trainer.forward_backward(tokens, targets, documents);
  const std::vector<float> rows(tokens.begin(), tokens.end());
  const ReferenceResult ref =
      reference_step<Model, SoftmaxCrossEntropy>(parameters_of(trainer), rows, targets, documents);
  CHECK(loss == doctest::Approx(ref.loss).epsilon(token_loss_tolerance));
  const NamedTensors grads = gradients_of(trainer);
  REQUIRE(grads.size() == ref.gradients.size());
  for (const auto& [name, grad] : grads) {
    CAPTURE(name);
    CHECK(relative_error(grad, ref.gradients.at(name)) < token_gradient_tolerance);
  }
}

// Model (2 stages) on 2 devices of a team of two threads each, 1F1B, M = 2: the loss and every
// gradient of the same step on devices of one thread, remat never and always (the kernel tests
// check each split bit for bit; this, that the pipeline hands the team to them).
template <class Model>
void check_team_gives_one_thread_step(std::span<const std::int32_t> x,
                                      std::span<const std::int32_t> y) {
  host::Backend one(2), team(2, {.threads_per_device = 2});
  for (Remat remat : {Remat::never, Remat::always}) {
    CAPTURE(to_string(remat));
    Trainer<Model, SoftmaxCrossEntropy, host::Backend, OneFOneB> alone(
        one, {.micro_batches = 2, .remat = remat, .seed = 5}),
        split(team, {.micro_batches = 2, .remat = remat, .seed = 5});
    CHECK(split.forward_backward(x, y) ==
          doctest::Approx(alone.forward_backward(x, y)).epsilon(1e-6));
    for (const auto& info : alone.parameter_info()) {
      CAPTURE(info.name);
      CHECK(relative_error(split.gradient(info.name), alone.gradient(info.name)) < 1e-6);
    }
  }
}

}  // namespace gpipe::test
