#pragma once
// gpipe::Trainer<Model, Loss, Backend, Schedule>: trains a Pipeline with pipelined micro-batches.
//
//   gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend> trainer(
//       backend, {.micro_batches = 8, .remat = gpipe::Remat::always});
//   float loss = trainer.forward_backward(x, y);   // mean loss; gradients accumulate
//   trainer.step(optimizer);                       // update on every stage's device
//   trainer.zero_grad();
//
// Stage s lives on device schedule.device_of_stage(s) of the backend. Parameters are initialized
// from options.seed in nn.Sequential order with PyTorch's default distributions, so the same seed
// gives the same model for every split into stages. Gradients after forward_backward are those
// of the mini-batch mean loss: the same numbers for any number of stages, micro-batches, remat
// policy and schedule. After a step that threw, gradients are unspecified: call zero_grad().

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

#include "gpipe/backend/concepts.hpp"
#include "gpipe/error.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/pipeline.hpp"
#include "gpipe/runtime/executor.hpp"
#include "gpipe/runtime/micro_batch.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/step_stats.hpp"
#include "gpipe/schedule/gpipe.hpp"
#include "gpipe/schedule/rendezvous.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/schedule/validator.hpp"
#include "gpipe/transport/select.hpp"

namespace gpipe {

/// Weight tying: `parameter` is the same tensor as `to` (GPT-2's LM head weight and its token
/// embedding, on the last and the first stage). Both are kept equal: at initialization, load,
/// set_parameter and after every optimizer step. Each forward_backward sums the two gradients
/// (d loss / d shared tensor) into both. The file that save and save_gradients write holds the
/// tensor once, under `to`; load accepts a file without `parameter` (or with it, equal to `to`).
struct Tie {
  /// The follower's name (as in `parameter_info()`): its values are copied from `to`'s, and files
  /// leave it out. A parameter follows at most one other.
  std::string parameter;
  /// The leader's name, of the same shape: the tensor that files hold. A leader follows none (no
  /// chains of ties).
  std::string to;
};

namespace detail {
// Whether every layer of every stage runs with the kernel context Ctx (see explain_layer_for).
template <class Model, class Ctx, std::size_t... S>
constexpr bool model_runs_on(std::index_sequence<S...>) {
  return (Model::template stage_t<S>::template explain_runs_on<Ctx>() && ...);
}
}  // namespace detail

/// Trains the `Pipeline` `Model` with pipelined micro-batches: `forward_backward` adds the
/// gradients of the mini-batch mean `Loss` (`SoftmaxCrossEntropy` or `MSELoss`), `step` applies
/// an optimizer on every stage's own device. Stage s lives on device `device_of_stage(s)` of
/// `Backend`, and `ScheduleKind` (`GPipe`, `OneFOneB`, `Interleaved<V>`, `ZeroBubbleH1`) orders
/// each device's ops. Gradients are the same numbers for any number of stages, micro-batches,
/// remat policy and schedule. After a call that threw, gradients are unspecified: call
/// `zero_grad()`.
///
///     Trainer<Model, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = 8});
///     float loss = trainer.forward_backward(x, y);  // mean loss; gradients accumulate
///     trainer.step(optimizer);                      // on every stage's device
///     trainer.zero_grad();
///
/// A compile error names a layer the backend cannot run, or a stage count that is not a multiple
/// of the schedule's chunks per device.
template <class Model, class Loss, backend Backend, class ScheduleKind = GPipe>
class Trainer {
  // Every layer of every stage runs on this backend (names the operation a layer lacks, here
  // rather than deep inside the first forward_backward).
  static_assert(detail::model_runs_on<Model, typename Backend::Kernels>(
                    std::make_index_sequence<Model::num_stages>{}),
                "gpipe: a layer of the model cannot run on this backend (named above)");
  static_assert(Model::num_stages % ScheduleKind::chunks_per_device == 0,
                "gpipe: the schedule puts chunks_per_device stages on each device; the number of "
                "stages must be a multiple of it");

 public:
  using model_type = Model;            ///< the `Pipeline` of stages being trained
  using schedule_type = ScheduleKind;  ///< the schedule's tag type, e.g. `GPipe`
  using loss_type = Loss;              ///< the loss the last stage applies
  using backend_type = Backend;        ///< where the stages run
  /// One target's type: `std::int32_t` class ids (`SoftmaxCrossEntropy`), floats (`MSELoss`).
  using target_type = typename Loss::target_type;
  /// The backend's owning device memory, in which parameters, gradients and optimizer state live.
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  /// What the last forward_backward measured (see `gpipe::StepStats`).
  using StepStats = gpipe::StepStats;
  /// What the last step's measured bubble is made of (see `gpipe::BubbleBreakdown`).
  using BubbleBreakdown = gpipe::BubbleBreakdown;

  /// A weight tie, for `Options::ties` (see `gpipe::Tie`).
  using Tie = gpipe::Tie;

  /// How the trainer splits, recomputes, initializes and ties; designated initializers read well:
  /// `{.micro_batches = 8, .remat = Remat::always}`.
  struct Options {
    /// M: micro-batches per mini-batch (per replica, with data parallelism), >= 1. A batch
    /// needs at least M samples; sizes differ by at most one sample (see `MicroBatchSplit`).
    std::size_t micro_batches = 1;
    /// Which micro-batches drop their activations after forward and recompute them before
    /// backward: less memory for more compute, the same gradients.
    Remat remat = Remat::never;
    /// Seed of the parameters' initialization (PyTorch's default distributions, in
    /// nn.Sequential order): the same seed gives the same model for every split into stages.
    std::uint64_t seed = 0;
    /// Parameters that share one tensor; the constructor throws `gpipe::Error` for an unknown
    /// name, a shape mismatch, a self-tie or a chain.
    std::vector<Tie> ties = {};
  };

  /// S, the model's stages.
  static constexpr std::size_t num_stages = Model::num_stages;
  /// How the backend's transport completes a send: the schedule is ordered and validated for it.
  static constexpr Sends sends = transport::transport_for<Backend>::sends;
  /// Pipeline devices the schedule uses: S / chunks_per_device (S, or S / V for
  /// `Interleaved<V>`). The backend needs at least this many (exactly this many per replica when
  /// it runs across processes).
  static constexpr std::size_t num_devices = Model::num_stages / ScheduleKind::chunks_per_device;

  /// Builds and validates the schedule for `options.micro_batches`, allocates the parameters and
  /// gradients of every stage this process runs on that stage's device, initializes the
  /// parameters from `options.seed` and zeroes the gradients. `backend` must outlive the trainer.
  /// Throws `gpipe::Error` for micro_batches == 0, a backend with fewer devices than num_devices
  /// (across processes: other than num_devices per replica) or a bad tie; `OutOfMemory` when an
  /// allocation exceeds a device's capacity.
  Trainer(Backend& backend, Options options)
      : backend_(backend), options_(options), infos_(Model::parameters()) {
    detail::require(options.micro_batches >= 1, "micro_batches must be at least 1");
    detail::require(backend.num_devices() >= num_devices,
                    "the model has " + std::to_string(num_stages) + " stages on " +
                        std::to_string(num_devices) + " devices but the backend has only " +
                        std::to_string(backend.num_devices()));
    if constexpr (multi_process_backend<Backend>)
      detail::require(backend.num_devices() == num_devices,
                      "the model has " + std::to_string(num_stages) + " stages on " +
                          std::to_string(num_devices) +
                          " devices, but the backend's pipeline "
                          "has " +
                          std::to_string(backend.num_devices()) + " (world size " +
                          std::to_string(backend.world_size()) + " = " +
                          std::to_string(detail::replicas_of(backend)) +
                          " replicas x devices): launch replicas x " + std::to_string(num_devices) +
                          " ranks");
    schedule_ = ScheduleKind::make(num_devices, options.micro_batches);
    if constexpr (sends == Sends::rendezvous) schedule_ = order_for_rendezvous(schedule_);
    require_valid(schedule_, sends);
    if constexpr (sends == Sends::rendezvous) {
      // rendezvous transports (NCCL) also match a pair's messages by the order they are posted
      const MessageOrder order = messages_in_order(schedule_);
      detail::require(order.ok, "the schedule's " +
                                    std::string(order.gradients ? "gradients" : "activations") +
                                    " from device " + std::to_string(order.sender) + " to device " +
                                    std::to_string(order.receiver) +
                                    " are received in another order than they are sent, and "
                                    "this backend's transport (NCCL) matches them by order");
    }
    issue_order_ = issue_order(schedule_);
    for (std::size_t s = 0; s < num_stages; ++s) {
      const std::size_t d = device_of_stage(s);
      // Another process's stage keeps no memory here (a multi_process_backend).
      if (!local(s)) {
        params_.emplace_back();
        grads_.emplace_back();
        continue;
      }
      params_.push_back(
          backend_.template allocate<float>(d, Model::stage_num_params[s], MemoryKind::parameters));
      grads_.push_back(
          backend_.template allocate<float>(d, Model::stage_num_params[s], MemoryKind::gradients));
    }
    resolve_ties();
    initialize(options.seed);
    sync_tied_parameters();
    zero_grad();
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// The options it was built with.
  const Options& options() const { return options_; }
  /// The ops every step runs, per device, for (num_devices, micro_batches); ordered for the
  /// transport's `sends` and validated.
  const Schedule& schedule() const { return schedule_; }
  /// The backend device that holds stage `stage` (parameters, gradients, optimizer state) and runs
  /// its ops.
  std::size_t device_of_stage(std::size_t stage) const { return schedule_.device_of_stage(stage); }
  /// The backend it runs on.
  Backend& backend() const { return backend_; }

  /// x: (N, in_features) row-major; y: N class ids (SoftmaxCrossEntropy) or (N, out_features)
  /// floats (MSELoss). Returns the mean loss over the mini-batch and adds its gradients.
  float forward_backward(std::span<const float> x,
                         std::span<const target_type> y) requires(!Model::is_token_model) {
    constexpr std::size_t in = Model::in_features;
    detail::require(x.size() % in == 0, "x has " + std::to_string(x.size()) +
                                            " floats, which is not a multiple of "
                                            "in_features = " +
                                            std::to_string(in) + " (expected batch x " +
                                            std::to_string(in) + ", row-major)");
    const std::size_t rows = x.size() / in;
    detail::require(rows >= options_.micro_batches,
                    "the batch has " + std::to_string(rows) + " rows, fewer than micro_batches = " +
                        std::to_string(options_.micro_batches) +
                        " (every micro-batch needs at least one row)");
    return run_step(x, y, rows);
  }

  /// Token models: tokens and targets are (B, T) token ids, row-major, B whole samples of T =
  /// Model::tokens_per_sample. Returns the mean loss over all B T tokens and adds its gradients.
  float forward_backward(std::span<const std::int32_t> tokens,
                         std::span<const target_type> targets) requires(Model::is_token_model) {
    const std::vector<float> x = token_rows(tokens, options_.micro_batches);
    return run_step(x, targets, tokens.size());
  }

  /// Inference: the model's output (N, out_features) for x (N, in_features), micro-batches
  /// pipelined through the stages; gradients are untouched.
  std::vector<float> predict(std::span<const float> x) requires(!Model::is_token_model) {
    constexpr std::size_t in = Model::in_features;
    detail::require(x.size() % in == 0 && !x.empty(), "x has " + std::to_string(x.size()) +
                                                          " floats, expected a positive multiple "
                                                          "of in_features = " +
                                                          std::to_string(in) + " (batch x " +
                                                          std::to_string(in) + ", row-major)");
    return run_predict(x, x.size() / in);
  }

  /// Token models: the logits (B T, out_features) of every token of (B, T) token ids.
  std::vector<float> predict(std::span<const std::int32_t> tokens) requires(Model::is_token_model) {
    const std::vector<float> x = token_rows(tokens, 1);
    return run_predict(x, tokens.size());
  }

  /// Timing of the last successful forward_backward (empty if the backend does not time work).
  const StepStats& last_step() const { return last_step_; }

  /// What the last step's measured bubble is made of, measured = schedule + imbalance +
  /// overhead (computed when asked: it runs the schedule's simulator twice; see
  /// `gpipe::bubble_breakdown`); all zero when the backend does not time work.
  BubbleBreakdown bubble_breakdown() const {
    BubbleBreakdown out = gpipe::bubble_breakdown(schedule_, last_step_);
    if constexpr (Backend::name == std::string_view("host")) {
      const unsigned cores = std::thread::hardware_concurrency();
      out.devices_share_cores =
          cores != 0 && out.busy_devices * backend_.threads_per_device() > cores;
    }
    return out;
  }

  /// Sets every gradient (of this process's stages) to 0 and waits for the devices. Each
  /// `forward_backward` adds to the gradients, so without it gradients sum over mini-batches.
  void zero_grad() {
    for (std::size_t s = 0; s < num_stages; ++s) {
      if (!local(s)) continue;
      backend_.submit(
          device_of_stage(s), {"zero_grad", s},
          [g = grads_[s].data(), n = grads_[s].size()](auto& k) { k.fill(n, 0.0f, g); });
    }
    backend_.synchronize();
  }

  /// One optimizer update of every parameter from its accumulated gradient, on each stage's
  /// device. The optimizer's state is kept here, per stage, and restarts when the optimizer's
  /// type changes.
  template <class Optimizer>
  void step(const Optimizer& optimizer) {
    optimizer.check();
    if (optimizer_type_ != &typeid(Optimizer)) {
      optimizer_state_.clear();
      for (std::size_t s = 0; s < num_stages; ++s) {
        if (!local(s)) {
          optimizer_state_.emplace_back();
          continue;
        }
        const std::size_t n = Optimizer::state_per_param * Model::stage_num_params[s];
        optimizer_state_.push_back(
            backend_.template allocate<float>(device_of_stage(s), n, MemoryKind::optimizer_state));
        backend_.submit(device_of_stage(s), {"optimizer state", s},
                        [p = optimizer_state_.back().data(), n](auto& k) { k.fill(n, 0.0f, p); });
      }
      optimizer_type_ = &typeid(Optimizer);
      optimizer_steps_ = 0;
    }
    ++optimizer_steps_;
    for (std::size_t s = 0; s < num_stages; ++s) {
      if (!local(s)) continue;
      backend_.submit(device_of_stage(s), {"optimizer step", s},
                      [&optimizer, p = params_[s].data(), g = grads_[s].data(),
                       st = optimizer_state_[s].data(), n = params_[s].size(),
                       t = optimizer_steps_](auto& k) { optimizer.update(k, n, p, g, st, t); });
    }
    backend_.synchronize();
    sync_tied_parameters();
  }

  /// Every parameter tensor: name, shape, stage.
  const std::vector<ParameterInfo>& parameter_info() const { return infos_; }

  /// The values of parameter `name`, row-major in its `parameter_info()` shape. Throws
  /// `gpipe::Error` for an unknown name or, with a multi_process_backend, a parameter of another
  /// process's stage (the message names its owner).
  std::vector<float> parameter(std::string_view name) const { return read(params_, find(name)); }
  /// The gradient accumulated for parameter `name` since the last `zero_grad()`, as `parameter`
  /// gives values (same shape and errors); a tied pair both hold the sum of their gradients.
  std::vector<float> gradient(std::string_view name) const { return read(grads_, find(name)); }
  /// Sets a parameter; for a tied one, the tensor it shares with its partner. With several
  /// processes, a parameter of another process's stage is an Error; for a tied pair on two
  /// processes both call it (the leader's writes, the follower's receives).
  void set_parameter(std::string_view name, std::span<const float> values) {
    const ParameterInfo& info = find(name);
    detail::require(values.size() == info.size, "parameter \"" + info.name + "\" has " +
                                                    std::to_string(info.size) + " elements, got " +
                                                    std::to_string(values.size()));
    const auto* tie = tie_of(info);
    const ParameterInfo& leader = *leader_of(info);
    // The leader's process writes (write() is an Error where it is not local), except that the
    // follower's process of a pair on two processes only receives, in sync_tie.
    const bool only_receives = tie != nullptr && !local(leader.stage) && local(tie->first->stage);
    if (!only_receives) write(params_, leader, values);
    backend_.synchronize();
    if (tie != nullptr) sync_tie(*tie);
  }

  /// Parameters from a safetensors file with exactly the model's names and shapes (as PyTorch's
  /// load_state_dict with strict=True); a tied parameter may be left out. With several processes
  /// each reads the file and keeps its own stages' tensors.
  void load(const std::filesystem::path& path) {
    const auto tensors = io::load_safetensors(path);
    for (const ParameterInfo& info : infos_) {
      const auto it = tensors.find(info.name);
      if (it == tensors.end() && leader_of(info) != &info) continue;
      detail::require(it != tensors.end(),
                      path.string() + " has no tensor \"" + info.name + "\" that the model needs");
      detail::require(it->second.shape == info.shape,
                      path.string() + ": tensor \"" + info.name + "\" has shape " +
                          shape_string(it->second.shape) + ", the model expects " +
                          shape_string(info.shape));
    }
    for (const auto& [name, tensor] : tensors) {
      detail::require(
          has(name), path.string() + " has a tensor \"" + name + "\" that the model does not have");
    }
    for (const auto& [follower, leader] : ties_) {
      const auto it = tensors.find(follower->name);
      detail::require(it == tensors.end() || it->second.data == tensors.at(leader->name).data,
                      path.string() + ": \"" + follower->name + "\" is tied to \"" + leader->name +
                          "\", but the file holds different values for them");
    }
    for (const ParameterInfo& info : infos_)
      if (leader_of(info) == &info && local(info.stage))
        write(params_, info, tensors.find(info.name)->second.data);
    backend_.synchronize();
    sync_tied_parameters();
  }
  /// The model's parameters as one safetensors file (F32, a tied tensor once, under `Tie::to`),
  /// which `load` reads back. With several processes, every process calls it (each stage's owner
  /// sends its tensors) and the first device's writes it.
  void save(const std::filesystem::path& path) const { save_all(params_, path); }
  /// The accumulated gradients as `save` writes the parameters: same names, shapes and processes.
  void save_gradients(const std::filesystem::path& path) const { save_all(grads_, path); }

 private:
  static constexpr std::size_t tokens_per_sample = Model::tokens_per_sample;

  /// Checks the targets, then runs one step on rows (tokens) x (rows, in_features).
  float run_step(std::span<const float> x, std::span<const target_type> y, std::size_t rows) {
    constexpr std::size_t out = Model::out_features;
    const std::size_t per_row = Loss::targets_per_row(out);
    detail::require(y.size() == rows * per_row,
                    "y has " + std::to_string(y.size()) + " targets, expected " +
                        std::to_string(rows * per_row) + " (" + std::to_string(rows) +
                        (Model::is_token_model ? " tokens x " : " rows x ") +
                        std::to_string(per_row) + ")");
    Loss::check(y, out);

    // A data-parallel replica runs its share of the samples, as evenly as they go.
    const std::size_t replicas = detail::replicas_of(backend_);
    const MicroBatchSplit shares{rows, replicas, tokens_per_sample};
    const std::size_t replica = detail::replica_of(backend_);
    const std::size_t mine = shares.size(replica), first = shares.begin(replica);
    if (replicas > 1)
      detail::require(shares.size(replicas - 1) / tokens_per_sample >= options_.micro_batches,
                      "the batch has " + std::to_string(shares.samples()) +
                          " samples: " + std::to_string(replicas) +
                          " replicas x micro_batches = " + std::to_string(options_.micro_batches) +
                          " need at least " + std::to_string(replicas * options_.micro_batches));
    const auto my_x = x.subspan(first * Model::in_features, mine * Model::in_features);
    const auto my_y = y.subspan(first * per_row, mine * per_row);

    detail::Executor<Model, Loss, Backend> executor(backend_, schedule_, issue_order_, params_,
                                                    grads_);
    // A tied pair holds the same gradient sum; the follower's copy restarts from 0 so that the
    // sum after the step counts every earlier step once.
    for (const auto& tie : ties_)
      if (local(tie.first->stage)) fill(grads_, *tie.first, 0.0f);
    take_timing();  // start this step's count afresh
    const MicroBatchSplit split{mine, options_.micro_batches, tokens_per_sample};
    // with replicas, each stage's gradients are summed over them during the step
    const double total = executor.run({.x = my_x,
                                       .y = my_y,
                                       .split = split,
                                       .remat = options_.remat,
                                       .loss_rows = rows,
                                       .sum_over_replicas = replicas > 1});
    last_step_ = step_stats(take_timing(), num_devices);
    sum_tied_gradients();
    float loss = static_cast<float>(total / Loss::normalizer(rows, out));
    // the last stage's process has its replica's part; the replicas' parts add up
    detail::broadcast_from(backend_, device_of_stage(num_stages - 1), std::span<float>(&loss, 1));
    if constexpr (data_parallel_backend<Backend>)
      if (replicas > 1) backend_.allreduce_sum(std::span<float>(&loss, 1));
    return loss;
  }

  std::vector<float> run_predict(std::span<const float> x, std::size_t rows) {
    std::vector<float> out(rows * Model::out_features);
    const std::size_t samples = rows / tokens_per_sample;
    detail::Executor<Model, Loss, Backend> executor(backend_, schedule_, issue_order_, params_,
                                                    grads_);
    executor.run_forward(x, {rows, std::min(samples, options_.micro_batches), tokens_per_sample},
                         out);
    detail::broadcast_from(backend_, device_of_stage(num_stages - 1), std::span<float>(out));
    return out;
  }

  /// The first stage's rows of a token model: each id as a float (exact: ids are below
  /// Model::vocab_size <= 2^24), after checking that the ids are whole samples, at least
  /// min_samples of them, and every one in [0, V).
  static std::vector<float> token_rows(std::span<const std::int32_t> tokens,
                                       std::size_t min_samples) {
    constexpr std::size_t T = tokens_per_sample, V = Model::vocab_size;
    detail::require(!tokens.empty() && tokens.size() % T == 0,
                    "the batch has " + std::to_string(tokens.size()) +
                        " tokens, which is not a positive number of whole samples of T = " +
                        std::to_string(T) + " tokens");
    const std::size_t samples = tokens.size() / T;
    detail::require(samples >= min_samples,
                    "the batch has " + std::to_string(samples) +
                        " samples, fewer than micro_batches = " + std::to_string(min_samples) +
                        " (every micro-batch needs at least one whole sample)");
    std::vector<float> rows(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::int32_t id = tokens[i];
      detail::require(id >= 0 && static_cast<std::size_t>(id) < V,
                      "token " + std::to_string(i) + " (sample " + std::to_string(i / T) +
                          ", position " + std::to_string(i % T) + ") is " + std::to_string(id) +
                          ", expected an id in [0, " + std::to_string(V) + ")");
      rows[i] = static_cast<float>(id);
    }
    return rows;
  }

  std::vector<ComputeTiming> take_timing() {
    if constexpr (requires { backend_.take_timing(); }) {
      return backend_.take_timing();
    } else {
      return {};
    }
  }
  void initialize(std::uint64_t seed) {
    Rng rng(seed);
    std::vector<std::vector<float>> host(num_stages);
    [&]<std::size_t... S>(std::index_sequence<S...>) {
      ((host[S].resize(Model::stage_num_params[S]),
        Model::template stage_t<S>::init(std::span<float>(host[S]), rng)),
       ...);
    }
    (std::make_index_sequence<num_stages>{});
    for (std::size_t s = 0; s < num_stages; ++s) {
      if (!local(s)) continue;
      backend_.submit(
          device_of_stage(s), {"initialize", s},
          [&h = host[s], p = params_[s].data()](auto& k) { k.upload(h.size(), h.data(), p); });
    }
    backend_.synchronize();
  }

  bool has(std::string_view name) const {
    for (const ParameterInfo& info : infos_)
      if (info.name == name) return true;
    return false;
  }
  const ParameterInfo& find(std::string_view name) const {
    for (const ParameterInfo& info : infos_)
      if (info.name == name) return info;
    throw Error("gpipe: the model has no parameter \"" + std::string(name) + "\"");
  }

  /// Whether this process holds stage s (always, in one process).
  bool local(std::size_t s) const { return detail::is_local(backend_, device_of_stage(s)); }
  void require_local(const ParameterInfo& info) const {
    detail::require(local(info.stage), "parameter \"" + info.name + "\" is on stage " +
                                           std::to_string(info.stage) + ", device " +
                                           std::to_string(device_of_stage(info.stage)) +
                                           ", which another process runs");
  }

  std::vector<float> read(const std::vector<Buffer<float>>& where,
                          const ParameterInfo& info) const {
    require_local(info);
    std::vector<float> out(info.size);
    backend_.submit(device_of_stage(info.stage), {"read parameter", info.stage},
                    [&out, src = where[info.stage].data() + info.offset](auto& k) {
                      k.download(out.size(), src, out.data());
                    });
    backend_.synchronize();
    return out;
  }
  /// Issues the copy; the caller synchronizes before `values` goes away.
  void write(std::vector<Buffer<float>>& where, const ParameterInfo& info,
             std::span<const float> values) {
    require_local(info);
    backend_.submit(device_of_stage(info.stage), {"write parameter", info.stage},
                    [values, dst = where[info.stage].data() + info.offset](auto& k) {
                      k.upload(values.size(), values.data(), dst);
                    });
  }

  /// Every tensor once: a tied parameter is saved under its partner's name only.
  void save_all(const std::vector<Buffer<float>>& where, const std::filesystem::path& path) const {
    std::vector<const ParameterInfo*> saved;
    for (const ParameterInfo& info : infos_)
      if (leader_of(info) == &info) saved.push_back(&info);
    std::vector<std::vector<float>> data;
    data.reserve(saved.size());
    for (const ParameterInfo* info : saved) {
      data.push_back(local(info->stage) ? read(where, *info) : std::vector<float>(info->size));
      detail::broadcast_from(backend_, device_of_stage(info->stage), std::span<float>(data.back()));
    }
    if (!detail::writes_files(backend_)) return;
    std::vector<io::TensorView> views;
    for (std::size_t i = 0; i < saved.size(); ++i)
      views.push_back({saved[i]->name, saved[i]->shape, data[i]});
    io::save_safetensors(path, views);
  }

  /// Checks options_.ties and resolves their names: every tie joins two distinct parameters of
  /// one shape, a parameter follows at most one other, and a followed one follows none.
  void resolve_ties() {
    for (const Tie& tie : options_.ties) {
      const ParameterInfo& follower = find(tie.parameter);
      const ParameterInfo& leader = find(tie.to);
      const std::string what = "tie of \"" + tie.parameter + "\" to \"" + tie.to + "\": ";
      detail::require(&follower != &leader, what + "a parameter cannot be tied to itself");
      detail::require(follower.shape == leader.shape, what + "their shapes differ (" +
                                                          shape_string(follower.shape) + " and " +
                                                          shape_string(leader.shape) + ")");
      for (const auto& [f, l] : ties_) {
        detail::require(f != &follower,
                        what + "\"" + tie.parameter + "\" is already tied to \"" + l->name + "\"");
        detail::require(f != &leader && l != &follower,
                        what +
                            "chains of ties are not supported: tie every parameter to the "
                            "same one");
      }
      ties_.emplace_back(&follower, &leader);  // on every process: files name the tensor once
    }
  }
  /// The parameter that holds info's values in files: its tie partner, or itself.
  const ParameterInfo* leader_of(const ParameterInfo& info) const {
    for (const auto& [follower, leader] : ties_)
      if (follower == &info) return leader;
    return &info;
  }
  /// The follower <- the leader's values. A pair on two processes exchanges them; a pair on
  /// neither is that process's business.
  void sync_tied_parameters() {
    for (const auto& tie : ties_) sync_tie(tie);
  }
  void sync_tie(const std::pair<const ParameterInfo*, const ParameterInfo*>& tie) {
    const auto& [follower, leader] = tie;
    const bool has_follower = local(follower->stage), has_leader = local(leader->stage);
    std::vector<float> values;  // outlives the copy that write() issues
    if (has_follower && has_leader) {
      values = read(params_, *leader);
      write(params_, *follower, values);
    } else if (has_leader) {
      values = read(params_, *leader);
      exchange_with(follower->stage, values, {});
    } else if (has_follower) {
      values.resize(follower->size);
      exchange_with(leader->stage, {}, values);
      write(params_, *follower, values);
    }
    backend_.synchronize();
  }
  /// Both tensors <- the sum of both gradients (leader + follower, in that order: one process and
  /// several give the same bits).
  void sum_tied_gradients() {
    for (const auto& [follower, leader] : ties_) {
      const bool has_follower = local(follower->stage), has_leader = local(leader->stage);
      if (!has_follower && !has_leader) continue;
      std::vector<float> total(leader->size), other(follower->size);
      if (has_leader) total = read(grads_, *leader);
      if (has_follower) other = read(grads_, *follower);
      if (!has_follower) exchange_with(follower->stage, total, other);
      if (!has_leader) exchange_with(leader->stage, other, total);
      for (std::size_t i = 0; i < total.size(); ++i) total[i] += other[i];
      if (has_leader) write(grads_, *leader, total);
      if (has_follower) write(grads_, *follower, total);
      backend_.synchronize();
    }
  }
  /// Between steps: sends `mine` to the process of `stage`, receives `theirs` from it.
  void exchange_with(std::size_t stage, std::span<const float> mine, std::span<float> theirs) {
    if constexpr (multi_process_backend<Backend>) {
      backend_.exchange(device_of_stage(stage), mine, theirs);
    } else {
      (void)stage, (void)mine, (void)theirs;  // one process: every stage is local
    }
  }
  /// The tie that `info` belongs to, either side (nullptr if none).
  const std::pair<const ParameterInfo*, const ParameterInfo*>* tie_of(
      const ParameterInfo& info) const {
    for (const auto& tie : ties_)
      if (tie.first == &info || tie.second == &info) return &tie;
    return nullptr;
  }
  void fill(std::vector<Buffer<float>>& where, const ParameterInfo& info, float value) {
    require_local(info);
    backend_.submit(device_of_stage(info.stage), {"fill tied gradient", info.stage},
                    [value, n = info.size, dst = where[info.stage].data() + info.offset](auto& k) {
                      k.fill(n, value, dst);
                    });
  }

  static std::string shape_string(const std::vector<std::size_t>& shape) {
    std::string out = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
      out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
  }

  Backend& backend_;
  Options options_;
  std::vector<ParameterInfo> infos_;
  Schedule schedule_;
  std::vector<OpPlace> issue_order_;
  std::vector<Buffer<float>> params_, grads_, optimizer_state_;
  const std::type_info* optimizer_type_ = nullptr;
  StepStats last_step_;
  std::size_t optimizer_steps_ = 0;
  std::vector<std::pair<const ParameterInfo*, const ParameterInfo*>> ties_;  ///< (follower, leader)
};

}  // namespace gpipe
