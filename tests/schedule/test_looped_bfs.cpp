// The looped breadth-first generator (gpipe/schedule/looped_bfs.hpp): proven valid at compile
// time over a grid of (K, V, M), its exact op order, the simulator against the published bubble
// ((K-1)/V)/(M+(K-1)/V) for M >= K, the exact makespan (F+B+W)(V max(M, K) + min(M, K) - 1) for
// every M, GPipe's memory (all V M stashes live on every device), and its repair for rendezvous
// sends.

#include <doctest/doctest.h>

#include <cstddef>
#include <string>

#include "gpipe/error.hpp"
#include "gpipe/schedule.hpp"

namespace {

using gpipe::make_looped_bfs_schedule;
using gpipe::Op;
using gpipe::OpCosts;
using gpipe::OpKind;
using gpipe::Schedule;
using gpipe::simulate;

template <std::size_t... N>
struct sizes {};

template <std::size_t K, std::size_t V, std::size_t M>
constexpr Schedule looped() {
  return make_looped_bfs_schedule(K, V, M);
}
template <std::size_t K, std::size_t V, std::size_t... M>
consteval bool valid_for_all_m(sizes<M...>) {
  return (gpipe::valid_at_compile_time<looped<K, V, M>> && ...);
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

static_assert(gpipe::LoopedBFS<2>::chunks_per_device == 2);
static_assert(gpipe::LoopedBFS<2>::name == "looped-bfs-2");
static_assert(gpipe::LoopedBFS<12>::name == "looped-bfs-12");
static_assert(gpipe::LoopedBFS<3>::make(2, 5) == make_looped_bfs_schedule(2, 3, 5));
static_assert(gpipe::schedule_kind<gpipe::LoopedBFS<4>>);
// one chunk per device is GPipe
static_assert(make_looped_bfs_schedule(4, 1, 6) == gpipe::make_gpipe_schedule(4, 6));

constexpr bool near(double a, double b) { return a - b <= 1e-12 && b - a <= 1e-12; }

// Lamy-Poirier: interleaved 1F1B's bubble, (K-1)/V in place of K-1, for M >= K.
constexpr double published_bubble(std::size_t k, std::size_t v, std::size_t m) {
  const double fill = static_cast<double>(k - 1) / static_cast<double>(v);
  return fill / (static_cast<double>(m) + fill);
}
constexpr bool bubble_is_published(std::size_t k, std::size_t v, std::size_t m) {
  return near(simulate(make_looped_bfs_schedule(k, v, m)).bubble_fraction,
              published_bubble(k, v, m));
}
static_assert(bubble_is_published(4, 2, 8));  // 1.5 / 9.5 = 3/19
static_assert(bubble_is_published(4, 3, 4));
static_assert(bubble_is_published(4, 2, 5));
static_assert(bubble_is_published(8, 2, 12));
static_assert(bubble_is_published(2, 4, 2));

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

TEST_CASE("a looped BFS schedule runs every micro-batch through a chunk before the next") {
  const Schedule s = make_looped_bfs_schedule(2, 2, 3);
  CHECK(s.num_stages() == 4);
  for (std::size_t d = 0; d < 2; ++d)
    CHECK(compute_ops(s, d) == "F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 B1.2 B1.1 B1.0 B0.2 B0.1 B0.0");
  // stage 1 (device 1, chunk 0) hands over to stage 2 (device 0, chunk 1); stage 3 (device 1,
  // chunk 1) is the last: no activation leaves it, no gradient comes to it
  CHECK(s.ops[1][2] == Op{OpKind::send_activation, 0, 0});
  CHECK(s.ops[0][0] == Op{OpKind::forward, 0, 0});
  for (const Op& op : s.ops[1])
    if (op.chunk == 1)
      CHECK((op.kind != OpKind::send_activation && op.kind != OpKind::recv_gradient));
  CHECK_THROWS_AS(make_looped_bfs_schedule(2, 0, 3), gpipe::Error);
  CHECK_THROWS_AS(make_looped_bfs_schedule(0, 2, 3), gpipe::Error);
  CHECK_THROWS_AS(make_looped_bfs_schedule(2, 2, 0), gpipe::Error);
}

TEST_CASE("looped BFS: exact makespan for every M, GPipe's memory, valid for rendezvous sends") {
  const OpCosts costs{.forward = 1, .backward_input = 2, .backward_weight = 0.5};
  for (std::size_t k : {1u, 2u, 3u, 4u, 8u})
    for (std::size_t v : {1u, 2u, 3u})
      for (std::size_t m : {1u, 2u, 3u, 4u, 5u, 8u, 12u}) {
        CAPTURE(k);
        CAPTURE(v);
        CAPTURE(m);
        const Schedule s = make_looped_bfs_schedule(k, v, m);
        const auto result = simulate(s, costs);
        const double slots = static_cast<double>(v * std::max(m, k) + std::min(m, k) - 1);
        CHECK(result.makespan == doctest::Approx(3.5 * slots));
        for (std::size_t d = 0; d < k; ++d) CHECK(result.peak_live_activations[d] == v * m);
        const Schedule r = gpipe::order_for_rendezvous(s);
        CHECK(gpipe::validate(r, gpipe::Sends::rendezvous).ok);
        CHECK(gpipe::validate(r).ok);
      }
}
