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
  /// Traced steps per measured configuration, after one warm-up step.
  std::size_t measure_steps = 2;
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
/// and the backend supports it (one warm-up step, then options.measure_steps traced steps each;
/// offload's ops also carry what its copies add to the step beyond the others' overhead). Where
/// Remat::never runs out of memory (OutOfMemory), its B is taken as Remat::always's less the
/// forward it recomputes, and selective's (out of memory too) as Remat::always's; a count at
/// which Remat::always runs out of memory too is left out.
/// With several processes every process gets every stage's costs (each stage's from the
/// process that runs it), and an OutOfMemory on one process is one on all (the step's
/// agreement keeps it), so that every process leaves out the same configurations. Throws
/// gpipe::Error for a count of 0 or above the batch's samples, or for a backend of fewer than S
/// devices other than S / 2 (naming both numbers).
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
  std::vector<PlanCosts> out;
  for (std::size_t m : counts) {
    double overhead = -1;           // of the last configuration measured without running out
    std::vector<double> overheads;  // of never's, always's and selective's, where measured
    // the trainer of `Kind` under `remat`: its costs per stage, and the overhead of its steps
    const auto measure_with = [&]<class Kind>(Kind, Remat remat) {
      Trainer<Model, Loss, Backend, Kind, Precision> trainer(backend,
                                                             {.micro_batches = m, .remat = remat});
      for (std::size_t st = 0; st < S; ++st) owner[st] = trainer.device_of_stage(st);
      trainer.forward_backward(x, y);  // warm-up: first allocations, thread start-up
      trainer.zero_grad();
      const std::size_t steps = std::max<std::size_t>(options.measure_steps, 1);
      const auto start = std::chrono::steady_clock::now();
      std::vector<OpCosts> measured = measure_stage_costs(trainer, x, y, steps, cores);
      const double wall =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          static_cast<double>(steps);
      // per op slot of the critical path: (wall - simulated) / (simulated / mean op)
      const SimulationResult sim = detail::simulate_step(trainer.schedule(), measured, cores);
      double busy = 0;
      for (double b : sim.busy) busy += b;
      const double ops = 3.0 * static_cast<double>(m * S);
      if (busy > 0 && sim.makespan > 0)
        overhead = std::max(0.0, (wall - sim.makespan) / (sim.makespan / (busy / ops)));
      return measured;
    };
    const auto measure = [&](Remat remat) {
      if constexpr (S % 2 == 0)  // else Interleaved<2> does not compile, and K == S
        if (K != S) return measure_with(Interleaved<2>{}, remat);
      return measure_with(OneFOneB{}, remat);
    };
    PlanCosts c;
    c.micro_batches = m;
    c.num_devices = K;
    c.cores = cores;
    try {
      c.always = measure(Remat::always);
      overheads.push_back(overhead);
    } catch (const OutOfMemory&) {
      continue;
    }
    try {
      c.never = measure(Remat::never);
      overheads.push_back(overhead);
    } catch (const OutOfMemory&) {
      c.never = c.always;
      for (std::size_t st = 0; st < S; ++st)
        c.never[st].backward_input =
            std::max(0.0, c.always[st].backward_input - c.always[st].forward);
    }
    if (weighs_selective) {
      try {
        c.selective = measure(Remat::selective);
        overheads.push_back(overhead);
      } catch (const OutOfMemory&) {
        c.selective = c.always;
      }
    }
    // their median: one configuration's steps may catch the machine busy with other work
    std::ranges::sort(overheads);
    c.overhead_us = std::max(overheads[(overheads.size() - 1) / 2], 0.0);
    if (weighs_offload) {
      // Its B waits for its fetch outside the op's timing: what the copies add to the step
      // beyond the others' overhead goes into its ops, so that its prediction holds it.
      try {
        c.offload = measure(Remat::offload);
        const double stall = std::max(0.0, overhead - c.overhead_us);
        for (OpCosts& o : c.offload) {
          o.forward += stall;
          o.backward_input += stall;
          o.backward_weight += stall;
        }
      } catch (const OutOfMemory&) {
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
