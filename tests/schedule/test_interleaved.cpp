// The interleaved 1F1B generator: proven valid at compile time over a grid of (K, V, M), its
// exact op order, and the simulator against the published result: with V chunks per device the
// bubble is ((K-1)/V) / (M + (K-1)/V) for every M >= K (Narayanan et al. state it for K | M; the
// balanced groups keep it for any M >= K), and for M < K it follows the exact makespan
// (F+B+W)(V max(M, K) + min(M, K) - 1).

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"
#include "gpipe/schedule/detail/program.hpp"

namespace {

using gpipe::make_1f1b_schedule;
using gpipe::make_interleaved_schedule;
using gpipe::Op;
using gpipe::OpCosts;
using gpipe::OpKind;
using gpipe::Schedule;
using gpipe::simulate;
using gpipe::SimulationResult;

template <std::size_t... N>
struct sizes {};

template <std::size_t K, std::size_t V, std::size_t M>
constexpr Schedule interleaved() {
  return make_interleaved_schedule(K, V, M);
}
template <std::size_t K, std::size_t V, std::size_t... M>
consteval bool valid_for_all_m(sizes<M...>) {
  return (gpipe::valid_at_compile_time<interleaved<K, V, M>> && ...);
}
template <std::size_t V, std::size_t... K>
consteval bool valid_for_all_k(sizes<K...>) {
  return (valid_for_all_m<K, V>(sizes<1, 2, 3, 4, 8, 16>{}) && ...);
}
template <std::size_t... V>
consteval bool valid_grid(sizes<V...>) {
  return (valid_for_all_k<V>(sizes<1, 2, 3, 4, 8>{}) && ...);
}
static_assert(valid_grid(sizes<1, 2, 3>{}));

static_assert(gpipe::Interleaved<2>::chunks_per_device == 2);
static_assert(gpipe::Interleaved<2>::name == "interleaved-2");
static_assert(gpipe::Interleaved<12>::name == "interleaved-12");
static_assert(gpipe::Interleaved<3>::make(2, 5) == make_interleaved_schedule(2, 3, 5));
static_assert(make_interleaved_schedule(4, 1, 6) == make_1f1b_schedule(4, 6));
static_assert(make_interleaved_schedule(4, 1, 2) == make_1f1b_schedule(4, 2));

constexpr bool near(double a, double b) { return a - b <= 1e-12 && b - a <= 1e-12; }

// With op costs F, B, W per chunk and no transfer time, for every K, V, M.
constexpr double interleaved_makespan(std::size_t k, std::size_t v, std::size_t m,
                                      const OpCosts& c) {
  const double slots = static_cast<double>(v * std::max(m, k) + std::min(m, k) - 1);
  return (c.forward + c.backward_input + c.backward_weight) * slots;
}

// Narayanan et al.: 1F1B's bubble with (K-1)/V in place of K-1.
constexpr double published_bubble(std::size_t k, std::size_t v, std::size_t m) {
  const double fill = static_cast<double>(k - 1) / static_cast<double>(v);
  return fill / (static_cast<double>(m) + fill);
}

constexpr bool bubble_is_published(std::size_t k, std::size_t v, std::size_t m) {
  return near(simulate(make_interleaved_schedule(k, v, m)).bubble_fraction,
              published_bubble(k, v, m));
}
static_assert(bubble_is_published(4, 2, 8));  // 1.5 / 9.5 = 3/19 = 0.1579
static_assert(bubble_is_published(4, 3, 8));
static_assert(bubble_is_published(4, 2, 5));  // M not a multiple of K
static_assert(bubble_is_published(8, 2, 12));
static_assert(near(simulate(make_interleaved_schedule(4, 2, 8)).bubble_fraction, 3.0 / 19.0));

// Megatron-LM's order, for comparison: groups of K with the leftovers in a short last group,
// and 2(K-1-d) + (V-1)K warm-up forwards.
constexpr Schedule megatron_interleaved(std::size_t k, std::size_t v, std::size_t m) {
  Schedule s = gpipe::detail::empty_schedule("megatron", k, m, v);
  std::vector<std::pair<std::size_t, std::size_t>> order;  // (chunk, micro-batch)
  for (std::size_t begin = 0; begin < m; begin += k) {
    for (std::size_t c = 0; c < v; ++c) {
      for (std::size_t mb = begin; mb < std::min(m, begin + k); ++mb) order.push_back({c, mb});
    }
  }
  const std::size_t n = order.size();
  for (std::size_t d = 0; d < k; ++d) {
    gpipe::detail::Program p(s, d);
    const std::size_t w = std::min(n, 2 * (k - 1 - d) + (v - 1) * k);
    for (std::size_t i = 0; i < w; ++i) p.forward(order[i].second, order[i].first);
    for (std::size_t j = 0; j < n; ++j) {
      if (w + j < n) p.forward(order[w + j].second, order[w + j].first);
      p.backward(order[j].second, v - 1 - order[j].first);
    }
  }
  return s;
}

std::string compute_ops(const Schedule& s, std::size_t device) {
  std::string text;
  for (const Op& op : s.ops[device]) {
    if (op.kind != OpKind::forward && op.kind != OpKind::backward_input) continue;
    if (!text.empty()) text += ' ';
    text += (op.kind == OpKind::forward ? 'F' : 'B') + std::to_string(op.chunk) + "." +
            std::to_string(op.micro_batch);
  }
  return text;
}

}  // namespace

TEST_CASE("an interleaved schedule walks chunk-major groups of at least K micro-batches") {
  // K = 2, V = 2, M = 5: groups {0, 1, 2} and {3, 4}; device 0 warms up with 1 + (V-1)*3 = 4
  // forwards, device 1 with 3. Entries are F/B chunk.micro-batch; B W and transfers elided.
  const Schedule s = make_interleaved_schedule(2, 2, 5);
  CHECK(s.num_devices == 2);
  CHECK(s.num_chunks == 2);
  CHECK(s.num_stages() == 4);
  CHECK(compute_ops(s, 0) ==
        "F0.0 F0.1 F0.2 F1.0 F1.1 B1.0 F1.2 B1.1 F0.3 B1.2 F0.4 B0.0 F1.3 B0.1 F1.4 B0.2 "
        "B1.3 B1.4 B0.3 B0.4");
  CHECK(compute_ops(s, 1) ==
        "F0.0 F0.1 F0.2 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F0.3 B0.0 F0.4 B0.1 F1.3 B0.2 F1.4 "
        "B1.3 B1.4 B0.3 B0.4");
  // Stage 1 (device 1, chunk 0) hands micro-batch 0 to stage 2 (device 0, chunk 1).
  const std::vector<Op>& d1 = s.ops[1];
  CHECK(std::find(d1.begin(), d1.end(), Op{OpKind::send_activation, 0, 0}) != d1.end());
  const std::vector<Op>& d0 = s.ops[0];
  CHECK(std::find(d0.begin(), d0.end(), Op{OpKind::recv_activation, 0, 1}) != d0.end());
  // The last stage (device 1, chunk 1) neither sends activations nor receives gradients.
  for (const Op& op : d1) {
    if (op.chunk == 1)
      CHECK((op.kind != OpKind::send_activation && op.kind != OpKind::recv_gradient));
  }
}

TEST_CASE("on one device a micro-batch's chunks run in a row, its backwards right after") {
  // Groups of K = 1 micro-batch; warm-up (V-1) * 1 = 2 forwards.
  const Schedule s = make_interleaved_schedule(1, 3, 2);
  CHECK(compute_ops(s, 0) == "F0.0 F1.0 F2.0 B2.0 F0.1 B1.0 F1.1 B0.0 F2.1 B2.1 B1.1 B0.1");
  CHECK(simulate(s).bubble_fraction == 0);
}

TEST_CASE("interleaved schedules validate at run time for every K <= 8, V <= 4, M <= 40") {
  for (std::size_t k = 1; k <= 8; ++k) {
    for (std::size_t v = 1; v <= 4; ++v) {
      for (std::size_t m = 1; m <= 40; ++m) {
        const gpipe::ValidationResult result = gpipe::validate(make_interleaved_schedule(k, v, m));
        if (!result.ok) {
          CAPTURE(k);
          CAPTURE(v);
          CAPTURE(m);
          FAIL_CHECK(gpipe::describe(result));
        }
      }
    }
  }
}

TEST_CASE("with one chunk per device the interleaved schedule is 1F1B") {
  for (std::size_t k : {1, 2, 3, 5, 8}) {
    for (std::size_t m : {1, 2, 4, 7, 16}) {
      CHECK(make_interleaved_schedule(k, 1, m) == make_1f1b_schedule(k, m));
    }
  }
}

TEST_CASE("the interleaved bubble is 1F1B's with (K-1)/V in place of K-1 for every M >= K") {
  for (std::size_t v : {1, 2, 3, 4}) {
    for (std::size_t k : {1, 2, 3, 4, 8}) {
      for (std::size_t m : {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 31, 32}) {
        CAPTURE(v);
        CAPTURE(k);
        CAPTURE(m);
        const SimulationResult r = simulate(make_interleaved_schedule(k, v, m));
        if (m >= k) {
          CHECK(r.bubble_fraction == doctest::Approx(published_bubble(k, v, m)).epsilon(1e-12));
        } else {
          // Too few micro-batches to fill K devices: each of the V rounds waits for the chain.
          const auto kd = static_cast<double>(k);
          const auto vd = static_cast<double>(v);
          const auto md = static_cast<double>(m);
          const double bubble = (vd * (kd - md) + md - 1) / (vd * kd + md - 1);
          CHECK(r.bubble_fraction == doctest::Approx(bubble).epsilon(1e-12));
          CHECK(r.bubble_fraction >= published_bubble(k, v, m) - 1e-12);
        }
        if (k >= 2 && v >= 2 && m >= k) {
          CHECK(r.bubble_fraction < simulate(make_1f1b_schedule(k, m)).bubble_fraction);
        }
      }
    }
  }
}

TEST_CASE("the interleaved makespan is (F+B+W)(V max(M, K) + min(M, K) - 1) for any op costs") {
  for (const OpCosts& c : {OpCosts{}, OpCosts{.forward = 1, .backward_input = 2},
                           OpCosts{.forward = 2, .backward_input = 1, .backward_weight = 3},
                           OpCosts{.forward = 1, .backward_input = 1, .backward_weight = 0}}) {
    for (std::size_t v : {1, 2, 3}) {
      for (std::size_t k : {1, 2, 4, 5}) {
        for (std::size_t m : {1, 2, 3, 4, 6, 10, 17}) {
          CAPTURE(v);
          CAPTURE(k);
          CAPTURE(m);
          const SimulationResult r = simulate(make_interleaved_schedule(k, v, m), c);
          CHECK(r.makespan == doctest::Approx(interleaved_makespan(k, v, m, c)).epsilon(1e-12));
        }
      }
    }
  }
}

TEST_CASE("interleaving keeps K-d + (V-1) G_0 chunk stashes on device d") {
  for (std::size_t v : {1, 2, 3}) {
    for (std::size_t k : {1, 2, 4, 8}) {
      for (std::size_t m : {1, 2, 4, 5, 8, 16}) {
        CAPTURE(v);
        CAPTURE(k);
        CAPTURE(m);
        const std::size_t groups = std::max<std::size_t>(1, m / k);
        const std::size_t first_group = (m + groups - 1) / groups;
        const SimulationResult r = simulate(make_interleaved_schedule(k, v, m));
        for (std::size_t d = 0; d < k; ++d) {
          CAPTURE(d);
          CHECK(r.peak_live_activations[d] == std::min(m * v, k - d + (v - 1) * first_group));
        }
        // When K divides M, device 0 holds V K chunk stashes: K stages' worth, as 1F1B.
        if (m % k == 0) CHECK(r.peak_live_activations[0] == v * k);
      }
    }
  }
}

TEST_CASE("Megatron's order deadlocks with a short last group where this one does not") {
  // The reason for balanced groups and one warm-up forward per hop (schedule/interleaved.hpp).
  const gpipe::ValidationResult megatron = gpipe::validate(megatron_interleaved(4, 3, 5));
  CHECK(megatron.error == gpipe::ValidationError::deadlock);
  CHECK(megatron.device == 0);
  CHECK(megatron.op == Op{OpKind::recv_activation, 4, 2});
  CHECK(gpipe::validate(make_interleaved_schedule(4, 3, 5)).ok);
  // Where Megatron's order is valid, its short last group costs bubble: K = 4, V = 2, M = 5.
  CHECK(gpipe::validate(megatron_interleaved(4, 2, 5)).ok);
  CHECK(simulate(megatron_interleaved(4, 2, 5)).bubble_fraction ==
        doctest::Approx(3.0 / 8.0).epsilon(1e-12));
  CHECK(simulate(make_interleaved_schedule(4, 2, 5)).bubble_fraction ==
        doctest::Approx(3.0 / 13.0).epsilon(1e-12));
}

TEST_CASE("an interleaved schedule without devices, chunks or micro-batches is an error") {
  CHECK_THROWS_AS(make_interleaved_schedule(0, 2, 4), gpipe::Error);
  CHECK_THROWS_WITH_AS(make_interleaved_schedule(2, 0, 4), doctest::Contains("chunk"),
                       gpipe::Error);
  CHECK_THROWS_WITH_AS(make_interleaved_schedule(2, 2, 0), doctest::Contains("micro-batch"),
                       gpipe::Error);
}
