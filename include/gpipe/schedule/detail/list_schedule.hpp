#pragma once
// List scheduling, the heuristic of the Zero Bubble paper's automatic scheduler (Qi et al.,
// 2023, section 4), over any placement and number of chunks: time runs on every device at once,
// and whenever a device is free it starts, among its ops whose data are there, the first by a
// priority order of the three kinds (F while the device holds fewer stashes than its limit; a
// stash lives from F to W, one per micro-batch and chunk); a device with nothing ready waits for
// the earliest op that becomes ready. Among a device's chunks, F and B go to the later stage
// first (the one nearer the loss: it frees the most downstream work), W to the oldest B. Ties
// between devices go to the lower device. search_schedule (one chunk, measured costs) and the
// ZB-H2 and ZB-V generators (equal costs, their memory limits) run it.

#include <array>
#include <cstddef>
#include <limits>
#include <vector>

#include "gpipe/schedule/detail/program.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"

namespace gpipe::detail {

// The three compute kinds in a priority order.
using Priority = std::array<OpKind, 3>;

// The list schedule of `shape` (its K, M, chunks and placement; its ops are ignored) with
// costs[d] and limit[d] (stashes) per device: per device the compute order, each op with its
// transfers (Program), or a Schedule with no lists when the limits let no order finish.
constexpr Schedule list_schedule(const Schedule& shape, const std::vector<OpCosts>& costs,
                                 const std::vector<std::size_t>& limit, const Priority& priority) {
  constexpr double never = std::numeric_limits<double>::infinity();
  const std::size_t k = shape.num_devices, m = shape.num_micro_batches, v = shape.num_chunks;
  const std::size_t stages = k * v;
  // done[kind][stage][mb]: when that op finished (never: not yet)
  std::array<std::vector<std::vector<double>>, 3> done;
  for (auto& kind : done) kind.assign(stages, std::vector<double>(m, never));
  // next[kind][stage]: the next micro-batch of that kind on that stage
  std::array<std::vector<std::size_t>, 3> next;
  for (auto& kind : next) kind.assign(stages, 0);
  std::vector<double> free(k, 0);
  std::vector<std::size_t> live(k, 0);
  // the order of B's on each device (stage, mb), for W's oldest first
  std::vector<std::vector<std::array<std::size_t, 2>>> pending_w(k);
  std::vector<std::size_t> next_w(k, 0);
  struct Pick {
    std::size_t kind, chunk, mb;
  };
  std::vector<std::vector<Pick>> order(k);
  auto cost = [&](std::size_t d, std::size_t kind) {
    const OpCosts& c = costs[d];
    return kind == 0 ? c.forward : kind == 1 ? c.backward_input : c.backward_weight;
  };
  auto index = [](OpKind kind) -> std::size_t {
    return kind == OpKind::forward ? 0 : kind == OpKind::backward_input ? 1 : 2;
  };
  // When device d may start chunk c's next op of `kind` (0 F, 1 B), or never.
  auto ready = [&](std::size_t d, std::size_t kind, std::size_t c) -> double {
    const std::size_t s = shape.stage_of(d, c);
    const std::size_t mb = next[kind][s];
    if (mb >= m) return never;
    if (kind == 0) {
      if (live[d] >= limit[d]) return never;
      return s == 0 ? 0 : done[0][s - 1][mb] + costs[d].transfer;
    }
    if (mb >= next[0][s]) return never;
    return s + 1 == stages ? done[0][s][mb] : done[1][s + 1][mb] + costs[d].transfer;
  };
  auto ready_w = [&](std::size_t d) -> double {
    if (next_w[d] >= pending_w[d].size()) return never;
    const auto [s, mb] = pending_w[d][next_w[d]];
    return done[1][s][mb];
  };
  // The earliest start of device d's ops of `kind`, and the chunk that wins it (later stages
  // first among those ready by then).
  auto earliest = [&](std::size_t d, std::size_t kind, double by, std::size_t& chunk) -> double {
    if (kind == 2) {
      chunk = v;
      return ready_w(d);
    }
    double best = never;
    std::size_t best_stage = 0;
    for (std::size_t c = 0; c < v; ++c) {
      const double t = ready(d, kind, c);
      if (t == never) continue;
      const std::size_t s = shape.stage_of(d, c);
      const double start = t > by ? t : by;
      const double best_start = best > by ? best : by;
      if (best == never || start < best_start || (start == best_start && s > best_stage)) {
        best = t;
        best_stage = s;
        chunk = c;
      }
    }
    return best;
  };

  std::size_t remaining = 3 * stages * m;
  while (remaining > 0) {
    std::size_t best_d = k, best_kind = 3, best_chunk = 0;
    double best_t = never;
    for (std::size_t d = 0; d < k; ++d) {
      double first = never;
      std::size_t unused = 0;
      for (std::size_t kind = 0; kind < 3; ++kind) {
        const double t = earliest(d, kind, free[d], unused);
        if (t < first) first = t;
      }
      if (first == never) continue;
      const double t = free[d] > first ? free[d] : first;
      if (t < best_t) {
        best_t = t;
        best_d = d;
        for (OpKind p : priority) {
          std::size_t chunk = 0;
          const double r = earliest(d, index(p), t, chunk);
          if (r != never && (free[d] > r ? free[d] : r) <= t) {
            best_kind = index(p);
            best_chunk = chunk;
            break;
          }
        }
      }
    }
    if (best_d == k) return Schedule{};  // stalled: the limits let nothing run
    const std::size_t d = best_d, kind = best_kind;
    std::size_t s = 0, mb = 0, chunk = best_chunk;
    if (kind == 2) {
      s = pending_w[d][next_w[d]][0];
      mb = pending_w[d][next_w[d]][1];
      ++next_w[d];
      chunk = shape.chunk_of_stage(s);
      --live[d];
    } else {
      s = shape.stage_of(d, chunk);
      mb = next[kind][s]++;
      if (kind == 0) ++live[d];
      if (kind == 1) pending_w[d].push_back({s, mb});
    }
    done[kind][s][mb] = best_t + cost(d, kind);
    free[d] = done[kind][s][mb];
    order[d].push_back({kind, chunk, mb});
    --remaining;
  }
  Schedule schedule = empty_schedule("a list schedule", k, m, v, shape.placement);
  for (std::size_t d = 0; d < k; ++d) {
    Program program(schedule, d);
    for (const Pick& p : order[d]) {
      if (p.kind == 0) program.forward(p.mb, p.chunk);
      if (p.kind == 1) program.backward_input(p.mb, p.chunk);
      if (p.kind == 2) program.backward_weight(p.mb, p.chunk);
    }
  }
  return schedule;
}

}  // namespace gpipe::detail
