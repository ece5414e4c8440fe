// The ZB-H1 generator (Qi et al., 2023): proven valid at compile time over a grid of (K, M), its
// exact op order, and the simulator against the paper: with T_W <= T_F the bubble per device is
// (K-1)(T_F + T_B - T_W) for M >= K, a third of 1F1B's (K-1)(T_F + T_B + T_W) when the three
// costs are equal, at 1F1B's peak of K live stashes.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"
#include "support/schedule_timeline.hpp"

namespace {

using gpipe::make_1f1b_schedule;
using gpipe::make_gpipe_schedule;
using gpipe::make_zb_h1_schedule;
using gpipe::Op;
using gpipe::OpCosts;
using gpipe::OpKind;
using gpipe::Schedule;
using gpipe::simulate;
using gpipe::SimulationResult;

template <std::size_t... N>
struct sizes {};

template <std::size_t K, std::size_t M>
constexpr Schedule zb_h1() {
  return make_zb_h1_schedule(K, M);
}
template <std::size_t K, std::size_t... M>
consteval bool valid_for_all_m(sizes<M...>) {
  return (gpipe::valid_at_compile_time<zb_h1<K, M>> && ...);
}
template <std::size_t... K>
consteval bool valid_grid(sizes<K...>) {
  return (valid_for_all_m<K>(sizes<1, 2, 3, 4, 8, 16>{}) && ...);
}
static_assert(valid_grid(sizes<1, 2, 3, 4, 8>{}));

static_assert(gpipe::ZeroBubbleH1::chunks_per_device == 1);
static_assert(gpipe::ZeroBubbleH1::name == "zb-h1");
static_assert(gpipe::ZeroBubbleH1::make(3, 5) == make_zb_h1_schedule(3, 5));

constexpr bool near(double a, double b) { return a - b <= 1e-9 && b - a <= 1e-9; }

// Idle time per device: makespan minus each device's M (F + B + W).
constexpr double bubble_time(const SimulationResult& r, std::size_t m, const OpCosts& c) {
  return r.makespan - static_cast<double>(m) * (c.forward + c.backward_input + c.backward_weight);
}

// The paper's ZB-H1 bubble, (K-1)(T_F + T_B - T_W), for M >= K and T_W <= T_F.
constexpr double paper_bubble_time(std::size_t k, const OpCosts& c) {
  return static_cast<double>(k - 1) * (c.forward + c.backward_input - c.backward_weight);
}

// For every M (T_W <= T_F): the fill, M (F, B) pairs on the last device, the drain, and
// max(M-K+1, 1) W's: (M+K-1)(T_F+T_B) + max(M-K+1, 1) T_W.
constexpr double zb_makespan(std::size_t k, std::size_t m, const OpCosts& c) {
  const double weights = m + 1 > k ? static_cast<double>(m + 1 - k) : 1.0;
  return static_cast<double>(m + k - 1) * (c.forward + c.backward_input) +
         weights * c.backward_weight;
}

constexpr OpCosts equal{};  // F = B = W = 1

constexpr bool matches_paper(std::size_t k, std::size_t m, OpCosts c) {
  const SimulationResult r = simulate(make_zb_h1_schedule(k, m), c);
  return near(bubble_time(r, m, c), paper_bubble_time(k, c)) &&
         near(r.makespan, zb_makespan(k, m, c));
}
static_assert(matches_paper(4, 8, equal));
static_assert(matches_paper(4, 4, equal));
static_assert(matches_paper(8, 16, {.forward = 2, .backward_input = 2, .backward_weight = 1}));
// K = 4, M = 8, equal costs: bubble 3/27 = 1/9 against 1F1B's 9/33 = 3/11.
static_assert(near(simulate(make_zb_h1_schedule(4, 8)).bubble_fraction, 1.0 / 9.0));
static_assert(near(simulate(make_1f1b_schedule(4, 8)).bubble_fraction, 3.0 / 11.0));

constexpr bool peaks_are_min_m_k(std::size_t k, std::size_t m) {
  const SimulationResult r = simulate(make_zb_h1_schedule(k, m));
  for (std::size_t peak : r.peak_live_activations) {
    if (peak != std::min(m, k)) return false;
  }
  return true;
}
static_assert(peaks_are_min_m_k(4, 16));
static_assert(peaks_are_min_m_k(4, 2));
static_assert(peaks_are_min_m_k(8, 8));

}  // namespace

TEST_CASE("a two-device three-micro-batch ZB-H1 schedule has the documented op order") {
  const Schedule s = make_zb_h1_schedule(2, 3);
  REQUIRE(s.ops.size() == 2);
  // Device 0 runs W right after B (it postpones none); device 1 runs each W one slot late and
  // sends every gradient right after its B.
  const std::vector<Op> first{
      {OpKind::forward, 0},         {OpKind::send_activation, 0}, {OpKind::forward, 1},
      {OpKind::send_activation, 1}, {OpKind::recv_gradient, 0},   {OpKind::backward_input, 0},
      {OpKind::backward_weight, 0}, {OpKind::forward, 2},         {OpKind::send_activation, 2},
      {OpKind::recv_gradient, 1},   {OpKind::backward_input, 1},  {OpKind::backward_weight, 1},
      {OpKind::recv_gradient, 2},   {OpKind::backward_input, 2},  {OpKind::backward_weight, 2},
  };
  const std::vector<Op> last{
      {OpKind::recv_activation, 0}, {OpKind::forward, 0},         {OpKind::backward_input, 0},
      {OpKind::send_gradient, 0},   {OpKind::recv_activation, 1}, {OpKind::forward, 1},
      {OpKind::backward_input, 1},  {OpKind::send_gradient, 1},   {OpKind::backward_weight, 0},
      {OpKind::recv_activation, 2}, {OpKind::forward, 2},         {OpKind::backward_input, 2},
      {OpKind::send_gradient, 2},   {OpKind::backward_weight, 1}, {OpKind::backward_weight, 2},
  };
  CHECK(s.ops[0] == first);
  CHECK(s.ops[1] == last);
}

TEST_CASE("the ZB-H1 timeline for K = 4, M = 8 and equal costs is the paper's picture") {
  // Figure 3 (top) of the paper: later devices run F, B pairs first and their W's at the end.
  const std::vector<std::string> expected{
      "FFFF...BWFBWFBWFBWFBWBWBWBW",
      ".FFF..BFBWFBWFBWFBWFBWBWBWW",
      "..FF.BFBFBWFBWFBWFBWFBWBWWW",
      "...FBFBFBFBWFBWFBWFBWFBWWWW",
  };
  const std::vector<std::string> timeline = gpipe::test::render_timeline(make_zb_h1_schedule(4, 8));
  INFO(gpipe::test::join_lines(timeline));
  CHECK(timeline == expected);
}

TEST_CASE("ZB-H1 validates at run time for larger pipelines, also with fewer micro-batches") {
  for (std::size_t k : {1, 2, 5, 7, 16}) {
    for (std::size_t m : {1, 2, 3, 6, 15, 16, 17, 64}) {
      const gpipe::ValidationResult result = gpipe::validate(make_zb_h1_schedule(k, m));
      CHECK_MESSAGE(result.ok, gpipe::describe(result));
    }
  }
}

TEST_CASE("ZB-H1 sends each input gradient right after its backward_input") {
  for (std::size_t k : {2, 3, 4}) {
    for (std::size_t m : {1, 2, 5}) {
      const Schedule s = make_zb_h1_schedule(k, m);
      for (std::size_t d = 1; d < k; ++d) {
        const std::vector<Op>& ops = s.ops[d];
        for (std::size_t p = 0; p < ops.size(); ++p) {
          if (ops[p].kind != OpKind::backward_input) continue;
          REQUIRE(p + 1 < ops.size());
          CHECK(ops[p + 1] == Op{OpKind::send_gradient, ops[p].micro_batch});
        }
      }
    }
  }
}

TEST_CASE("ZB-H1's bubble is the paper's (K-1)(T_F + T_B - T_W) per device for M >= K") {
  for (std::size_t k : {1, 2, 3, 4, 8}) {
    for (std::size_t m : {1, 2, 3, 4, 8, 16, 32}) {
      for (const OpCosts& c :
           {equal, OpCosts{.forward = 1, .backward_input = 2, .backward_weight = 1},
            OpCosts{.forward = 2, .backward_input = 1, .backward_weight = 1},
            OpCosts{.forward = 1, .backward_input = 1, .backward_weight = 0.5}}) {
        CAPTURE(k);
        CAPTURE(m);
        CAPTURE(c.forward);
        CAPTURE(c.backward_input);
        CAPTURE(c.backward_weight);
        const SimulationResult r = simulate(make_zb_h1_schedule(k, m), c);
        CHECK(r.makespan == doctest::Approx(zb_makespan(k, m, c)).epsilon(1e-12));
        if (m >= k) {
          CHECK(bubble_time(r, m, c) == doctest::Approx(paper_bubble_time(k, c)).epsilon(1e-12));
        }
      }
    }
  }
}

TEST_CASE("with equal costs ZB-H1's bubble is a third of 1F1B's, and below it for any M") {
  for (std::size_t k : {2, 3, 4, 8}) {
    for (std::size_t m : {1, 2, 3, 4, 8, 16, 32}) {
      CAPTURE(k);
      CAPTURE(m);
      const SimulationResult zb = simulate(make_zb_h1_schedule(k, m));
      const SimulationResult one_f_one_b = simulate(make_1f1b_schedule(k, m));
      CHECK(zb.bubble_fraction < one_f_one_b.bubble_fraction);
      if (m >= k) {
        // 1F1B idles (K-1)(F+B+W) = 3(K-1), ZB-H1 (K-1)(F+B-W) = K-1.
        CHECK(3 * bubble_time(zb, m, equal) ==
              doctest::Approx(bubble_time(one_f_one_b, m, equal)).epsilon(1e-12));
        const auto kd = static_cast<double>(k);
        const auto md = static_cast<double>(m);
        CHECK(zb.bubble_fraction == doctest::Approx((kd - 1) / (3 * md + kd - 1)).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("ZB-H1 keeps at most K stashes on every device where GPipe keeps M") {
  for (std::size_t k : {1, 2, 4, 8}) {
    for (std::size_t m : {1, 2, 4, 8, 16}) {
      CAPTURE(k);
      CAPTURE(m);
      const SimulationResult r = simulate(make_zb_h1_schedule(k, m));
      const SimulationResult one_f_one_b = simulate(make_1f1b_schedule(k, m));
      const SimulationResult g = simulate(make_gpipe_schedule(k, m));
      REQUIRE(r.peak_live_activations.size() == k);
      // The postponed W's raise later devices to device 0's peak, never above it.
      for (std::size_t d = 0; d < k; ++d) {
        CAPTURE(d);
        CHECK(r.peak_live_activations[d] == std::min(m, k));
        CHECK(r.peak_live_activations[d] <= one_f_one_b.peak_live_activations[0]);
      }
      CHECK(g.peak_live_activations[0] == m);
    }
  }
}

TEST_CASE("a ZB-H1 schedule without devices or micro-batches is an error") {
  CHECK_THROWS_AS(make_zb_h1_schedule(0, 4), gpipe::Error);
  CHECK_THROWS_WITH_AS(make_zb_h1_schedule(4, 0), doctest::Contains("micro-batch"), gpipe::Error);
}
