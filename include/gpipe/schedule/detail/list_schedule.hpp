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

// The state of one list scheduling run (see the top of this file): what has finished when, what
// each stage runs next, and each device's clock, stashes and order so far.
class ListScheduler {
 public:
  constexpr ListScheduler(const Schedule& shape, const std::vector<OpCosts>& costs,
                          const std::vector<std::size_t>& limit)
      : shape_(shape),
        costs_(costs),
        limit_(limit),
        k_(shape.num_devices),
        m_(shape.num_micro_batches),
        v_(shape.num_chunks),
        stages_(k_ * v_),
        free_(k_, 0),
        live_(k_, 0),
        pending_w_(k_),
        next_w_(k_, 0),
        order_(k_) {
    for (auto& kind : done_) kind.assign(stages_, std::vector<double>(m_, never));
    for (auto& kind : next_) kind.assign(stages_, 0);
  }

  // Runs every op; false when the limits stall it.
  constexpr bool run(const Priority& priority) {
    for (std::size_t remaining = 3 * stages_ * m_; remaining > 0; --remaining) {
      const Choice c = choose(priority);
      if (c.device == k_) return false;
      commit(c);
    }
    return true;
  }

  // The devices' orders as op lists with their transfers (Program).
  constexpr Schedule schedule() const {
    Schedule schedule = empty_schedule("a list schedule", k_, m_, v_, shape_.placement);
    for (std::size_t d = 0; d < k_; ++d) {
      Program program(schedule, d);
      for (const Pick& p : order_[d]) {
        if (p.kind == Compute::f) program.forward(p.mb, p.chunk);
        if (p.kind == Compute::b) program.backward_input(p.mb, p.chunk);
        if (p.kind == Compute::w) program.backward_weight(p.mb, p.chunk);
      }
    }
    return schedule;
  }

 private:
  static constexpr double never = std::numeric_limits<double>::infinity();
  // The compute kinds, as indices of done_ and next_.
  enum Compute : std::size_t { f = 0, b = 1, w = 2 };
  static constexpr Compute compute_of(OpKind kind) {
    return kind == OpKind::forward ? f : kind == OpKind::backward_input ? b : w;
  }
  struct Pick {
    Compute kind;
    std::size_t chunk, mb;
  };
  // The next op to run: on `device` (k_: none can run), of `kind` on `chunk`, at `start`.
  struct Choice {
    std::size_t device, chunk;
    Compute kind;
    double start;
  };

  constexpr double cost(std::size_t d, Compute kind) const {
    const OpCosts& c = costs_[d];
    return kind == f ? c.forward : kind == b ? c.backward_input : c.backward_weight;
  }
  static constexpr double later(double x, double y) { return x > y ? x : y; }

  // When device d may start chunk c's next op of `kind` (F or B), or never.
  constexpr double ready(std::size_t d, Compute kind, std::size_t c) const {
    const std::size_t s = shape_.stage_of(d, c);
    const std::size_t mb = next_[kind][s];
    if (mb >= m_) return never;
    if (kind == f) {
      if (live_[d] >= limit_[d]) return never;
      return s == 0 ? 0 : done_[f][s - 1][mb] + costs_[d].transfer;
    }
    if (mb >= next_[f][s]) return never;
    return s + 1 == stages_ ? done_[f][s][mb] : done_[b][s + 1][mb] + costs_[d].transfer;
  }
  // When device d may start its oldest pending W, or never.
  constexpr double ready_w(std::size_t d) const {
    if (next_w_[d] >= pending_w_[d].size()) return never;
    const auto [s, mb] = pending_w_[d][next_w_[d]];
    return done_[b][s][mb];
  }
  // The earliest start of device d's ops of `kind` (none before `by` counts as earlier than
  // another), and the chunk that wins it (later stages first among those ready by then).
  constexpr double earliest(std::size_t d, Compute kind, double by, std::size_t& chunk) const {
    if (kind == w) {
      chunk = v_;
      return ready_w(d);
    }
    double best = never;
    std::size_t best_stage = 0;
    for (std::size_t c = 0; c < v_; ++c) {
      const double t = ready(d, kind, c);
      if (t == never) continue;
      const std::size_t s = shape_.stage_of(d, c);
      const double start = later(t, by), best_start = later(best, by);
      if (best == never || start < best_start || (start == best_start && s > best_stage)) {
        best = t;
        best_stage = s;
        chunk = c;
      }
    }
    return best;
  }

  // The device that can start an op earliest (ties: the lower device), and its op: the first
  // kind of `priority` that can start by then.
  constexpr Choice choose(const Priority& priority) const {
    Choice best{.device = k_, .chunk = 0, .kind = f, .start = never};
    for (std::size_t d = 0; d < k_; ++d) {
      double first = never;
      std::size_t unused = 0;
      for (const Compute kind : {f, b, w}) {
        const double t = earliest(d, kind, free_[d], unused);
        if (t < first) first = t;
      }
      if (first == never) continue;
      const double t = later(free_[d], first);
      if (t >= best.start) continue;
      best.start = t;
      best.device = d;
      for (const OpKind p : priority) {
        std::size_t chunk = 0;
        const double r = earliest(d, compute_of(p), t, chunk);
        if (r != never && later(free_[d], r) <= t) {
          best.kind = compute_of(p);
          best.chunk = chunk;
          break;
        }
      }
    }
    return best;
  }

  // Runs the chosen op: its finish time, the device's clock, stashes and order.
  constexpr void commit(const Choice& c) {
    const std::size_t d = c.device;
    std::size_t s = 0, mb = 0, chunk = c.chunk;
    if (c.kind == w) {
      s = pending_w_[d][next_w_[d]][0];
      mb = pending_w_[d][next_w_[d]][1];
      ++next_w_[d];
      chunk = shape_.chunk_of_stage(s);
      --live_[d];
    } else {
      s = shape_.stage_of(d, chunk);
      mb = next_[c.kind][s]++;
      if (c.kind == f) ++live_[d];
      if (c.kind == b) pending_w_[d].push_back({s, mb});
    }
    done_[c.kind][s][mb] = c.start + cost(d, c.kind);
    free_[d] = done_[c.kind][s][mb];
    order_[d].push_back({c.kind, chunk, mb});
  }

  const Schedule& shape_;
  const std::vector<OpCosts>& costs_;
  const std::vector<std::size_t>& limit_;
  std::size_t k_, m_, v_, stages_;
  std::array<std::vector<std::vector<double>>, 3> done_;  // [kind][stage][mb]: finish, or never
  std::array<std::vector<std::size_t>, 3> next_;          // [kind][stage]: its next micro-batch
  std::vector<double> free_;                              // per device: when it is free
  std::vector<std::size_t> live_;                         // per device: stashes held
  std::vector<std::vector<std::array<std::size_t, 2>>> pending_w_;  // per device: B's (stage, mb)
  std::vector<std::size_t> next_w_;  // per device: its oldest B without its W
  std::vector<std::vector<Pick>> order_;
};

// The list schedule of `shape` (its K, M, chunks and placement; its ops are ignored) with
// costs[d] and limit[d] (stashes) per device: per device the compute order, each op with its
// transfers (Program), or a Schedule with no lists when the limits let no order finish.
constexpr Schedule list_schedule(const Schedule& shape, const std::vector<OpCosts>& costs,
                                 const std::vector<std::size_t>& limit, const Priority& priority) {
  ListScheduler scheduler(shape, costs, limit);
  if (!scheduler.run(priority)) return Schedule{};  // stalled: the limits let nothing run
  return scheduler.schedule();
}

}  // namespace gpipe::detail
