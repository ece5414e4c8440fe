#pragma once
// What gpipe::plan chooses among (PlanOptions) and what it chooses from: the op costs of each
// stage of a model on a backend, per micro-batch count and remat policy (PlanCosts), measured by
// running trainers on it (measure_plan_costs). choose_plan (runtime/plan.hpp) weighs them.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/measure_costs.hpp"
#include "gpipe/runtime/offload.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "gpipe/schedule/interleaved.hpp"
#include "gpipe/schedule/one_f_one_b.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe {

/// What `plan` chooses among and under which limits; an empty list takes its default.
struct PlanOptions {
  /// Bytes each pipeline device may hold at its peak: one entry per device, or one for all.
  /// Empty: each device's cap as the backend has it (`memory_stats(d).capacity`; 0: no limit).
  std::vector<std::size_t> device_limit = {};
  /// Micro-batch counts to weigh. Empty: 1, 2, 4, ... up to the batch's samples, and the
  /// samples themselves.
  std::vector<std::size_t> micro_batches = {};
  /// Remat policies to weigh. `plan` and `measure_plan_costs` leave Remat::offload out on a
  /// backend without a copy stream (the host backend), where a Trainer refuses it.
  std::vector<Remat> remat = {Remat::never, Remat::selective, Remat::except_last, Remat::always,
                              Remat::offload};
  /// Floats of optimizer state per parameter the run will keep (AdamW 2, SGD with momentum 1,
  /// no optimizer state 0), counted in every device's memory.
  std::size_t optimizer_state_per_param = 2;
  /// Traced steps per measured configuration in each round, after one warm-up step.
  std::size_t measure_steps = 1;
  /// Rounds of measurement: each measures every configuration (micro-batch count and policy)
  /// once, in turn, and a configuration's op costs and overhead are the medians over the rounds,
  /// so that a slow moment of the machine (other work, a shared host's swings in speed) during
  /// one round moves no configuration's figure.
  std::size_t measure_rounds = 3;
};

/// F, B and W per stage (microseconds) at one micro-batch count, measured without and with
/// recompute: what choose_plan predicts step times from. With one stage per device a stage's
/// entry is its device's.
struct PlanCosts {
  std::size_t micro_batches = 0;  ///< M of the measurement
  std::vector<OpCosts> never;     ///< [stage] under Remat::never
  std::vector<OpCosts> always;    ///< [stage] under Remat::always (B recomputes the forward)
  /// [stage] under Remat::selective (B recomputes the cheap layers); empty: taken as `never`'s
  /// (a model without cheap layers recomputes nothing under selective).
  std::vector<OpCosts> selective = {};
  /// [stage] under Remat::offload (its copies run beside the compute, and B waits for its
  /// fetch); empty: taken as `never`'s.
  std::vector<OpCosts> offload = {};
  /// K, the devices the plan is for: the model's stage count S (one stage per device; 0 says
  /// the same) or S / 2 (two stages per device: the two-chunk schedules are weighed).
  std::size_t num_devices = 0;
  /// What the executor adds to each op slot of the critical path (hand-overs, issuing), in
  /// microseconds: the measured steps' wall time less their simulated makespan, per slot (the
  /// median over the policies measured at this count). choose_plan adds it to every op's cost.
  double overhead_us = 0;
  /// The cores the devices share, counted in devices (a host backend with more device threads
  /// than cores): the costs are each op's work on a core of its own, and choose_plan times
  /// candidates with simulate_on_cores. 0: each device computes on cores of its own (simulate).
  double cores = 0;
};

namespace detail {

// The default micro-batch counts for `samples` samples: powers of two below it, and it.
inline std::vector<std::size_t> default_micro_batches(std::size_t samples) {
  std::vector<std::size_t> out;
  for (std::size_t m = 1; m < samples; m *= 2) out.push_back(m);
  out.push_back(samples);
  return out;
}

// K for a model of `stages` stages on a backend of `devices` pipeline devices: `stages` (one
// stage per device) where the backend has that many, devices (two stages per device) where
// stages == 2 devices; else an Error naming both numbers.
inline std::size_t plan_devices(std::size_t stages, std::size_t devices) {
  if (stages <= devices) return stages;
  require(stages == 2 * devices, [&] {
    return "plan: the model has " + std::to_string(stages) + " stages and the backend " +
           std::to_string(devices) + " devices; the planner places one stage per device (at " +
           "least as many devices as stages) or two (twice as many stages as devices)";
  });
  return devices;
}

// How many of the K pipeline devices of `backend` compute at once without sharing cores, where
// fewer than K do (the backend's devices_share_cores; each device of this process); 0 where all
// K do, or the backend does not say, or a device is another process's (whose cores it does not
// know).
template <class Backend>
double shared_cores(const Backend& backend, transport::Transport<Backend>& transport,
                    std::size_t K) {
  if constexpr (requires { backend.devices_share_cores(K); }) {
    for (std::size_t d = 0; d < K; ++d)
      if (!transport.is_local(d)) return 0;
    if (!backend.devices_share_cores(K)) return 0;
    std::size_t fit = 1;
    while (fit + 1 < K && !backend.devices_share_cores(fit + 1)) ++fit;
    return static_cast<double>(fit);
  } else {
    return 0;
  }
}

// One configuration's measurement: F, B and W per stage, and the executor's overhead per op
// slot of the critical path (PlanCosts::overhead_us).
struct Measurement {
  std::vector<OpCosts> costs;
  double overhead = 0;
};

// The median of v (the mean of the middle two where v has an even size); 0 for an empty v.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::ranges::sort(v);
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// Per stage and op kind, the median over `rounds` (each [stage]; at least one).
inline std::vector<OpCosts> median_costs(std::span<const Measurement> rounds) {
  std::vector<OpCosts> out(rounds.front().costs.size());
  for (std::size_t st = 0; st < out.size(); ++st) {
    const auto of = [&](double OpCosts::*kind) {
      std::vector<double> v;
      for (const Measurement& r : rounds) v.push_back(r.costs[st].*kind);
      return median(std::move(v));
    };
    out[st] = {.forward = of(&OpCosts::forward),
               .backward_input = of(&OpCosts::backward_input),
               .backward_weight = of(&OpCosts::backward_weight)};
  }
  return out;
}

// simulate_on_cores where `cores` > 0, else simulate: the planner's step.
inline SimulationResult simulate_step(const Schedule& schedule, std::span<const OpCosts> costs,
                                      double cores) {
  return cores > 0 ? simulate_on_cores(schedule, costs, cores) : simulate(schedule, costs);
}

}  // namespace detail

/// Per micro-batch count in options.micro_batches (default: see PlanOptions), the op costs of
/// each stage of Model on `backend` with the batch (x, y), measured (measure_stage_costs) with a
/// 1F1B trainer on its first S devices where the backend has at least S = Model::num_stages, or
/// an Interleaved<2> one where it has S / 2 (two stages per device; `num_devices` of each entry
/// says which),
/// under Remat::never and Remat::always, under Remat::selective where options.remat weighs it
/// and a stage of Model has cheap layers, and under Remat::offload where options.remat weighs it
/// and the backend supports it (in options.measure_rounds rounds, each of which builds every
/// configuration's trainer in turn for one warm-up step and options.measure_steps traced steps;
/// each op cost the median over the rounds; offload's ops also carry what its copies add to the
/// step beyond the others' overhead). Where
/// Remat::never runs out of memory (OutOfMemory), its B is taken as Remat::always's less the
/// forward it recomputes, and selective's (out of memory too) as Remat::always's; a count at
/// which Remat::always runs out of memory too is left out.
/// With several processes every process gets every stage's costs (each stage's from the
/// process that runs it), and an OutOfMemory on one process is one on all (the step's
/// agreement keeps it), so that every process leaves out the same configurations. Throws
/// gpipe::Error for a count of 0 or above the batch's samples, for 0 measure_steps or
/// measure_rounds, or for a backend of fewer than S devices other than S / 2 (naming both
/// numbers).
template <class Model, class Loss, class Precision = Fp32, class Backend, class X, class Y>
std::vector<PlanCosts> measure_plan_costs(Backend& backend, const X& x, const Y& y,
                                          const PlanOptions& options = {}) {
  constexpr std::size_t S = Model::num_stages;
  const std::size_t K = detail::plan_devices(S, backend.num_devices());
  const std::size_t rows = Model::is_token_model ? std::size(x) : std::size(x) / Model::in_features;
  const std::size_t samples = rows / Model::tokens_per_sample;
  std::vector<std::size_t> counts = options.micro_batches.empty()
                                        ? detail::default_micro_batches(samples)
                                        : options.micro_batches;
  for (std::size_t m : counts)
    detail::require(m >= 1 && m <= samples, [&] {
      return "plan: a micro-batch count of " + std::to_string(m) + " for a batch of " +
             std::to_string(samples) + " samples";
    });
  detail::require(options.measure_steps >= 1 && options.measure_rounds >= 1, [&] {
    return "plan: measure_steps " + std::to_string(options.measure_steps) + " and measure_rounds " +
           std::to_string(options.measure_rounds) + ": each must be at least 1";
  });
  transport::Transport<Backend> transport(backend);
  // selective differs from never only where a stage has cheap layers
  const bool weighs_selective =
      std::ranges::find(options.remat, Remat::selective) !=
      options.remat.end()&& [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((Model::template stage_t<I>::cheap_stash_per_row > 0) || ...);
  }
  (std::make_index_sequence<S>{});
  const bool weighs_offload =
      detail::Offload<Backend>::supported &&
      std::ranges::find(options.remat, Remat::offload) != options.remat.end();
  const double cores = detail::shared_cores(backend, transport, K);
  std::vector<std::size_t> owner(S);  // [stage] the device that ran it while measuring
  // the trainer of `Kind` under `remat` at m micro-batches: its costs per stage, and the overhead
  // per op slot of the critical path, (wall - simulated) / (simulated / mean op)
  const auto measure_with = [&]<class Kind>(Kind, std::size_t m, Remat remat) {
    Trainer<Model, Loss, Backend, Kind, Precision> trainer(backend,
                                                           {.micro_batches = m, .remat = remat});
    for (std::size_t st = 0; st < S; ++st) owner[st] = trainer.device_of_stage(st);
    trainer.forward_backward(x, y);  // warm-up: first allocations, thread start-up
    trainer.zero_grad();
    const std::size_t steps = options.measure_steps;
    const auto start = std::chrono::steady_clock::now();
    detail::Measurement out{.costs = measure_stage_costs(trainer, x, y, steps, cores)};
    const double wall =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        static_cast<double>(steps);
    const SimulationResult sim = detail::simulate_step(trainer.schedule(), out.costs, cores);
    double busy = 0;
    for (double b : sim.busy) busy += b;
    const double ops = 3.0 * static_cast<double>(m * S);
    if (busy > 0 && sim.makespan > 0)
      out.overhead = std::max(0.0, (wall - sim.makespan) / (sim.makespan / (busy / ops)));
    return out;
  };
  const auto measure = [&](std::size_t m, Remat remat) {
    if constexpr (S % 2 == 0)  // else Interleaved<2> does not compile, and K == S
      if (K != S) return measure_with(Interleaved<2>{}, m, remat);
    return measure_with(OneFOneB{}, m, remat);
  };
  // The policies measured, always's first (a count where it runs out of memory is left out);
  // timed[count][policy]: each round's measurement, none where it ran out of memory.
  std::vector<Remat> policies = {Remat::always, Remat::never};
  if (weighs_selective) policies.push_back(Remat::selective);
  if (weighs_offload) policies.push_back(Remat::offload);
  struct Cell {
    std::vector<detail::Measurement> rounds;
    bool out_of_memory = false;
  };
  std::vector<std::vector<Cell>> timed(counts.size(), std::vector<Cell>(policies.size()));
  const std::size_t rounds = options.measure_rounds;
  for (std::size_t r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < counts.size(); ++i)
      for (std::size_t p = 0; p < policies.size(); ++p) {
        if (timed[i][0].out_of_memory) break;  // the count is left out
        Cell& cell = timed[i][p];
        if (cell.out_of_memory) continue;
        try {
          cell.rounds.push_back(measure(counts[i], policies[p]));
        } catch (const OutOfMemory&) {
          cell.out_of_memory = true;
          cell.rounds.clear();
        }
      }
  const auto policy_index = [&](Remat remat) {
    return static_cast<std::size_t>(std::ranges::find(policies, remat) - policies.begin());
  };
  std::vector<PlanCosts> out;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const std::vector<Cell>& cells = timed[i];
    if (cells[0].out_of_memory) continue;
    PlanCosts c;
    c.micro_batches = counts[i];
    c.num_devices = K;
    c.cores = cores;
    c.always = detail::median_costs(cells[0].rounds);
    const Cell& never = cells[policy_index(Remat::never)];
    if (!never.out_of_memory) {
      c.never = detail::median_costs(never.rounds);
    } else {
      c.never = c.always;
      for (std::size_t st = 0; st < S; ++st)
        c.never[st].backward_input =
            std::max(0.0, c.always[st].backward_input - c.always[st].forward);
    }
    if (weighs_selective) {
      const Cell& selective = cells[policy_index(Remat::selective)];
      c.selective = selective.out_of_memory ? c.always : detail::median_costs(selective.rounds);
    }
    // the median over never's, always's and selective's rounds, where measured: one step may
    // catch the machine busy with other work
    std::vector<double> overheads;
    for (std::size_t p = 0; p < policies.size(); ++p)
      if (policies[p] != Remat::offload)
        for (const detail::Measurement& one : cells[p].rounds) overheads.push_back(one.overhead);
    c.overhead_us = std::max(detail::median(overheads), 0.0);
    if (weighs_offload) {
      const Cell& offload = cells[policy_index(Remat::offload)];
      if (!offload.out_of_memory) {
        // Its B waits for its fetch outside the op's timing: what the copies add to the step
        // beyond the others' overhead goes into its ops, so that its prediction holds it.
        c.offload = detail::median_costs(offload.rounds);
        std::vector<double> own;
        for (const detail::Measurement& one : offload.rounds) own.push_back(one.overhead);
        const double stall = std::max(0.0, detail::median(own) - c.overhead_us);
        for (OpCosts& o : c.offload) {
          o.forward += stall;
          o.backward_input += stall;
          o.backward_weight += stall;
        }
      } else {
        c.offload = c.never;  // the same ops; the copies taken as hidden
      }
    }
    // each stage's costs as the process that runs it measured them (the overhead: rank 0's)
    for (std::size_t st = 0; st < S; ++st) {
      std::vector<std::vector<OpCosts>*> measured = {&c.never, &c.always};
      if (weighs_selective) measured.push_back(&c.selective);
      if (weighs_offload) measured.push_back(&c.offload);
      std::vector<double> v;
      for (const auto* costs : measured)
        v.insert(v.end(),
                 {(*costs)[st].forward, (*costs)[st].backward_input, (*costs)[st].backward_weight});
      transport.broadcast(owner[st], std::span<double>(v));
      for (std::size_t i = 0; i < measured.size(); ++i)
        (*measured[i])[st] = {
            .forward = v[3 * i], .backward_input = v[3 * i + 1], .backward_weight = v[3 * i + 2]};
    }
    transport.broadcast(0, std::span<double>(&c.overhead_us, 1));
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace gpipe
