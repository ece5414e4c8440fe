// search_schedule (gpipe/schedule/search.hpp): on random per-device costs and stash limits, never
// worse than the best built-in schedule that fits the limits, within the limits, valid with
// buffered sends and (ordered for them) with rendezvous sends, messages in order; better than
// ZB-H1 where more stashes and slow hand-overs leave room; SearchedSchedule's own schedule; the
// errors.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/model/layer.hpp"  // gpipe::Rng
#include "gpipe/schedule.hpp"

using namespace gpipe;

namespace {

// The smallest makespan of the built-ins whose peak stashes fit the limits (infinity if none).
double best_builtin(std::size_t k, std::size_t m, const std::vector<OpCosts>& costs,
                    const std::vector<std::size_t>& limits) {
  double best = std::numeric_limits<double>::infinity();
  for (const Schedule& s : {make_gpipe_schedule(k, m), make_1f1b_schedule(k, m),
                            make_zb_h1_schedule(k, m), make_zb_h2_schedule(k, m)}) {
    const SimulationResult r = simulate(s, costs);
    bool fits = true;
    for (std::size_t d = 0; d < k; ++d) fits = fits && r.peak_live_activations[d] <= limits[d];
    if (fits) best = std::min(best, r.makespan);
  }
  return best;
}

}  // namespace

TEST_CASE("search_schedule: never worse than a built-in that fits, within limits, valid") {
  Rng rng(5);
  auto draw = [&](double lo, double hi) { return lo + (hi - lo) * rng.uniform(0.0f, 1.0f); };
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t k = 1 + rng.next_u64() % 5, m = 1 + rng.next_u64() % 10;
    std::vector<OpCosts> costs;
    std::vector<std::size_t> limits;
    for (std::size_t d = 0; d < k; ++d) {
      costs.push_back({draw(0.5, 2), draw(0.5, 3), draw(0.2, 2), draw(0, 0.5)});
      limits.push_back(1 + rng.next_u64() % (2 * k));
    }
    CAPTURE(trial);
    CAPTURE(k);
    CAPTURE(m);
    const Schedule s = search_schedule(k, m, {.costs = costs, .max_stashes = limits});
    REQUIRE(validate(s).ok);
    const SimulationResult r = simulate(s, costs);
    for (std::size_t d = 0; d < k; ++d) CHECK(r.peak_live_activations[d] <= limits[d]);
    CHECK(r.makespan <= best_builtin(k, m, costs, limits));
    const Schedule ordered = order_for_rendezvous(s);
    CHECK(validate(ordered, Sends::rendezvous).ok);
    CHECK(messages_in_order(ordered).ok);
  }
}

TEST_CASE("search_schedule: beats ZB-H1 where stashes and hand-over time leave room") {
  // K = 4, M = 8, F = B = W = 1, hand-overs 0.5: ZB-H1 33, the search 28.5 with 7 stashes; with
  // 1F1B's K stashes it finds ZB-H1's 33 (the built-in, no better one)
  const std::vector<OpCosts> costs{{1, 1, 1, 0.5}};
  const Schedule roomy = search_schedule(4, 8, {.costs = costs, .max_stashes = {7}});
  const Schedule tight = search_schedule(4, 8, {.costs = costs, .max_stashes = {4}});
  const double zb = simulate(make_zb_h1_schedule(4, 8), costs[0]).makespan;
  CHECK(zb == 33);
  CHECK(simulate(roomy, costs[0]).makespan == 28.5);
  CHECK(simulate(tight, costs[0]).makespan == 33);
  // B twice F and W: 35 against ZB-H1's 38 with 7 stashes
  const std::vector<OpCosts> heavy_b{{1, 2, 1, 0}};
  CHECK(simulate(search_schedule(4, 8, {.costs = heavy_b, .max_stashes = {7}}), heavy_b[0])
            .makespan == 35);
  CHECK(simulate(make_zb_h1_schedule(4, 8), heavy_b[0]).makespan == 38);
}

TEST_CASE("SearchedSchedule: equal costs and K stashes give ZB-H1's makespan; the errors") {
  static_assert(schedule_kind<SearchedSchedule>);
  for (std::size_t k : {1u, 2u, 4u})
    for (std::size_t m : {1u, 3u, 8u}) {
      const Schedule s = SearchedSchedule::make(k, m);
      CHECK(validate(s).ok);
      CHECK(simulate(s).makespan == simulate(make_zb_h1_schedule(k, m)).makespan);
    }
  CHECK_THROWS_AS(search_schedule(3, 4, {.costs = {OpCosts{}, OpCosts{}}, .max_stashes = {3}}),
                  Error);
  CHECK_THROWS_AS(search_schedule(3, 4, {.costs = {OpCosts{}}, .max_stashes = {3, 3}}), Error);
  CHECK_THROWS_AS(search_schedule(3, 4, {.costs = {OpCosts{}}, .max_stashes = {0}}), Error);
  CHECK_THROWS_AS(search_schedule(0, 4, {.costs = {OpCosts{}}, .max_stashes = {1}}), Error);
  CHECK_THROWS_AS(search_schedule(2, 0, {.costs = {OpCosts{}}, .max_stashes = {1}}), Error);
}
