// The GPipe fill-drain generator: exact op order, op counts, validity for many (K, M), the tag.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"

namespace {

using gpipe::make_gpipe_schedule;
using gpipe::Op;
using gpipe::OpKind;
using gpipe::validate;

static_assert(validate(make_gpipe_schedule(1, 1)));
static_assert(validate(make_gpipe_schedule(1, 5)));
static_assert(validate(make_gpipe_schedule(2, 1)));
static_assert(validate(make_gpipe_schedule(4, 1)));
static_assert(validate(make_gpipe_schedule(4, 2)));  // M < K
static_assert(validate(make_gpipe_schedule(4, 4)));
static_assert(validate(make_gpipe_schedule(4, 8)));
static_assert(validate(make_gpipe_schedule(8, 3)));
static_assert(validate(make_gpipe_schedule(3, 16)));

static_assert(gpipe::GPipe::chunks_per_device == 1);
static_assert(gpipe::GPipe::name == "gpipe");
static_assert(gpipe::GPipe::make(3, 4) == make_gpipe_schedule(3, 4));

static_assert(gpipe::to_string(OpKind::forward) == "forward");
static_assert(gpipe::to_string(OpKind::backward_input) == "backward_input");
static_assert(gpipe::to_string(OpKind::backward_weight) == "backward_weight");
static_assert(gpipe::to_string(OpKind::send_activation) == "send_activation");
static_assert(gpipe::to_string(OpKind::recv_activation) == "recv_activation");
static_assert(gpipe::to_string(OpKind::send_gradient) == "send_gradient");
static_assert(gpipe::to_string(OpKind::recv_gradient) == "recv_gradient");

constexpr bool runs_all_forwards_first(std::size_t k, std::size_t m) {
  const gpipe::Schedule s = make_gpipe_schedule(k, m);
  for (const std::vector<Op>& ops : s.ops) {
    bool seen_backward = false;
    for (const Op& op : ops) {
      if (op.kind == OpKind::forward && seen_backward) return false;
      seen_backward = seen_backward || op.kind == OpKind::backward_input;
    }
  }
  return true;
}
static_assert(runs_all_forwards_first(4, 6));

}  // namespace

TEST_CASE("a two-device two-micro-batch GPipe schedule has the documented op order") {
  const gpipe::Schedule s = make_gpipe_schedule(2, 2);
  CHECK(s.num_devices == 2);
  CHECK(s.num_micro_batches == 2);
  CHECK(s.num_chunks == 1);
  REQUIRE(s.ops.size() == 2);
  const std::vector<Op> first{
      {OpKind::forward, 0},         {OpKind::send_activation, 0}, {OpKind::forward, 1},
      {OpKind::send_activation, 1}, {OpKind::recv_gradient, 1},   {OpKind::backward_input, 1},
      {OpKind::backward_weight, 1}, {OpKind::recv_gradient, 0},   {OpKind::backward_input, 0},
      {OpKind::backward_weight, 0},
  };
  const std::vector<Op> last{
      {OpKind::recv_activation, 0}, {OpKind::forward, 0},        {OpKind::recv_activation, 1},
      {OpKind::forward, 1},         {OpKind::backward_input, 1}, {OpKind::backward_weight, 1},
      {OpKind::send_gradient, 1},   {OpKind::backward_input, 0}, {OpKind::backward_weight, 0},
      {OpKind::send_gradient, 0},
  };
  CHECK(s.ops[0] == first);
  CHECK(s.ops[1] == last);
}

TEST_CASE("a single-device GPipe schedule has no sends or recvs") {
  const gpipe::Schedule s = make_gpipe_schedule(1, 3);
  REQUIRE(s.ops.size() == 1);
  const std::vector<Op> expected{
      {OpKind::forward, 0},         {OpKind::forward, 1},         {OpKind::forward, 2},
      {OpKind::backward_input, 2},  {OpKind::backward_weight, 2}, {OpKind::backward_input, 1},
      {OpKind::backward_weight, 1}, {OpKind::backward_input, 0},  {OpKind::backward_weight, 0},
  };
  CHECK(s.ops[0] == expected);
}

TEST_CASE("every GPipe device holds three compute ops plus its transfers per micro-batch") {
  for (std::size_t k : {1, 2, 3, 5}) {
    for (std::size_t m : {1, 2, 7}) {
      const gpipe::Schedule s = make_gpipe_schedule(k, m);
      for (std::size_t d = 0; d < k; ++d) {
        const std::size_t transfers = (d > 0 ? 2 : 0) + (d + 1 < k ? 2 : 0);
        CHECK(s.ops[d].size() == m * (3 + transfers));
      }
    }
  }
}

TEST_CASE("GPipe schedules validate at run time for larger pipelines") {
  for (std::size_t k : {1, 2, 7, 16}) {
    for (std::size_t m : {1, 3, 16, 64}) {
      const gpipe::ValidationResult result = validate(make_gpipe_schedule(k, m));
      CHECK_MESSAGE(result.ok, gpipe::describe(result));
    }
  }
}

TEST_CASE("GPipe stages map one to one onto devices") {
  const gpipe::Schedule s = make_gpipe_schedule(4, 2);
  CHECK(s.num_stages() == 4);
  for (std::size_t d = 0; d < 4; ++d) {
    CHECK(s.stage_of(d, 0) == d);
    CHECK(s.device_of_stage(d) == d);
    CHECK(s.chunk_of_stage(d) == 0);
  }
}

TEST_CASE("virtual stages are assigned to devices round robin") {
  const gpipe::Schedule s{.num_devices = 3, .num_micro_batches = 1, .num_chunks = 2};
  CHECK(s.num_stages() == 6);
  CHECK(s.stage_of(0, 1) == 3);
  CHECK(s.stage_of(2, 1) == 5);
  CHECK(s.device_of_stage(4) == 1);
  CHECK(s.chunk_of_stage(4) == 1);
  CHECK(s.chunk_of_stage(2) == 0);
}

TEST_CASE("a GPipe schedule without devices or micro-batches is an error") {
  CHECK_THROWS_AS(make_gpipe_schedule(0, 4), gpipe::Error);
  CHECK_THROWS_AS(make_gpipe_schedule(4, 0), gpipe::Error);
  CHECK_THROWS_WITH_AS(make_gpipe_schedule(4, 0), doctest::Contains("micro-batch"), gpipe::Error);
}
