// The V-shaped placement (gpipe/schedule/op.hpp) and the schedules on it, ZB-V
// (gpipe/schedule/zero_bubble_v.hpp) and DualPipeV (gpipe/schedule/dual_pipe_v.hpp), and ZB-H2
// (gpipe/schedule/zero_bubble.hpp): the placement's stage <-> (device, chunk) maps; every
// generator proven valid at compile time on a grid of K and M and at run time for K up to 8 and
// M up to 24 under both send rules (after order_for_rendezvous); the simulated makespan against
// the least a synchronous step can take, (K-1) T_F' + M (T_F + T_B + T_W) with T_F' the first
// stage's forward (a half stage's in a V), which ZB-V reaches for M >= 2K-1 and ZB-H2 for M >= K
// with equal times, and DualPipeV for M >= 2K; peak stashes (ZB-V: 2K chunk stashes, 1F1B's memory;
// ZB-H2: 2K-1; DualPipeV: at most 2K+1, DeepSeek's PP+1); and DualPipeV's refusal of M < 2K.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"

namespace {

using gpipe::OpCosts;
using gpipe::Placement;
using gpipe::Schedule;
using gpipe::Sends;
using gpipe::simulate;

template <std::size_t... N>
struct sizes {};

template <std::size_t K, std::size_t M>
constexpr Schedule zb_v() {
  return gpipe::make_zb_v_schedule(K, M);
}
template <std::size_t K, std::size_t M>
constexpr Schedule zb_h2() {
  return gpipe::make_zb_h2_schedule(K, M);
}
template <std::size_t K, std::size_t M>
constexpr Schedule dual_pipe_v() {
  return gpipe::make_dual_pipe_v_schedule(K, M);
}
template <std::size_t K, std::size_t... M>
consteval bool valid_for_all_m(sizes<M...>) {
  return (
      (gpipe::valid_at_compile_time<zb_v<K, M>> && gpipe::valid_at_compile_time<zb_h2<K, M>>)&&...);
}
template <std::size_t... K>
consteval bool valid_grid(sizes<K...>) {
  return (valid_for_all_m<K>(sizes<1, 2, 3, 5, 8>{}) && ...);
}
static_assert(valid_grid(sizes<1, 2, 3, 4>{}));
static_assert(gpipe::valid_at_compile_time<dual_pipe_v<1, 2>>);
static_assert(gpipe::valid_at_compile_time<dual_pipe_v<2, 4>>);
static_assert(gpipe::valid_at_compile_time<dual_pipe_v<4, 8>>);
static_assert(gpipe::valid_at_compile_time<dual_pipe_v<3, 11>>);
// the tags, as the Trainer uses them
static_assert(gpipe::schedule_kind<gpipe::ZeroBubbleV> &&
              gpipe::ZeroBubbleV::chunks_per_device == 2);
static_assert(gpipe::schedule_kind<gpipe::DualPipeV> && gpipe::DualPipeV::chunks_per_device == 2);
static_assert(gpipe::schedule_kind<gpipe::ZeroBubbleH2> &&
              gpipe::ZeroBubbleH2::chunks_per_device == 1);

std::size_t peak(const gpipe::SimulationResult& r) {
  return *std::max_element(r.peak_live_activations.begin(), r.peak_live_activations.end());
}

// The least makespan of a synchronous step: the last device to start waits for the first
// forwards of all the devices before it, then runs its M (F + B + W).
double least_makespan(std::size_t k, std::size_t m, const OpCosts& stage, double first_forward) {
  return static_cast<double>(k - 1) * first_forward +
         static_cast<double>(m) * (stage.forward + stage.backward_input + stage.backward_weight);
}
OpCosts halved(const OpCosts& c) {
  return {.forward = c.forward / 2,
          .backward_input = c.backward_input / 2,
          .backward_weight = c.backward_weight / 2};
}

}  // namespace

TEST_CASE("a V-shaped placement: device d holds stages d and 2K-1-d, chunks zigzag") {
  const Schedule v{
      .num_devices = 4, .num_micro_batches = 1, .num_chunks = 2, .placement = Placement::v_shape};
  for (std::size_t d = 0; d < 4; ++d) {
    CHECK(v.stage_of(d, 0) == d);
    CHECK(v.stage_of(d, 1) == 7 - d);
  }
  for (std::size_t s = 0; s < 8; ++s) {
    CAPTURE(s);
    CHECK(v.stage_of(v.device_of_stage(s), v.chunk_of_stage(s)) == s);
    CHECK(v.chunk_of_stage(s) == s / 4);
  }
  // three chunks: down, up, down again
  const Schedule w{
      .num_devices = 3, .num_micro_batches = 1, .num_chunks = 3, .placement = Placement::v_shape};
  const std::size_t devices[9] = {0, 1, 2, 2, 1, 0, 0, 1, 2};
  for (std::size_t s = 0; s < 9; ++s) CHECK(w.device_of_stage(s) == devices[s]);
  CHECK(gpipe::make_zb_v_schedule(4, 8).placement == Placement::v_shape);
  CHECK(gpipe::make_dual_pipe_v_schedule(4, 8).placement == Placement::v_shape);
  CHECK(gpipe::make_zb_h2_schedule(4, 8).placement == Placement::round_robin);
  CHECK(gpipe::to_string(Placement::v_shape) == "v_shape");
  // the same lists under another placement are another schedule
  Schedule round = gpipe::make_zb_v_schedule(2, 4);
  round.placement = Placement::round_robin;
  CHECK(round != gpipe::make_zb_v_schedule(2, 4));
}

TEST_CASE("ZB-V, ZB-H2 and DualPipeV are valid under both send rules for K <= 8, M <= 24") {
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t m = 1; m <= 24; ++m) {
      CAPTURE(k);
      CAPTURE(m);
      const Schedule v = gpipe::make_zb_v_schedule(k, m);
      const Schedule h2 = gpipe::make_zb_h2_schedule(k, m);
      CHECK(gpipe::validate(v));
      CHECK(gpipe::validate(gpipe::order_for_rendezvous(v), Sends::rendezvous));
      CHECK(gpipe::validate(h2));
      CHECK(gpipe::validate(h2, Sends::rendezvous));
      if (m >= 2 * k) {
        const Schedule dp = gpipe::make_dual_pipe_v_schedule(k, m);
        CHECK(gpipe::validate(dp));
        CHECK(gpipe::validate(gpipe::order_for_rendezvous(dp), Sends::rendezvous));
      }
    }
  }
}

TEST_CASE("ZB-V reaches the least makespan for M >= 2K-1 at 1F1B's memory") {
  const OpCosts stage{};  // F = B = W = 1 per whole stage: a chunk's ops take 1/2
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t m = 1; m <= 24; ++m) {
      CAPTURE(k);
      CAPTURE(m);
      const auto r = simulate(gpipe::make_zb_v_schedule(k, m), halved(stage));
      const double bound = least_makespan(k, m, stage, 0.5);
      CHECK(r.makespan >= bound);
      if (m + 1 >= 2 * k) CHECK(r.makespan == bound);
      // 2K chunk stashes (half a stage each) = 1F1B's K whole-stage stashes, while M allows
      CHECK(peak(r) <= 2 * k);
      if (m + 1 >= 2 * k) CHECK(peak(r) == 2 * k);
    }
  }
  // the published figure's case, K = 4, M = 8: bubble (K-1)/2 / (3M + (K-1)/2) = 1.5 / 25.5
  const auto r = simulate(gpipe::make_zb_v_schedule(4, 8), halved(stage));
  CHECK(r.bubble_fraction == doctest::Approx(1.5 / 25.5));
  // against the one-chunk schedules at the same memory: ZB-H1 pays (K-1) whole forwards
  const auto h1 = simulate(gpipe::make_zb_h1_schedule(4, 8), stage);
  CHECK(h1.makespan == doctest::Approx(27.0));
  CHECK(r.makespan < h1.makespan);
}

TEST_CASE("ZB-H2 ties ZB-H1 with equal times and beats it where B outlasts W and M > K") {
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t m = k; m <= 24; ++m) {
      CAPTURE(k);
      CAPTURE(m);
      const auto equal = simulate(gpipe::make_zb_h2_schedule(k, m));
      CHECK(equal.makespan == least_makespan(k, m, OpCosts{}, 1.0));
      CHECK(peak(equal) <= 2 * k - 1);
      const OpCosts heavy_b{.forward = 1, .backward_input = 2, .backward_weight = 1};
      const auto h2 = simulate(gpipe::make_zb_h2_schedule(k, m), heavy_b);
      const auto h1 = simulate(gpipe::make_zb_h1_schedule(k, m), heavy_b);
      CHECK(h2.makespan <= h1.makespan);
      // one device has no wait to fill, and at M = K no forward can run ahead
      if (k > 1 && m > k) CHECK(h2.makespan < h1.makespan);
    }
  }
}

TEST_CASE("DualPipeV: M >= 2K, 1F1B's memory plus one chunk, and ZB-V's makespan") {
  CHECK_THROWS_WITH_AS(gpipe::make_dual_pipe_v_schedule(4, 7),
                       doctest::Contains("at least 2K micro-batches"), gpipe::Error);
  CHECK_THROWS_AS(gpipe::make_dual_pipe_v_schedule(0, 4), gpipe::Error);
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t m = 2 * k; m <= 24; ++m) {
      CAPTURE(k);
      CAPTURE(m);
      const auto r = simulate(gpipe::make_dual_pipe_v_schedule(k, m), halved(OpCosts{}));
      CHECK(peak(r) <= 2 * k + 1);
      // with equal times, ZB-V's: the least a synchronous step can take
      CHECK(r.makespan == least_makespan(k, m, OpCosts{}, 0.5));
      // its F and B pairs run one after the other, and still beat 1F1B on K devices of whole
      // stages (two half stages each)
      const auto interleaved = simulate(gpipe::make_1f1b_schedule(k, m), OpCosts{});
      CHECK(r.makespan <= interleaved.makespan);
    }
  }
}
