#pragma once
// Trainer::locate_non_finite's cases, written once for every backend (host, CUDA on the emulator,
// MPI): NanModel (K = 3, M = 4) with a NaN written by stage 1 on micro-batch 2 (into its output,
// or into a weight's gradient), a NaN in one sample of the input, and steps without one. The
// gradients do not depend on whether the step was located.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/faulty_layer.hpp"
#include "support/models.hpp"

namespace gpipe::test {

// make(): a Backend for NanModel's three devices (one per process under MPI). CHECK only, no
// REQUIRE: under MPI a rank that left early would leave the others waiting in a collective.
template <class ScheduleKind, class Precision, class Backend, class Make>
void check_locate_non_finite(Make make) {
  constexpr std::size_t rows = 12, micro_batches = 4;  // 3 rows a micro-batch
  const std::vector<float> x = random_inputs(rows, NanModel::in_features, 1);
  const std::vector<std::int32_t> y = random_classes(rows, NanModel::out_features, 2);
  Backend backend = make();
  Trainer<NanModel, SoftmaxCrossEntropy, Backend, ScheduleKind, Precision> trainer(
      backend, {.micro_batches = micro_batches, .seed = 3});
  const std::size_t device = trainer.device_of_stage(1);

  // off, a clean step: nothing located; the gradients as a located step's, bit for bit
  trainer.forward_backward(x, y);
  CHECK_FALSE(trainer.non_finite_origin().has_value());
  // stage 1's gradients, where this process has them
  const bool mine = transport::Transport<Backend>(backend).is_local(device);
  const auto gradient = [&] { return mine ? trainer.gradient("3.weight") : std::vector<float>(); };
  const std::vector<float> unlocated = gradient();
  trainer.zero_grad();
  trainer.locate_non_finite();
  trainer.forward_backward(x, y);
  CHECK_FALSE(trainer.non_finite_origin().has_value());
  CHECK(gradient() == unlocated);
  trainer.zero_grad();

  SUBCASE("a NaN in a weight's gradient of stage 1, micro-batch 2") {
    nan_calls = 0;
    nan_call = nan_call_of(trainer.schedule(), device, OpKind::backward_weight, 2);
    nan_at = NanAt::backward_weight;
    trainer.forward_backward(x, y);
    nan_at = NanAt::none;
    CHECK(trainer.non_finite_origin().has_value());
    if (!trainer.non_finite_origin()) return;  // CHECK only: under MPI every rank goes on
    const NonFiniteOrigin origin = *trainer.non_finite_origin();
    CHECK(origin.stage == 1);
    CHECK(origin.micro_batch == 2);
    CHECK(origin.tensor == "3.weight");
    CHECK(origin.describe() == "stage 1, micro-batch 2: the gradient of \"3.weight\"");
    // a second forward_backward of the same training step keeps the first finding
    trainer.forward_backward(x, y);
    CHECK(trainer.non_finite_origin()->tensor == "3.weight");
    trainer.skip_step();
    CHECK(trainer.non_finite_origin().has_value());  // until the next step's forward_backward
    // the NaN stays in the gradients: not blamed on the next step
    trainer.forward_backward(x, y);
    CHECK_FALSE(trainer.non_finite_origin().has_value());
  }
  SUBCASE("a NaN in the output of stage 1, micro-batch 2") {
    nan_calls = 0;
    nan_call = nan_call_of(trainer.schedule(), device, OpKind::forward, 2);
    nan_at = NanAt::forward;
    trainer.forward_backward(x, y);
    nan_at = NanAt::none;
    CHECK(trainer.non_finite_origin().has_value());
    if (!trainer.non_finite_origin()) return;
    CHECK(trainer.non_finite_origin()->stage == 1);
    CHECK(trainer.non_finite_origin()->micro_batch == 2);
    CHECK(trainer.non_finite_origin()->tensor == "output");
  }
  SUBCASE("a NaN in the input of one sample") {
    for (const std::size_t sample : {std::size_t{1}, std::size_t{7}, std::size_t{11}}) {
      std::vector<float> poisoned = x;
      poisoned[sample * NanModel::in_features + 2] = std::numeric_limits<float>::quiet_NaN();
      trainer.zero_grad();
      trainer.forward_backward(poisoned, y);
      trainer.skip_step();
      CHECK(trainer.non_finite_origin().has_value());
      if (!trainer.non_finite_origin()) return;
      CHECK(trainer.non_finite_origin()->stage == 0);
      CHECK(trainer.non_finite_origin()->micro_batch == sample / 3);
      CHECK(trainer.non_finite_origin()->tensor == "input");
    }
  }
  SUBCASE("turned off, nothing is located") {
    trainer.locate_non_finite(false);
    std::vector<float> poisoned = x;
    poisoned[0] = std::numeric_limits<float>::infinity();
    trainer.forward_backward(poisoned, y);
    CHECK_FALSE(trainer.non_finite_origin().has_value());
  }
}

}  // namespace gpipe::test
