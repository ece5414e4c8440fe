// The 1F1B (PipeDream-Flush) generator: proven valid at compile time over a grid of (K, M), its
// exact op order, and the simulator's verdict against the published results: with B and W back
// to back the bubble is GPipe's (K-1)/(M+K-1), the makespan (M+K-1)(F+B+W), and device d keeps
// at most min(M, K-d) activation stashes where GPipe keeps M.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"
#include "support/schedule_timeline.hpp"

namespace {

using gpipe::make_1f1b_schedule;
using gpipe::make_gpipe_schedule;
using gpipe::Op;
using gpipe::OpCosts;
using gpipe::OpKind;
using gpipe::Schedule;
using gpipe::simulate;
using gpipe::SimulationResult;

template <std::size_t... N>
struct sizes {};

template <std::size_t K, std::size_t M>
constexpr Schedule one_f_one_b() {
  return make_1f1b_schedule(K, M);
}
template <std::size_t K, std::size_t... M>
consteval bool valid_for_all_m(sizes<M...>) {
  return (gpipe::valid_at_compile_time<one_f_one_b<K, M>> && ...);
}
template <std::size_t... K>
consteval bool valid_grid(sizes<K...>) {
  return (valid_for_all_m<K>(sizes<1, 2, 3, 4, 8, 16>{}) && ...);
}
static_assert(valid_grid(sizes<1, 2, 3, 4, 8>{}));

static_assert(gpipe::OneFOneB::chunks_per_device == 1);
static_assert(gpipe::OneFOneB::name == "1f1b");
static_assert(gpipe::OneFOneB::make(3, 5) == make_1f1b_schedule(3, 5));
// One device and one micro-batch leave nothing to order: F B W in both.
static_assert(make_1f1b_schedule(1, 1) == make_gpipe_schedule(1, 1));

constexpr bool near(double a, double b) { return a - b <= 1e-12 && b - a <= 1e-12; }
constexpr double textbook_bubble(double k, double m) { return (k - 1) / (m + k - 1); }

constexpr OpCosts equal{};  // F = B = W = 1
constexpr OpCosts fused{.forward = 1, .backward_input = 1, .backward_weight = 0};

constexpr bool bubble_is_textbook(std::size_t k, std::size_t m, OpCosts c) {
  const auto kd = static_cast<double>(k);
  const auto md = static_cast<double>(m);
  const SimulationResult r = simulate(make_1f1b_schedule(k, m), c);
  const double step = c.forward + c.backward_input + c.backward_weight;
  return near(r.bubble_fraction, textbook_bubble(kd, md)) && near(r.makespan, (md + kd - 1) * step);
}
static_assert(bubble_is_textbook(4, 8, equal));  // 3/11 = 0.2727
static_assert(bubble_is_textbook(4, 8, fused));
static_assert(bubble_is_textbook(8, 3, equal));  // M < K
static_assert(bubble_is_textbook(1, 4, equal));
static_assert(near(simulate(make_1f1b_schedule(4, 8)).bubble_fraction, 3.0 / 11.0));

constexpr bool peaks_are_min_m_k_minus_d(std::size_t k, std::size_t m) {
  const SimulationResult r = simulate(make_1f1b_schedule(k, m));
  for (std::size_t d = 0; d < k; ++d) {
    const std::size_t bound = m < k - d ? m : k - d;
    if (r.peak_live_activations[d] != bound) return false;
  }
  return true;
}
static_assert(peaks_are_min_m_k_minus_d(4, 16));
static_assert(peaks_are_min_m_k_minus_d(4, 2));
static_assert(peaks_are_min_m_k_minus_d(8, 8));

}  // namespace

TEST_CASE("a two-device three-micro-batch 1F1B schedule has the documented op order") {
  const Schedule s = make_1f1b_schedule(2, 3);
  CHECK(s.num_devices == 2);
  CHECK(s.num_micro_batches == 3);
  CHECK(s.num_chunks == 1);
  REQUIRE(s.ops.size() == 2);
  // Device 0 warms up with one forward; device 1 (the last stage) alternates from the start.
  const std::vector<Op> first{
      {OpKind::forward, 0},         {OpKind::send_activation, 0}, {OpKind::forward, 1},
      {OpKind::send_activation, 1}, {OpKind::recv_gradient, 0},   {OpKind::backward_input, 0},
      {OpKind::backward_weight, 0}, {OpKind::forward, 2},         {OpKind::send_activation, 2},
      {OpKind::recv_gradient, 1},   {OpKind::backward_input, 1},  {OpKind::backward_weight, 1},
      {OpKind::recv_gradient, 2},   {OpKind::backward_input, 2},  {OpKind::backward_weight, 2},
  };
  const std::vector<Op> last{
      {OpKind::recv_activation, 0}, {OpKind::forward, 0},         {OpKind::backward_input, 0},
      {OpKind::backward_weight, 0}, {OpKind::send_gradient, 0},   {OpKind::recv_activation, 1},
      {OpKind::forward, 1},         {OpKind::backward_input, 1},  {OpKind::backward_weight, 1},
      {OpKind::send_gradient, 1},   {OpKind::recv_activation, 2}, {OpKind::forward, 2},
      {OpKind::backward_input, 2},  {OpKind::backward_weight, 2}, {OpKind::send_gradient, 2},
  };
  CHECK(s.ops[0] == first);
  CHECK(s.ops[1] == last);
}

TEST_CASE("the 1F1B timeline for K = 4, M = 8 and equal costs is the textbook picture") {
  const std::vector<std::string> expected{
      "FFFF......BWFBWFBWFBWFBW.BW.BW.BW",
      ".FFF....BWFBWFBWFBWFBWFBW.BW.BW..",
      "..FF..BWFBWFBWFBWFBWFBWFBW.BW....",
      "...FBWFBWFBWFBWFBWFBWFBWFBW......",
  };
  const std::vector<std::string> timeline = gpipe::test::render_timeline(make_1f1b_schedule(4, 8));
  INFO(gpipe::test::join_lines(timeline));
  CHECK(timeline == expected);
}

TEST_CASE("1F1B validates at run time for larger pipelines, also with fewer micro-batches") {
  for (std::size_t k : {1, 2, 5, 7, 16}) {
    for (std::size_t m : {1, 2, 3, 6, 15, 16, 17, 64}) {
      const gpipe::ValidationResult result = gpipe::validate(make_1f1b_schedule(k, m));
      CHECK_MESSAGE(result.ok, gpipe::describe(result));
    }
  }
}

TEST_CASE("1F1B runs every backward_weight right after its backward_input, as GPipe") {
  for (std::size_t k : {1, 3, 4}) {
    for (std::size_t m : {1, 2, 5}) {
      const Schedule s = make_1f1b_schedule(k, m);
      for (const std::vector<Op>& ops : s.ops) {
        for (std::size_t p = 0; p < ops.size(); ++p) {
          if (ops[p].kind != OpKind::backward_input) continue;
          REQUIRE(p + 1 < ops.size());
          CHECK(ops[p + 1] == Op{OpKind::backward_weight, ops[p].micro_batch});
        }
      }
    }
  }
}

TEST_CASE("1F1B's bubble is GPipe's (K-1)/(M+K-1) when B and W run back to back") {
  for (std::size_t k : {1, 2, 3, 4, 8, 16}) {
    for (std::size_t m : {1, 2, 4, 7, 8, 32}) {
      for (const OpCosts& c : {equal, fused, OpCosts{.forward = 2, .backward_input = 3},
                               OpCosts{.forward = 1, .backward_input = 2, .backward_weight = 2}}) {
        CAPTURE(k);
        CAPTURE(m);
        const auto kd = static_cast<double>(k);
        const auto md = static_cast<double>(m);
        const SimulationResult r = simulate(make_1f1b_schedule(k, m), c);
        const SimulationResult g = simulate(make_gpipe_schedule(k, m), c);
        CHECK(r.bubble_fraction == doctest::Approx(textbook_bubble(kd, md)).epsilon(1e-12));
        CHECK(r.makespan == doctest::Approx(g.makespan).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("1F1B keeps at most min(M, K-d) stashes on device d where GPipe keeps M") {
  for (std::size_t k : {1, 2, 4, 8}) {
    for (std::size_t m : {1, 2, 4, 8, 16}) {
      CAPTURE(k);
      CAPTURE(m);
      const SimulationResult r = simulate(make_1f1b_schedule(k, m));
      const SimulationResult g = simulate(make_gpipe_schedule(k, m));
      REQUIRE(r.peak_live_activations.size() == k);
      CHECK(r.peak_live_activations[0] == std::min(m, k));
      CHECK(g.peak_live_activations[0] == m);
      for (std::size_t d = 0; d < k; ++d) {
        CAPTURE(d);
        CHECK(r.peak_live_activations[d] == std::min(m, k - d));
      }
    }
  }
}

TEST_CASE("a 1F1B schedule without devices or micro-batches is an error") {
  CHECK_THROWS_AS(make_1f1b_schedule(0, 4), gpipe::Error);
  CHECK_THROWS_WITH_AS(make_1f1b_schedule(4, 0), doctest::Contains("micro-batch"), gpipe::Error);
}
