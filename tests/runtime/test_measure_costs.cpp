// The measured variant of the balanced cut (gpipe/runtime/measure_costs.hpp): every layer of an
// MLP and of a small GPT timed on the host backend (positive, finite: times are never compared,
// machines are noisy), the cut of the measured totals, and the Pipeline type printed for a cut;
// core_work, which turns op durations on shared cores into work on a core of its own, on traces
// given by hand and simulated.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/measure_costs.hpp"

using namespace gpipe;

TEST_CASE("measure_layer_costs times every layer; the cut of the totals is a cut") {
  host::Backend backend(1);
  const auto mlp = measure_layer_costs<Linear<8, 64>, ReLU, Linear<64, 8>>(backend, 16, 2);
  for (const LayerCost& c : mlp) {
    CHECK(c.forward > 0);
    CHECK(c.backward > 0);
    CHECK(std::isfinite(c.total()));
  }
  constexpr std::size_t V = 23, T = 4, D = 8;
  using B = TransformerBlock<D, 2>;
  const auto gpt =
      measure_layer_costs<Embedding<V, T, D>, B, LayerNorm<D>, Linear<D, V>>(backend, 3);
  for (const LayerCost& c : gpt) CHECK(c.total() > 0);
  const auto cut = balanced_cut(totals(gpt), 2);
  CHECK(cut[0] == 0);
  CHECK(cut[1] > 0);
  CHECK(cut[1] < 4);
  CHECK(cut[2] == 4);
  CHECK_THROWS_AS((measure_layer_costs<Linear<2, 2>>(backend, 0)), Error);
  // the backend is left as it was: nothing allocated stays counted
  CHECK(backend.memory_stats(0).current == 0);
}

TEST_CASE("pipeline_type_name spells the cut as C++") {
  const std::string name = pipeline_type_name<Linear<8, 64>, ReLU, Linear<64, 8>>({0, 2, 3, 3}, 2);
  CHECK(name.starts_with("gpipe::Pipeline<gpipe::Stage<gpipe::Linear<8, 64"));
  CHECK(name.find(">, gpipe::ReLU>, gpipe::Stage<gpipe::Linear<64, 8") != std::string::npos);
  CHECK(name.ends_with(">>>"));
  CHECK_THROWS_AS((pipeline_type_name<Linear<8, 64>, ReLU>({0, 1, 1}, 2)), Error);
}

TEST_CASE("core_work: time shared with more compute than cores counts cores / running") {
  const auto event = [](std::size_t device, double start, double end, bool compute = true) {
    return TraceEvent{
        .device = device,
        .label = {.what = compute ? "forward" : "recv_activation", .compute = compute},
        .start_us = start,
        .end_us = end};
  };
  // device 0 computes on [0, 4], device 1 on [2, 4] and device 2 waits on [1, 3] (not compute):
  // on one core [2, 4] is shared by two, so 2 + 2 / 2 and 2 / 2
  const std::vector<TraceEvent> trace = {event(0, 0, 4), event(1, 2, 4), event(2, 1, 3, false)};
  CHECK(core_work(trace, 1) == std::vector<double>{3, 1, 2});
  CHECK(core_work(trace, 0) == std::vector<double>{4, 2, 2});  // not shared: as they ran
  CHECK(core_work(trace, 2) == std::vector<double>{4, 2, 2});
  CHECK(core_work(std::vector<TraceEvent>{}, 1).empty());
}

TEST_CASE("core_work undoes simulate_on_cores: a simulated trace gives back each op's cost") {
  const Schedule s = make_1f1b_schedule(4, 8);
  std::vector<OpCosts> costs;
  for (std::size_t d = 0; d < 4; ++d) {
    const auto x = static_cast<double>(d + 1);
    costs.push_back({.forward = 10 + x, .backward_input = 20 + 3 * x, .backward_weight = 5 * x});
  }
  for (const double cores : {1.0, 2.0, 3.0}) {
    const std::vector<TraceEvent> trace = trace_of(s, simulate_on_cores(s, costs, cores));
    const std::vector<double> work = core_work(trace, cores);
    bool stretched = false;  // some op ran longer than its cost: the cores were shared
    for (std::size_t i = 0; i < trace.size(); ++i) {
      const TraceEvent& e = trace[i];
      const std::optional<OpKind> kind = op_kind_of(e.label.what);
      REQUIRE(kind.has_value());
      const double cost = is_compute(*kind) ? detail::duration(*kind, costs[e.device]) : 0.0;
      CHECK(work[i] == doctest::Approx(cost));
      stretched = stretched || e.end_us - e.start_us > cost + 1e-9;
    }
    CHECK(stretched);
  }
}
