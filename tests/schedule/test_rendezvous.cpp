// Rendezvous sends (schedule/op.hpp): when a send completes only with its recv, as between
// processes or over NCCL. GPipe, 1F1B and ZB-H1 run to the end as generated; interleaved 1F1B
// stalls (found here) and order_for_rendezvous reorders its transfers so that it runs, compute
// ops in the same order, for every K, M and chunk count tried. A schedule that is fine with
// buffered sends but cycles under rendezvous is reported as a deadlock at the send that waits;
// groups of consecutive transfers are what makes a send-then-recv exchange between neighbours work;
// transfers between stages of one device stay buffered.

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/schedule.hpp"
#include "support/errors.hpp"

namespace {

using gpipe::Op;
using gpipe::OpKind;
using gpipe::Schedule;
using gpipe::Sends;
using gpipe::validate;
using gpipe::ValidationError;
using gpipe::test::contains;

constexpr auto F = OpKind::forward, B = OpKind::backward_input, W = OpKind::backward_weight,
               SA = OpKind::send_activation, RA = OpKind::recv_activation,
               SG = OpKind::send_gradient, RG = OpKind::recv_gradient;

// Two devices, two micro-batches. Device 1 receives micro-batch 1 first; device 0 sends 0 first,
// with a forward between its two sends. Buffered, device 0 runs ahead and device 1 finds both
// activations waiting; under rendezvous device 0's send of 0 waits for a recv that device 1
// posts only after the recv of 1, which waits for device 0's second send: a cycle.
constexpr Schedule crossed_sends() {
  return {
      .num_devices = 2,
      .num_micro_batches = 2,
      .ops = {
          {{F, 0}, {SA, 0}, {F, 1}, {SA, 1}, {RG, 0}, {B, 0}, {W, 0}, {RG, 1}, {B, 1}, {W, 1}},
          {{RA, 1}, {F, 1}, {RA, 0}, {F, 0}, {B, 0}, {W, 0}, {SG, 0}, {B, 1}, {W, 1}, {SG, 1}}}};
}

// 1F1B's steady state on two devices, written out: device 0 sends activation 1 and then
// receives gradient 0; device 1 sends gradient 0 and then receives activation 1. Posted one
// transfer at a time, both would wait in their sends; posted as a group each, they meet.
constexpr Schedule exchange() {
  return {
      .num_devices = 2,
      .num_micro_batches = 2,
      .ops = {
          {{F, 0}, {SA, 0}, {F, 1}, {SA, 1}, {RG, 0}, {B, 0}, {W, 0}, {RG, 1}, {B, 1}, {W, 1}},
          {{RA, 0}, {F, 0}, {B, 0}, {W, 0}, {SG, 0}, {RA, 1}, {F, 1}, {B, 1}, {W, 1}, {SG, 1}}}};
}

// Compile time too.
static_assert(validate(gpipe::make_1f1b_schedule(4, 8), Sends::rendezvous).ok);
static_assert(validate(gpipe::make_zb_h1_schedule(4, 3), Sends::rendezvous).ok);
static_assert(validate(gpipe::make_gpipe_schedule(3, 5), Sends::rendezvous).ok);
static_assert(validate(gpipe::make_interleaved_schedule(2, 2, 3), Sends::rendezvous).error ==
              ValidationError::deadlock);
static_assert(validate(gpipe::order_for_rendezvous(gpipe::make_interleaved_schedule(2, 2, 3)),
                       Sends::rendezvous)
                  .ok);
static_assert(validate(crossed_sends()).ok);
static_assert(validate(crossed_sends(), Sends::rendezvous).error == ValidationError::deadlock);
static_assert(!gpipe::messages_in_order(crossed_sends()).ok);
static_assert(gpipe::messages_in_order(gpipe::make_interleaved_schedule(2, 2, 3)).ok);

}  // namespace

TEST_CASE("GPipe, 1F1B and ZB-H1 run with rendezvous sends as generated") {
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t m = 1; m <= 16; ++m) {
      for (const Schedule& s : {gpipe::make_gpipe_schedule(k, m), gpipe::make_1f1b_schedule(k, m),
                                gpipe::make_zb_h1_schedule(k, m)}) {
        const gpipe::ValidationResult result = validate(s, Sends::rendezvous);
        INFO("K = " << k << ", M = " << m << ": " << gpipe::describe(result));
        CHECK(result.ok);
        CHECK(gpipe::order_for_rendezvous(s) == s);
        CHECK(gpipe::messages_in_order(s).ok);
      }
    }
  }
}

TEST_CASE("interleaved 1F1B needs its transfers reordered; then it runs under both rules") {
  std::size_t stalled = 0, checked = 0;
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t v = 1; v <= 3; ++v) {
      for (std::size_t m = 1; m <= 16; ++m) {
        const Schedule s = gpipe::make_interleaved_schedule(k, v, m);
        const Schedule ordered = gpipe::order_for_rendezvous(s);
        INFO("K = " << k << ", V = " << v << ", M = " << m << ": "
                    << gpipe::describe(validate(ordered, Sends::rendezvous)));
        stalled += validate(s, Sends::rendezvous).ok ? 0 : 1;
        CHECK(validate(ordered, Sends::rendezvous).ok);
        CHECK(validate(ordered).ok);
        // each pair's messages in one order on both sides, as NCCL matches them
        CHECK(gpipe::messages_in_order(s).ok);
        CHECK(gpipe::messages_in_order(ordered).ok);
        // the same ops on the same devices, compute ops in the same order
        for (std::size_t d = 0; d < k; ++d) {
          CHECK(ordered.ops[d].size() == s.ops[d].size());
          std::vector<Op> compute_before, compute_after;
          for (const Op& op : s.ops[d])
            if (gpipe::is_compute(op.kind)) compute_before.push_back(op);
          for (const Op& op : ordered.ops[d])
            if (gpipe::is_compute(op.kind)) compute_after.push_back(op);
          CHECK(compute_before == compute_after);
        }
        // never faster than the buffered original (the simulator times buffered sends: a
        // lower bound); what it costs is in schedule/rendezvous.hpp
        CHECK(gpipe::simulate(ordered).makespan >= gpipe::simulate(s).makespan);
        ++checked;
      }
    }
  }
  CHECK(checked == 8 * 3 * 16);
  CHECK(stalled > 0);  // the generator's own order does need it
}

TEST_CASE("messages a receiver posts in another order than its sender are found, by pair") {
  // device 1 takes micro-batch 1's activation before micro-batch 0's; device 0 sends 0 first
  const gpipe::MessageOrder order = gpipe::messages_in_order(crossed_sends());
  CHECK_FALSE(order.ok);
  CHECK(order.sender == 0);
  CHECK(order.receiver == 1);
  CHECK_FALSE(order.gradients);
  // one micro-batch's messages cannot be out of order
  CHECK(gpipe::messages_in_order(gpipe::make_1f1b_schedule(2, 1)).ok);
}

TEST_CASE("a schedule that needs buffered sends deadlocks under rendezvous, named at the send") {
  CHECK(validate(crossed_sends()).ok);
  const gpipe::ValidationResult result = validate(crossed_sends(), Sends::rendezvous);
  INFO(gpipe::describe(result));
  REQUIRE_FALSE(result.ok);
  CHECK(result.error == ValidationError::deadlock);
  CHECK(result.device == 0);
  CHECK(result.position == 1);
  CHECK(result.op == Op{SA, 0});
  CHECK(result.other == Op{RA, 0});
  CHECK(result.other_device == 1);
  CHECK(result.other_position == 2);
  const std::string text = gpipe::describe(result);
  CHECK(contains(text, "rendezvous"));
  CHECK(contains(text, "device 0, position 1, send_activation(micro-batch 0, chunk 0)"));
  CHECK_THROWS_WITH_AS(gpipe::require_valid(crossed_sends(), Sends::rendezvous),
                       doctest::Contains("deadlock"), gpipe::Error);
  CHECK_NOTHROW(gpipe::require_valid(crossed_sends()));
}

TEST_CASE("consecutive transfers form one group: neighbours that send and then receive meet") {
  CHECK(validate(exchange(), Sends::rendezvous).ok);
  static_assert(validate(exchange(), Sends::rendezvous).ok);
}

TEST_CASE("transfers between stages of one device stay buffered under rendezvous") {
  // One device, two chunks: stage 0's send and stage 1's recv are on the same device, with
  // compute ops between them.
  for (std::size_t m = 1; m <= 4; ++m) {
    const Schedule s = gpipe::make_interleaved_schedule(1, 2, m);
    CHECK(validate(s, Sends::rendezvous).ok);
  }
  // and a recv before its own device's send still deadlocks
  Schedule s = gpipe::make_interleaved_schedule(1, 2, 1);
  // device 0: F(0,0) SA(0,0) RA(0,1) F(0,1) ... : swap the send and the recv
  REQUIRE(s.ops[0][1].kind == SA);
  REQUIRE(s.ops[0][2].kind == RA);
  std::swap(s.ops[0][1], s.ops[0][2]);
  CHECK(validate(s, Sends::rendezvous).error == ValidationError::deadlock);
}
