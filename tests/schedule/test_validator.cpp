// The validator: valid schedules pass (also with virtual stages), and each kind of broken
// schedule is reported with the right error, the first offending op, and a readable message.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"
#include "support/errors.hpp"

namespace {

using gpipe::test::contains;

using gpipe::make_gpipe_schedule;
using gpipe::Op;
using gpipe::OpKind;
using gpipe::Schedule;
using gpipe::validate;
using gpipe::ValidationError;
using gpipe::ValidationResult;

// Fill-drain over K devices with V chunks each, breadth first: all micro-batches of chunk 0, then
// of chunk 1, ...; backwards in the reverse order, each as [RG] B W [SG] like GPipe's. Valid for
// any K, V, M.
constexpr Schedule make_breadth_first(std::size_t k, std::size_t v, std::size_t m) {
  Schedule s{.num_devices = k,
             .num_micro_batches = m,
             .num_chunks = v,
             .ops = std::vector<std::vector<Op>>(k)};
  const std::size_t stages = s.num_stages();
  for (std::size_t d = 0; d < k; ++d) {
    for (std::size_t c = 0; c < v; ++c) {
      const std::size_t stage = s.stage_of(d, c);
      const auto chunk = static_cast<std::uint32_t>(c);
      for (std::uint32_t mb = 0; mb < m; ++mb) {
        if (stage > 0) s.ops[d].push_back({OpKind::recv_activation, mb, chunk});
        s.ops[d].push_back({OpKind::forward, mb, chunk});
        if (stage + 1 < stages) s.ops[d].push_back({OpKind::send_activation, mb, chunk});
      }
    }
    for (std::size_t c = v; c-- > 0;) {
      const std::size_t stage = s.stage_of(d, c);
      const auto chunk = static_cast<std::uint32_t>(c);
      for (auto mb = static_cast<std::uint32_t>(m); mb-- > 0;) {
        if (stage + 1 < stages) s.ops[d].push_back({OpKind::recv_gradient, mb, chunk});
        s.ops[d].push_back({OpKind::backward_input, mb, chunk});
        s.ops[d].push_back({OpKind::backward_weight, mb, chunk});
        if (stage > 0) s.ops[d].push_back({OpKind::send_gradient, mb, chunk});
      }
    }
  }
  return s;
}

constexpr std::size_t position_of(const Schedule& s, std::size_t device, Op op) {
  const std::vector<Op>& ops = s.ops[device];
  return static_cast<std::size_t>(std::find(ops.begin(), ops.end(), op) - ops.begin());
}

constexpr Schedule without(Schedule s, std::size_t device, Op op) {
  s.ops[device].erase(s.ops[device].begin() +
                      static_cast<std::ptrdiff_t>(position_of(s, device, op)));
  return s;
}

constexpr Schedule with(Schedule s, std::size_t device, std::size_t position, Op op) {
  s.ops[device].insert(s.ops[device].begin() + static_cast<std::ptrdiff_t>(position), op);
  return s;
}

// GPipe on 2 devices, 2 micro-batches; device 0 (stage 0) then holds
//   F0 SA0 F1 SA1 RG1 B1 W1 RG0 B0 W0
// and device 1 (stage 1)
//   RA0 F0 RA1 F1 B1 W1 SG1 B0 W0 SG0
constexpr Schedule gpipe22() { return make_gpipe_schedule(2, 2); }

constexpr Schedule missing_weight_gradient() {
  return without(gpipe22(), 1, {OpKind::backward_weight, 1});
}
constexpr Schedule duplicate_forward() { return with(gpipe22(), 0, 2, {OpKind::forward, 0}); }
constexpr Schedule backward_before_forward() {
  return {
      .num_devices = 1,
      .num_micro_batches = 1,
      .ops = {{{OpKind::backward_input, 0}, {OpKind::forward, 0}, {OpKind::backward_weight, 0}}}};
}
// Each device first waits for the other.
constexpr Schedule both_recv_first() {
  return {.num_devices = 2,
          .num_micro_batches = 1,
          .ops = {{{OpKind::recv_gradient, 0},
                   {OpKind::forward, 0},
                   {OpKind::send_activation, 0},
                   {OpKind::backward_input, 0},
                   {OpKind::backward_weight, 0}},
                  {{OpKind::recv_activation, 0},
                   {OpKind::forward, 0},
                   {OpKind::backward_input, 0},
                   {OpKind::backward_weight, 0},
                   {OpKind::send_gradient, 0}}}};
}
constexpr Schedule recv_without_send() {
  return without(gpipe22(), 0, {OpKind::send_activation, 1});
}
constexpr Schedule send_without_recv() { return without(gpipe22(), 0, {OpKind::recv_gradient, 0}); }
constexpr Schedule micro_batch_out_of_range() {
  Schedule s = gpipe22();
  s.ops[1][3].micro_batch = 2;
  return s;
}
constexpr Schedule chunk_out_of_range() {
  Schedule s = gpipe22();
  s.ops[0][4].chunk = 1;
  return s;
}
constexpr Schedule recv_on_first_stage() {
  return with(gpipe22(), 0, 0, {OpKind::recv_activation, 0});
}
constexpr Schedule forward_before_its_recv() {
  Schedule s = gpipe22();
  std::swap(s.ops[1][2], s.ops[1][3]);  // F1 before RA1
  return s;
}
// One device, two chunks: stage 1's recv waits for stage 0's send further down the same list.
constexpr Schedule recv_before_own_send() {
  Schedule s = make_breadth_first(1, 2, 1);
  // F(c0) SA(c0) RA(c1) F(c1) ... => RA(c1) F(c0) SA(c0) F(c1) ...
  std::swap(s.ops[0][0], s.ops[0][2]);
  std::swap(s.ops[0][1], s.ops[0][2]);
  return s;
}

static_assert(validate(make_breadth_first(1, 2, 1)));
static_assert(validate(make_breadth_first(1, 3, 4)));
static_assert(validate(make_breadth_first(2, 2, 3)));
static_assert(validate(make_breadth_first(3, 2, 2)));
static_assert(validate(make_breadth_first(4, 1, 4)) &&
              make_breadth_first(4, 1, 4) == make_gpipe_schedule(4, 4));

static_assert(validate(missing_weight_gradient()).error == ValidationError::missing_op);
static_assert(validate(duplicate_forward()).error == ValidationError::duplicate_op);
static_assert(validate(backward_before_forward()).error == ValidationError::dependency);
static_assert(validate(both_recv_first()).error == ValidationError::deadlock);
static_assert(validate(recv_without_send()).error == ValidationError::unmatched_recv);
static_assert(validate(send_without_recv()).error == ValidationError::unmatched_send);
static_assert(validate(micro_batch_out_of_range()).error == ValidationError::bad_shape);
static_assert(validate(chunk_out_of_range()).error == ValidationError::bad_shape);
static_assert(validate(recv_on_first_stage()).error == ValidationError::unexpected_op);
static_assert(validate(forward_before_its_recv()).error == ValidationError::dependency);
static_assert(validate(recv_before_own_send()).error == ValidationError::deadlock);

void check_reported(const ValidationResult& result, ValidationError error, std::size_t device,
                    std::size_t position, Op op) {
  INFO(gpipe::describe(result));
  CHECK_FALSE(result.ok);
  CHECK_FALSE(static_cast<bool>(result));
  CHECK(result.error == error);
  CHECK(result.device == device);
  CHECK(result.position == position);
  CHECK(result.op == op);
}

}  // namespace

TEST_CASE("valid schedules pass with ok set and no error") {
  const ValidationResult result = validate(make_breadth_first(3, 2, 5));
  CHECK(result.ok);
  CHECK(static_cast<bool>(result));
  CHECK(result.error == ValidationError::none);
  CHECK(gpipe::describe(result) == "valid schedule");
  CHECK_NOTHROW(gpipe::require_valid(make_gpipe_schedule(3, 5)));
}

TEST_CASE("a missing op is reported at the end of its device's list") {
  const Schedule s = missing_weight_gradient();
  const ValidationResult result = validate(s);
  check_reported(result, ValidationError::missing_op, 1, s.ops[1].size(),
                 {OpKind::backward_weight, 1});
  const std::string text = gpipe::describe(result);
  CHECK(contains(text, "device 1"));
  CHECK(contains(text, "position 9"));
  CHECK(contains(text, "backward_weight(micro-batch 1, chunk 0)"));
  CHECK(contains(text, "missing"));
}

TEST_CASE("a duplicate op is reported at its second occurrence") {
  const ValidationResult result = validate(duplicate_forward());
  check_reported(result, ValidationError::duplicate_op, 0, 2, {OpKind::forward, 0});
  CHECK(result.other_position == 0);
  const std::string text = gpipe::describe(result);
  CHECK(contains(text, "device 0, position 2, forward(micro-batch 0, chunk 0)"));
  CHECK(contains(text, "first at position 0"));
}

TEST_CASE("a backward before its forward is a dependency error at the backward") {
  const ValidationResult result = validate(backward_before_forward());
  check_reported(result, ValidationError::dependency, 0, 0, {OpKind::backward_input, 0});
  CHECK(result.other == Op{OpKind::forward, 0});
  CHECK(result.other_position == 1);
  const std::string text = gpipe::describe(result);
  CHECK(contains(text, "device 0, position 0, backward_input(micro-batch 0, chunk 0)"));
  CHECK(contains(text, "needs forward(micro-batch 0, chunk 0)"));
}

TEST_CASE("a forward before its recv_activation is a dependency error at the forward") {
  check_reported(validate(forward_before_its_recv()), ValidationError::dependency, 1, 2,
                 {OpKind::forward, 1});
}

TEST_CASE("two devices that both receive first deadlock at the lowest device's recv") {
  const ValidationResult result = validate(both_recv_first());
  check_reported(result, ValidationError::deadlock, 0, 0, {OpKind::recv_gradient, 0});
  CHECK(result.other == Op{OpKind::send_gradient, 0});
  CHECK(result.other_device == 1);
  CHECK(result.other_position == 4);
  const std::string text = gpipe::describe(result);
  CHECK(contains(text, "deadlock"));
  CHECK(contains(text, "device 0, position 0, recv_gradient(micro-batch 0, chunk 0)"));
  CHECK(contains(text, "send_gradient(micro-batch 0, chunk 0) at device 1, position 4"));
}

TEST_CASE("a recv placed before its send on the same device deadlocks") {
  check_reported(validate(recv_before_own_send()), ValidationError::deadlock, 0, 0,
                 {OpKind::recv_activation, 0, 1});
}

TEST_CASE("a recv with no matching send is reported at the recv") {
  const ValidationResult result = validate(recv_without_send());
  check_reported(result, ValidationError::unmatched_recv, 1, 2, {OpKind::recv_activation, 1});
  CHECK(result.other == Op{OpKind::send_activation, 1});
  CHECK(result.other_device == 0);
  const std::string text = gpipe::describe(result);
  CHECK(contains(text, "device 1, position 2, recv_activation(micro-batch 1, chunk 0)"));
  CHECK(contains(text, "no matching send_activation(micro-batch 1, chunk 0) on device 0"));
}

TEST_CASE("a send with no matching recv is reported at the send") {
  const ValidationResult result = validate(send_without_recv());
  check_reported(result, ValidationError::unmatched_send, 1, 9, {OpKind::send_gradient, 0});
  CHECK(result.other == Op{OpKind::recv_gradient, 0});
  CHECK(result.other_device == 0);
}

TEST_CASE("a micro-batch out of range is a bad shape at that op") {
  const ValidationResult result = validate(micro_batch_out_of_range());
  check_reported(result, ValidationError::bad_shape, 1, 3, {OpKind::forward, 2});
  const std::string text = gpipe::describe(result);
  CHECK(contains(text, "device 1, position 3, forward(micro-batch 2, chunk 0)"));
  CHECK(contains(text, "num_micro_batches"));
}

TEST_CASE("a chunk out of range is a bad shape at that op") {
  check_reported(validate(chunk_out_of_range()), ValidationError::bad_shape, 0, 4,
                 {OpKind::recv_gradient, 1, 1});
}

TEST_CASE("a recv_activation on the first stage is an unexpected op") {
  const ValidationResult result = validate(recv_on_first_stage());
  check_reported(result, ValidationError::unexpected_op, 0, 0, {OpKind::recv_activation, 0});
  CHECK(contains(gpipe::describe(result), "first stage receives no activation"));
}

TEST_CASE("a schedule whose lists do not match its device count is a bad shape") {
  Schedule s = gpipe22();
  s.ops.pop_back();
  const ValidationResult result = validate(s);
  CHECK(result.error == ValidationError::bad_shape);
  CHECK(result.device == ValidationResult::npos);
  CHECK(contains(gpipe::describe(result), "num_devices"));

  CHECK(validate(Schedule{}).error == ValidationError::bad_shape);
  CHECK(validate(Schedule{.num_devices = 1, .num_micro_batches = 0, .ops = {{}}}).error ==
        ValidationError::bad_shape);
  CHECK(validate(Schedule{.num_devices = 1, .num_micro_batches = 1, .num_chunks = 0, .ops = {{}}})
            .error == ValidationError::bad_shape);
}

TEST_CASE("require_valid throws a gpipe::Error that carries the description") {
  const ValidationResult result = validate(both_recv_first());
  CHECK_THROWS_WITH_AS(gpipe::require_valid(both_recv_first()),
                       ("gpipe: " + gpipe::describe(result)).c_str(), gpipe::Error);
}
