// Rendezvous sends (schedule/op.hpp): when a send completes only with its recv, as between
// processes or over NCCL. GPipe, 1F1B and ZB-H1 run to the end as generated (ZB-H1 with waits
// at some sends, which order_for_rendezvous removes); interleaved 1F1B
// stalls (found here) and order_for_rendezvous reorders its transfers so that it runs, compute
// ops in the same order, for every K, M and chunk count tried, and as fast as with buffered sends:
// every recv is posted by the time its send runs in the buffered timeline, so no send waits (the
// same for looped BFS, ZB-V and DualPipeV). A schedule that is fine with
// buffered sends but cycles under rendezvous is reported as a deadlock at the send that waits;
// groups of consecutive transfers are what makes a send-then-recv exchange between neighbours work;
// transfers between stages of one device stay buffered.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
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

// Under rendezvous a group of transfers is posted when its device reaches it (the end of the
// compute op before it), and the device leaves it once the partner of each of its transfers is
// posted. Whether, in the buffered timeline of unit op costs, every recv's group is posted no
// later than its send's device leaves the send's group there (which it does once the group's own
// recvs have their data): then no device waits at a group longer than it waits buffered, and the
// lists run under rendezvous exactly as they run buffered (the simulator's times are theirs).
bool no_send_waits(const Schedule& s) {
  const gpipe::SimulationResult timeline = gpipe::simulate(s);
  // [device][position]: when the device reaches the group of the transfer there, and leaves it
  std::vector<std::vector<double>> posted(s.num_devices), left(s.num_devices);
  for (std::size_t d = 0; d < s.num_devices; ++d) {
    const std::vector<Op>& ops = s.ops[d];
    posted[d].assign(ops.size(), 0);
    left[d].assign(ops.size(), 0);
    double reached = 0;
    for (std::size_t p = 0; p < ops.size();) {
      if (gpipe::is_compute(ops[p].kind)) {
        reached = timeline.finish[d][p++];
        continue;
      }
      std::size_t end = p;
      double leaves = reached;
      for (; end < ops.size() && !gpipe::is_compute(ops[end].kind); ++end)
        leaves = std::max(leaves, timeline.finish[d][end]);
      for (; p < end; ++p) {
        posted[d][p] = reached;
        left[d][p] = leaves;
      }
    }
  }
  for (std::size_t d = 0; d < s.num_devices; ++d) {
    for (std::size_t p = 0; p < s.ops[d].size(); ++p) {
      const Op& op = s.ops[d][p];
      if (!gpipe::is_recv(op.kind)) continue;
      // the matching send: the stage before (activation) or after (gradient), same micro-batch
      const std::size_t stage = s.stage_of(d, op.chunk);
      const bool gradient = op.kind == OpKind::recv_gradient;
      const std::size_t from_stage = gradient ? stage + 1 : stage - 1;
      const std::size_t from = s.device_of_stage(from_stage);
      if (from == d) continue;  // a copy within the device stays buffered
      const OpKind send = gradient ? OpKind::send_gradient : OpKind::send_activation;
      for (std::size_t q = 0; q < s.ops[from].size(); ++q) {
        const Op& other = s.ops[from][q];
        if (other.kind == send && other.micro_batch == op.micro_batch &&
            s.stage_of(from, other.chunk) == from_stage && posted[d][p] > left[from][q])
          return false;
      }
    }
  }
  return true;
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
  std::size_t zb_waits = 0;
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t m = 1; m <= 16; ++m) {
      const std::vector<Schedule> schedules = {gpipe::make_gpipe_schedule(k, m),
                                               gpipe::make_1f1b_schedule(k, m),
                                               gpipe::make_zb_h1_schedule(k, m)};
      for (const Schedule& s : schedules) {
        const gpipe::ValidationResult result = validate(s, Sends::rendezvous);
        INFO("K = " << k << ", M = " << m << ": " << gpipe::describe(result));
        CHECK(result.ok);
        CHECK(gpipe::messages_in_order(s).ok);
        const Schedule ordered = gpipe::order_for_rendezvous(s);
        CHECK(no_send_waits(ordered));
        CHECK(gpipe::simulate(ordered).makespan == gpipe::simulate(s).makespan);
        if (&s == &schedules.back()) {
          // ZB-H1 runs as generated, but a device can wait at a send whose receiver is still
          // computing (K = 2, M = 3: device 1's gradient of micro-batch 1 until device 0 ends
          // F2): its transfers are moved so that it does not
          zb_waits += no_send_waits(s) ? 0 : 1;
          CHECK((ordered == s) == no_send_waits(s));
        } else {
          CHECK(no_send_waits(s));
          CHECK(ordered == s);
        }
      }
    }
  }
  CHECK(zb_waits > 0);
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
        // as fast as the buffered original, and no send waits for its recv to be posted
        CHECK(gpipe::simulate(ordered).makespan == gpipe::simulate(s).makespan);
        CHECK(no_send_waits(ordered));
        ++checked;
      }
    }
  }
  CHECK(checked == 8 * 3 * 16);
  CHECK(stalled > 0);  // the generator's own order does need it
}

TEST_CASE("every schedule of several chunks runs under rendezvous as fast as buffered") {
  // Each (K, M) of K <= 8, M <= 16 that the kind makes; the repairs that move one transfer at a
  // time lost up to 0.45 of bubble here (ZB-V, K = 6, M = 16: BENCHMARKS.md)
  std::size_t checked = 0;
  const auto check = [&]<class Kind>(Kind) {
    for (std::size_t k = 1; k <= 8; ++k) {
      for (std::size_t m = 1; m <= 16; ++m) {
        if (std::is_same_v<Kind, gpipe::DualPipeV> && m < 2 * k) continue;  // M >= 2K
        const Schedule s = Kind::make(k, m);
        const Schedule ordered = gpipe::order_for_rendezvous(s);
        INFO(Kind::name << ", K = " << k << ", M = " << m);
        CHECK(validate(ordered, Sends::rendezvous).ok);
        CHECK(validate(ordered).ok);
        CHECK(gpipe::messages_in_order(ordered).ok);
        CHECK(no_send_waits(ordered));
        CHECK(gpipe::simulate(ordered).makespan == gpipe::simulate(s).makespan);
        // still valid with other op costs: validity does not depend on them, and it runs
        CHECK(gpipe::simulate(ordered, {.forward = 1, .backward_input = 2, .backward_weight = 1})
                  .makespan > 0);
        ++checked;
      }
    }
  };
  check(gpipe::Interleaved<2>{});
  check(gpipe::Interleaved<3>{});
  check(gpipe::LoopedBFS<2>{});
  check(gpipe::ZeroBubbleV{});
  check(gpipe::DualPipeV{});
  CHECK(checked == 4 * 8 * 16 + 64);
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
