// The inference program (schedule/inference.hpp): its op order, validity under both send rules
// for every placement, and the validator's rules for forward_only schedules.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"

namespace {

using gpipe::make_inference_schedule;
using gpipe::Op;
using gpipe::OpKind;
using gpipe::Placement;
using gpipe::Schedule;
using gpipe::Sends;
using gpipe::validate;
using gpipe::ValidationError;

static_assert(validate(make_inference_schedule(1, 1)));
static_assert(validate(make_inference_schedule(4, 3)));
static_assert(validate(make_inference_schedule(4, 8, 2)));
static_assert(validate(make_inference_schedule(3, 5, 2, Placement::v_shape), Sends::rendezvous));

}  // namespace

TEST_CASE("an inference program runs each device's stages per micro-batch, forwards only") {
  const Schedule s = make_inference_schedule(2, 2);
  CHECK(s.forward_only);
  CHECK(s.ops[0] == std::vector<Op>{{OpKind::forward, 0, 0},
                                    {OpKind::send_activation, 0, 0},
                                    {OpKind::forward, 1, 0},
                                    {OpKind::send_activation, 1, 0}});
  CHECK(s.ops[1] == std::vector<Op>{{OpKind::recv_activation, 0, 0},
                                    {OpKind::forward, 0, 0},
                                    {OpKind::recv_activation, 1, 0},
                                    {OpKind::forward, 1, 0}});
}

TEST_CASE("a V-shaped inference program turns on the last device without a message to itself") {
  // K = 2, 2 chunks: device 1 holds stages 1 and 2, device 0 stages 0 and 3.
  const Schedule s = make_inference_schedule(2, 1, 2, Placement::v_shape);
  CHECK(s.ops[1] == std::vector<Op>{{OpKind::recv_activation, 0, 0},
                                    {OpKind::forward, 0, 0},
                                    {OpKind::send_activation, 0, 0},
                                    {OpKind::recv_activation, 0, 1},
                                    {OpKind::forward, 0, 1},
                                    {OpKind::send_activation, 0, 1}});
  CHECK(s.ops[0].back() == Op{OpKind::forward, 0, 1});
}

TEST_CASE("inference programs are valid under both send rules for every placement") {
  for (std::size_t k = 1; k <= 8; ++k)
    for (std::size_t m = 1; m <= 12; ++m)
      for (std::size_t v = 1; v <= 3; ++v)
        for (const Placement p : {Placement::round_robin, Placement::v_shape})
          for (const Sends sends : {Sends::buffered, Sends::rendezvous}) {
            CAPTURE(k);
            CAPTURE(m);
            CAPTURE(v);
            const Schedule s = make_inference_schedule(k, m, v, p);
            const gpipe::ValidationResult r = validate(s, sends);
            INFO(gpipe::describe(r));
            CHECK(r.ok);
            // every op the issue order names, and every recv after its send
            CHECK(gpipe::issue_order(s).size() == m * (3 * k * v - 2));
          }
}

TEST_CASE("inference_schedule_for keeps a training schedule's stages and placement") {
  const Schedule training = gpipe::ZeroBubbleV::make(3, 6);
  const Schedule s = gpipe::inference_schedule_for(training, 4);
  CHECK(s.num_devices == 3);
  CHECK(s.num_chunks == 2);
  CHECK(s.placement == Placement::v_shape);
  CHECK(s.num_micro_batches == 4);
  CHECK(validate(s));
}

TEST_CASE("the validator refuses backward ops in a forward_only schedule and a missing forward") {
  Schedule s = make_inference_schedule(2, 2);
  s.ops[1].push_back({OpKind::backward_input, 0, 0});
  gpipe::ValidationResult r = validate(s);
  CHECK(r.error == ValidationError::unexpected_op);
  CHECK(gpipe::describe(r).find("forward_only") != std::string::npos);

  s = make_inference_schedule(2, 2);
  s.ops[1].erase(s.ops[1].begin() + 1);  // forward(0) of the last stage
  r = validate(s);
  CHECK(r.error == ValidationError::missing_op);

  // a training schedule is not complete without its backward ops
  s = make_inference_schedule(2, 2);
  s.forward_only = false;
  CHECK(validate(s).error == ValidationError::missing_op);
}

TEST_CASE("make_inference_schedule refuses zero devices, micro-batches or chunks") {
  CHECK_THROWS_AS(make_inference_schedule(0, 1), gpipe::Error);
  CHECK_THROWS_AS(make_inference_schedule(1, 0), gpipe::Error);
  CHECK_THROWS_AS(make_inference_schedule(1, 1, 0), gpipe::Error);
}
