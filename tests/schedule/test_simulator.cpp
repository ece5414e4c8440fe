// The simulator on GPipe, against closed forms. With K devices, M micro-batches and costs F, B,
// W, t (transfer), fill-drain takes
//   makespan = M (F + B + W) + (K - 1)(F + B + W + 2t),
// because the fill and the drain each cross K-1 hops and B and W run back to back before the
// gradient is sent. Hence with t = 0 the bubble is the textbook (K-1)/(M+K-1) for any F, B, W.

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"

namespace {

using gpipe::make_gpipe_schedule;
using gpipe::Op;
using gpipe::OpCosts;
using gpipe::OpKind;
using gpipe::simulate;
using gpipe::SimulationResult;

constexpr bool near(double a, double b) { return a - b <= 1e-12 && b - a <= 1e-12; }

constexpr double textbook_bubble(double k, double m) { return (k - 1) / (m + k - 1); }

constexpr double gpipe_makespan(double k, double m, const OpCosts& c) {
  return m * (c.forward + c.backward_input + c.backward_weight) +
         (k - 1) * (c.forward + c.backward_input + c.backward_weight + 2 * c.transfer);
}

constexpr double gpipe_bubble(double k, double m, const OpCosts& c) {
  const double fbw = c.forward + c.backward_input + c.backward_weight;
  return (k - 1) * fbw / (m * fbw + (k - 1) * fbw);
}

constexpr OpCosts fused{.forward = 1, .backward_input = 1, .backward_weight = 0};
constexpr OpCosts equal{};  // F = B = W = 1

constexpr bool bubble_is_textbook(std::size_t k, std::size_t m) {
  return near(simulate(make_gpipe_schedule(k, m), fused).bubble_fraction,
              textbook_bubble(static_cast<double>(k), static_cast<double>(m)));
}
static_assert(bubble_is_textbook(1, 1));
static_assert(bubble_is_textbook(1, 4));
static_assert(bubble_is_textbook(2, 1));
static_assert(bubble_is_textbook(4, 2));
static_assert(bubble_is_textbook(4, 4));
static_assert(bubble_is_textbook(4, 8));
static_assert(bubble_is_textbook(8, 3));

constexpr bool bubble_matches(std::size_t k, std::size_t m, OpCosts c) {
  return near(simulate(make_gpipe_schedule(k, m), c).bubble_fraction,
              gpipe_bubble(static_cast<double>(k), static_cast<double>(m), c));
}
static_assert(bubble_matches(4, 8, equal));
static_assert(bubble_matches(3, 2, equal));
static_assert(bubble_matches(5, 7, {.forward = 1, .backward_input = 2, .backward_weight = 1}));
static_assert(near(simulate(make_gpipe_schedule(4, 8), equal).bubble_fraction, 3.0 / 11.0));
static_assert(near(simulate(make_gpipe_schedule(4, 8), equal).bubble_fraction,
                   textbook_bubble(4, 8)));

constexpr bool makespan_matches(std::size_t k, std::size_t m, OpCosts c) {
  return near(simulate(make_gpipe_schedule(k, m), c).makespan,
              gpipe_makespan(static_cast<double>(k), static_cast<double>(m), c));
}
static_assert(makespan_matches(4, 8, equal));
static_assert(makespan_matches(4, 8, {.transfer = 0.5}));
static_assert(makespan_matches(
    2, 3, {.forward = 2, .backward_input = 3, .backward_weight = 1, .transfer = 0.25}));

constexpr bool peak_is_m_everywhere(std::size_t k, std::size_t m) {
  const SimulationResult r = simulate(make_gpipe_schedule(k, m));
  for (std::size_t peak : r.peak_live_activations) {
    if (peak != m) return false;
  }
  return r.peak_live_activations.size() == k;
}
static_assert(peak_is_m_everywhere(1, 1));
static_assert(peak_is_m_everywhere(4, 2));
static_assert(peak_is_m_everywhere(3, 9));

}  // namespace

TEST_CASE("GPipe's bubble is (K-1)/(M+K-1) also when backward_weight costs nothing") {
  for (std::size_t k : {1, 2, 3, 4, 8, 16}) {
    for (std::size_t m : {1, 2, 4, 7, 32}) {
      for (const OpCosts& c :
           {fused, OpCosts{.forward = 2, .backward_input = 3, .backward_weight = 0}}) {
        CAPTURE(k);
        CAPTURE(m);
        const SimulationResult r = simulate(make_gpipe_schedule(k, m), c);
        CHECK(r.bubble_fraction ==
              doctest::Approx(textbook_bubble(static_cast<double>(k), static_cast<double>(m)))
                  .epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("GPipe's bubble is (K-1)/(M+K-1) with equal op costs") {
  for (std::size_t k : {1, 2, 3, 4, 8, 16}) {
    for (std::size_t m : {1, 2, 4, 7, 32}) {
      CAPTURE(k);
      CAPTURE(m);
      const SimulationResult r = simulate(make_gpipe_schedule(k, m), equal);
      const auto kd = static_cast<double>(k);
      const auto md = static_cast<double>(m);
      CHECK(r.bubble_fraction == doctest::Approx(gpipe_bubble(kd, md, equal)).epsilon(1e-12));
      CHECK(r.bubble_fraction == doctest::Approx(textbook_bubble(kd, md)).epsilon(1e-12));
      CHECK(r.makespan == doctest::Approx(gpipe_makespan(kd, md, equal)));
      for (double busy : r.busy) CHECK(busy == doctest::Approx(3 * md));
    }
  }
}

TEST_CASE("GPipe keeps all M activation stashes alive on every device") {
  for (std::size_t k : {1, 2, 5}) {
    for (std::size_t m : {1, 3, 8}) {
      const SimulationResult r = simulate(make_gpipe_schedule(k, m));
      REQUIRE(r.peak_live_activations.size() == k);
      for (std::size_t peak : r.peak_live_activations) CHECK(peak == m);
    }
  }
}

TEST_CASE("a positive transfer cost makes the makespan longer") {
  const gpipe::Schedule s = make_gpipe_schedule(4, 6);
  const SimulationResult free = simulate(s);
  const SimulationResult slow = simulate(s, {.transfer = 0.5});
  CHECK(slow.makespan > free.makespan);
  CHECK(slow.makespan == doctest::Approx(gpipe_makespan(4, 6, {.transfer = 0.5})));
  CHECK(slow.bubble_fraction > free.bubble_fraction);
  CHECK(simulate(make_gpipe_schedule(1, 6), {.transfer = 0.5}).makespan ==
        doctest::Approx(simulate(make_gpipe_schedule(1, 6)).makespan));
}

TEST_CASE("op timings respect device order, op costs and transfer latency") {
  const gpipe::Schedule s = make_gpipe_schedule(3, 4);
  const OpCosts c{.forward = 1, .backward_input = 2, .backward_weight = 0.5, .transfer = 0.25};
  const SimulationResult r = simulate(s, c);
  REQUIRE(r.start.size() == 3);
  REQUIRE(r.finish.size() == 3);
  for (std::size_t d = 0; d < 3; ++d) {
    REQUIRE(r.start[d].size() == s.ops[d].size());
    REQUIRE(r.finish[d].size() == s.ops[d].size());
    for (std::size_t p = 0; p < s.ops[d].size(); ++p) {
      const Op& op = s.ops[d][p];
      if (p > 0) CHECK(r.start[d][p] >= r.finish[d][p - 1]);
      const double length = r.finish[d][p] - r.start[d][p];
      switch (op.kind) {
        case OpKind::forward:
          CHECK(length == c.forward);
          break;
        case OpKind::backward_input:
          CHECK(length == c.backward_input);
          break;
        case OpKind::backward_weight:
          CHECK(length == c.backward_weight);
          break;
        default:
          CHECK(length == 0);
          break;
      }
      if (op.kind == OpKind::recv_activation || op.kind == OpKind::recv_gradient) {
        const bool activation = op.kind == OpKind::recv_activation;
        const std::size_t from = activation ? d - 1 : d + 1;
        const OpKind send = activation ? OpKind::send_activation : OpKind::send_gradient;
        std::size_t q = 0;
        while (!(s.ops[from][q] == Op{send, op.micro_batch})) ++q;
        CHECK(r.start[d][p] >= r.finish[from][q] + c.transfer);
      }
    }
  }
}

TEST_CASE("simulating a schedule that does not validate throws gpipe::Error") {
  gpipe::Schedule s = make_gpipe_schedule(2, 2);
  // Drop device 1's backward_weight of micro-batch 0; its send_gradient stays, so only W is
  // missing.
  const auto w0 = std::find(s.ops[1].begin(), s.ops[1].end(), Op{OpKind::backward_weight, 0});
  REQUIRE(w0 != s.ops[1].end());
  s.ops[1].erase(w0);
  REQUIRE(gpipe::validate(s).error == gpipe::ValidationError::missing_op);
  CHECK_THROWS_WITH_AS(simulate(s), doctest::Contains("missing_op"), gpipe::Error);
  CHECK_THROWS_WITH_AS(simulate(s), doctest::Contains("backward_weight(micro-batch 0, chunk 0)"),
                       gpipe::Error);
  CHECK_THROWS_AS(simulate(make_gpipe_schedule(2, 2), {.forward = -1}), gpipe::Error);
}

TEST_CASE("a schedule without compute cost has no bubble") {
  const SimulationResult r = simulate(make_gpipe_schedule(3, 2),
                                      {.forward = 0, .backward_input = 0, .backward_weight = 0});
  CHECK(r.makespan == 0);
  CHECK(r.bubble_fraction == 0);
}

// Costs per device: device 1 takes 2 per op, device 0 takes 1. Device 1 is the bottleneck: its
// forwards run back to back from t = 1 (device 0's first forward) to 1 + 2M, its backwards (B and
// W, then the gradient is sent; 4 per micro-batch) to 1 + 6M; device 0's B and W of the last
// gradient add 2. makespan = 3 + 6M, busy = 3M + 6M.
constexpr double unbalanced_bubble(std::size_t m) {
  constexpr std::array<OpCosts, 2> costs{
      equal, OpCosts{.forward = 2, .backward_input = 2, .backward_weight = 2}};
  const SimulationResult r = simulate(make_gpipe_schedule(2, m), costs);
  const double md = static_cast<double>(m);
  return near(r.makespan, 3 + 6 * md) ? r.bubble_fraction : -1;
}
static_assert(near(unbalanced_bubble(1), 1 - 9.0 / 18));
static_assert(near(unbalanced_bubble(4), 1 - 36.0 / 54));  // 1/3, where balanced: 1/5
static_assert(near(unbalanced_bubble(8), 1 - 72.0 / 102));

TEST_CASE("costs per device: the same costs everywhere give the uniform simulation") {
  const gpipe::Schedule s = make_gpipe_schedule(3, 4);
  const std::vector<OpCosts> same(3, OpCosts{.forward = 1, .backward_input = 2, .transfer = 0.5});
  const SimulationResult per_device = simulate(s, same);
  const SimulationResult uniform = simulate(s, same[0]);
  CHECK(per_device.makespan == uniform.makespan);
  CHECK(per_device.bubble_fraction == uniform.bubble_fraction);
  CHECK(per_device.finish == uniform.finish);
}

TEST_CASE("costs per device: one OpCosts per device, non-negative, or gpipe::Error") {
  const gpipe::Schedule s = make_gpipe_schedule(3, 2);
  CHECK_THROWS_WITH_AS(simulate(s, std::vector<OpCosts>(2)),
                       doctest::Contains("op costs for 2 devices; the schedule has 3"),
                       gpipe::Error);
  std::vector<OpCosts> costs(3);
  costs[2].backward_weight = -1;
  CHECK_THROWS_WITH_AS(simulate(s, costs), doctest::Contains("non-negative"), gpipe::Error);
}

TEST_CASE("costs per stage: each op takes its own stage's costs, a recv its stage's transfer") {
  // interleaved 1F1B on K 2, 2 chunks, M 1: stages 0..3 on devices 0, 1, 0, 1 run one after
  // another, F forward through the stages, then B W back; a recv of stage s waits transfer_s
  // (activations into stages 1, 2, 3, gradients into stages 2, 1, 0)
  const gpipe::Schedule s = gpipe::make_interleaved_schedule(2, 2, 1);
  std::vector<OpCosts> stage(4);
  double work = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    const auto x = static_cast<double>(i + 1);
    stage[i] = {
        .forward = x, .backward_input = 10 * x, .backward_weight = 100 * x, .transfer = 1000 * x};
    work += 111 * x;
  }
  const SimulationResult r = simulate(s, stage);
  CHECK(r.makespan == work + 1000 * (1 + 2 * 2 + 2 * 3 + 4));
  CHECK(r.busy[0] == 111 * (1 + 3));
  CHECK(r.busy[1] == 111 * (2 + 4));
  // the same costs for both stages of a device: the per-device simulation
  const gpipe::Schedule v = gpipe::make_zb_v_schedule(2, 4);
  const std::vector<OpCosts> device = {{.forward = 1, .backward_input = 2, .transfer = 0.5},
                                       {.forward = 3, .backward_input = 1, .backward_weight = 2}};
  std::vector<OpCosts> same(4);
  for (std::size_t i = 0; i < 4; ++i) same[i] = device[v.device_of_stage(i)];
  CHECK(simulate(v, same).finish == simulate(v, device).finish);
  // neither one per device nor one per stage
  CHECK_THROWS_WITH_AS(simulate(v, std::vector<OpCosts>(3)),
                       doctest::Contains("op costs for 3 devices; the schedule has 2 devices and "
                                         "4 stages"),
                       gpipe::Error);
}

// Devices sharing cores (simulate_on_cores). GPipe on K 2, M 2, F 1, B = W = 0, one core:
// device 0's F0 runs alone on [0, 1]; then device 0's F1 and device 1's F0 run at once at half
// rate, both ending at 3 (where simulate ends them at 2); device 1's F1 runs alone on [3, 4].
TEST_CASE("devices sharing one core: two forwards at once take twice as long") {
  const gpipe::Schedule s = make_gpipe_schedule(2, 2);
  const OpCosts f{.forward = 1, .backward_input = 0, .backward_weight = 0};
  const SimulationResult r = gpipe::simulate_on_cores(s, std::vector<OpCosts>(2, f), 1);
  CHECK(r.makespan == 4);
  CHECK(simulate(s, f).makespan == 3);
  std::vector<double> forward_finish[2];
  for (std::size_t d = 0; d < 2; ++d)
    for (std::size_t p = 0; p < s.ops[d].size(); ++p)
      if (s.ops[d][p].kind == OpKind::forward) forward_finish[d].push_back(r.finish[d][p]);
  CHECK(forward_finish[0] == std::vector<double>{1, 3});
  CHECK(forward_finish[1] == std::vector<double>{3, 4});
  CHECK(r.busy[0] == 3);  // stretched, as a trace records it
  CHECK(r.busy[1] == 3);
}

TEST_CASE("devices sharing cores: as many cores as devices (or 0) is simulate; fewer, bounded") {
  // per-stage costs that differ, a transfer, several schedules
  const auto costs_for = [](const gpipe::Schedule& s) {
    std::vector<OpCosts> c;
    for (std::size_t i = 0; i < s.num_stages(); ++i) {
      const auto x = static_cast<double>(i + 1);
      c.push_back({.forward = 1 + 0.5 * x,
                   .backward_input = 2 + 0.25 * x,
                   .backward_weight = 0.5 * x,
                   .transfer = 0.125});
    }
    return c;
  };
  const std::vector<gpipe::Schedule> schedules = {
      make_gpipe_schedule(4, 8), gpipe::make_1f1b_schedule(4, 8), gpipe::make_zb_h1_schedule(4, 8),
      gpipe::make_interleaved_schedule(2, 2, 4), gpipe::make_zb_v_schedule(2, 4)};
  for (const gpipe::Schedule& s : schedules) {
    const std::vector<OpCosts> c = costs_for(s);
    const SimulationResult alone = simulate(s, c);
    for (const double cores : {0.0, static_cast<double>(s.num_devices), 8.0}) {
      const SimulationResult r = gpipe::simulate_on_cores(s, c, cores);
      CHECK(r.finish == alone.finish);
      CHECK(r.start == alone.start);
      CHECK(r.busy == alone.busy);
    }
    double work = 0;
    for (std::size_t d = 0; d < s.num_devices; ++d) work += alone.busy[d];
    for (const double cores : {1.0, 1.5, 2.0, 3.0}) {
      if (cores >= static_cast<double>(s.num_devices)) continue;
      const SimulationResult r = gpipe::simulate_on_cores(s, c, cores);
      // never faster than the devices alone or than the cores doing all the work; an op
      // stretches at most K / cores times
      CHECK(r.makespan >= alone.makespan - 1e-9);
      CHECK(r.makespan >= work / cores - 1e-9);
      CHECK(r.makespan <= alone.makespan * static_cast<double>(s.num_devices) / cores + 1e-9);
      CHECK(r.peak_live_activations == alone.peak_live_activations);
    }
    // one core and no transfer: something always runs, so the step is the total work
    std::vector<OpCosts> no_transfer = c;
    for (OpCosts& o : no_transfer) o.transfer = 0;
    CHECK(gpipe::simulate_on_cores(s, no_transfer, 1).makespan == doctest::Approx(work));
  }
  CHECK_THROWS_AS(gpipe::simulate_on_cores(schedules[0], costs_for(schedules[0]), -1),
                  gpipe::Error);
}

namespace {

// Checks issue_order(s): every op once, each device's list in order, every recv after its send,
// and the simulated start times along the order never decreasing.
void check_issue_order(const gpipe::Schedule& s) {
  const std::vector<gpipe::OpPlace> order = gpipe::issue_order(s);
  const SimulationResult timed = simulate(s);
  std::vector<std::size_t> next(s.num_devices, 0);
  std::size_t total = 0;
  for (const auto& ops : s.ops) total += ops.size();
  REQUIRE(order.size() == total);
  double last_start = 0;
  for (const gpipe::OpPlace& place : order) {
    REQUIRE(place.device < s.num_devices);
    CHECK(place.position == next[place.device]);
    next[place.device] = place.position + 1;
    const Op& op = s.ops[place.device][place.position];
    if (gpipe::is_recv(op.kind)) {
      // its send: the op of the neighbouring stage for the same micro-batch, issued already
      const std::size_t stage = s.stage_of(place.device, op.chunk);
      const bool gradient = op.kind == OpKind::recv_gradient;
      const std::size_t from = gradient ? stage + 1 : stage - 1;
      const std::size_t d = s.device_of_stage(from);
      const OpKind send = gradient ? OpKind::send_gradient : OpKind::send_activation;
      bool sent = false;
      for (std::size_t p = 0; p < next[d] && !sent; ++p) {
        const Op& o = s.ops[d][p];
        sent = o.kind == send && o.micro_batch == op.micro_batch && s.stage_of(d, o.chunk) == from;
      }
      CHECK_MESSAGE(sent, "a recv of micro-batch ", op.micro_batch, " on device ", place.device,
                    " is issued before its send");
    }
    const double start = timed.start[place.device][place.position];
    CHECK(start >= last_start);
    last_start = start;
  }
}

}  // namespace

TEST_CASE("issue_order issues every schedule's ops by simulated start, recvs after their sends") {
  for (std::size_t k : {1, 2, 4}) {
    for (std::size_t m : {1, 4, 8, 16}) {
      CAPTURE(k);
      CAPTURE(m);
      check_issue_order(gpipe::GPipe::make(k, m));
      check_issue_order(gpipe::OneFOneB::make(k, m));
      check_issue_order(gpipe::Interleaved<2>::make(k, m));
      check_issue_order(gpipe::LoopedBFS<2>::make(k, m));
      check_issue_order(gpipe::ZeroBubbleH1::make(k, m));
      check_issue_order(gpipe::ZeroBubbleH2::make(k, m));
      check_issue_order(gpipe::ZeroBubbleV::make(k, m));
      if (m >= 2 * k) check_issue_order(gpipe::DualPipeV::make(k, m));
    }
  }
}

TEST_CASE(
    "issue_order hands GPipe's second device its first op before the first device's M "
    "forwards are issued") {
  // Issued device by device, device 1's first op would come after device 0's 64 forwards and
  // sends: a GPU whose issuing thread is not far ahead idles device 1 for all of them.
  const gpipe::Schedule s = gpipe::GPipe::make(2, 64);
  const std::vector<gpipe::OpPlace> order = gpipe::issue_order(s);
  const auto first_of_device_1 = std::find_if(
      order.begin(), order.end(), [](const gpipe::OpPlace& p) { return p.device == 1; });
  REQUIRE(first_of_device_1 != order.end());
  CHECK(first_of_device_1 - order.begin() <= 3);  // F0, send0 (and F1 at the same time) first
  // and the whole order alternates: the longest run of one device is the turn from forwards to
  // backwards, where device 1 alone has work (recv, F, B, W and send of the last micro-batch)
  std::size_t run = 0, longest = 0;
  for (std::size_t i = 1; i < order.size(); ++i) {
    run = order[i].device == order[i - 1].device ? run + 1 : 0;
    longest = std::max(longest, run + 1);
  }
  CHECK(longest <= 5);
}

TEST_CASE("issue_order of an invalid schedule throws gpipe::Error") {
  gpipe::Schedule s = gpipe::GPipe::make(2, 2);
  s.ops[1].erase(s.ops[1].begin());  // device 1 loses its first recv
  CHECK_THROWS_AS(gpipe::issue_order(s), gpipe::Error);
}
