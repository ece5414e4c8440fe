#pragma once
// gpipe::Trainer<Model, Loss, Backend, Schedule>: trains a Pipeline with pipelined micro-batches.
//
//   gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend> trainer(
//       backend, {.micro_batches = 8, .remat = gpipe::Remat::always});
//   float loss = trainer.forward_backward(x, y);   // mean loss; gradients accumulate
//   trainer.step(optimizer);                       // update on every stage's device
//   trainer.zero_grad();
//
// A thin facade over four parts that see the model as data (its stages' programs, shapes and
// parameter names), so that they are compiled once per backend and not once per model: the
// parameter store (storage, initialization, names, ties, files; runtime/parameter_store.hpp),
// the optimizer state (runtime/optimizer_state.hpp), checkpoints (runtime/checkpoint.hpp) and
// the step runner (schedule, executor, timing; runtime/step_runner.hpp). What depends on the
// model's types is here: the schedule's generator and the typed entry points, and the checks that
// the model runs on the backend (runtime/trainer_checks.hpp).

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/backend/concepts.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/loss.hpp"
#include "gpipe/model/pipeline.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/optim/optimizer.hpp"
#include "gpipe/runtime/checkpoint.hpp"
#include "gpipe/runtime/optimizer_state.hpp"
#include "gpipe/runtime/parameter_store.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/runtime/step_runner.hpp"
#include "gpipe/runtime/step_stats.hpp"
#include "gpipe/runtime/trainer_checks.hpp"
#include "gpipe/schedule/gpipe.hpp"
#include "gpipe/schedule/kind.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe {

/// Trains the `Pipeline` `Model` with pipelined micro-batches: `forward_backward` adds the
/// gradients of the mini-batch mean `Loss` (`SoftmaxCrossEntropy` or `MSELoss`), `step` applies
/// an optimizer on every stage's own device. Stage s lives on device `device_of_stage(s)` of
/// `Backend`, and `ScheduleKind` (`GPipe`, `OneFOneB`, `Interleaved<V>`, `ZeroBubbleH1`) orders
/// each device's ops. Parameters are initialized from `Options::seed` in nn.Sequential order with
/// PyTorch's default distributions, so the same seed gives the same model for every split into
/// stages. Gradients are the same numbers for any number of stages, micro-batches, remat policy
/// and schedule. After a call that threw, gradients are unspecified: call `zero_grad()`.
///
///     Trainer<Model, SoftmaxCrossEntropy, host::Backend> trainer(backend, {.micro_batches = 8});
///     float loss = trainer.forward_backward(x, y);  // mean loss; gradients accumulate
///     trainer.step(optimizer);                      // on every stage's device
///     trainer.zero_grad();
///
/// A compile error names a layer the backend cannot run, the piece a Loss, ScheduleKind or
/// optimizer lacks (the concepts `loss_for`, `schedule_kind`, `optimizer_for`), or a stage count
/// that is not a multiple of the schedule's chunks per device.
template <class Model, class Loss, backend Backend, class ScheduleKind = GPipe,
          class Precision = Fp32>
class Trainer {
  static_assert(detail::explain_trainer_for<Model, Loss, Backend, ScheduleKind, Precision>());
  // The context the model's ops run on: the backend's, or its bf16 one.
  using ActivationKernels =
      typename detail::ActivationContext<typename Backend::Kernels,
                                         typename Precision::activation_type>::type;

 public:
  using model_type = Model;            ///< the `Pipeline` of stages being trained
  using schedule_type = ScheduleKind;  ///< the schedule's tag type, e.g. `GPipe`
  using loss_type = Loss;              ///< the loss the last stage applies
  using backend_type = Backend;        ///< where the stages run
  using precision_type = Precision;    ///< `Fp32` or `MixedBf16`
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
    /// Which micro-batches drop their activations (or, `Remat::selective`, the cheap layers'
    /// outputs) after forward and recompute them before backward: less memory for more
    /// compute, the same gradients. `Remat::offload` moves them to pinned host memory and back
    /// instead (a backend with a copy stream: cuda::Backend, mpi::CudaBackend; elsewhere the
    /// constructor throws gpipe::Error). The same policy for every stage; `stage_remat` sets one
    /// per stage.
    Remat remat = Remat::never;
    /// One remat policy per stage of the model, [stage] (with `Interleaved<V>`, V K entries, in
    /// stage order), e.g. `{Remat::always, Remat::selective, Remat::never}` for a 1F1B pipeline
    /// whose first stages hold the most micro-batches' stashes. Empty: `remat` for every stage.
    /// The constructor throws gpipe::Error for another length than `num_stages`, or beside a
    /// `remat` other than its default. Gradients are the same for any mix.
    std::vector<Remat> stage_remat = {};
    /// Seed of the parameters' initialization (PyTorch's default distributions, in
    /// nn.Sequential order): the same seed gives the same model for every split into stages.
    std::uint64_t seed = 0;
    /// Parameters that share one tensor; the constructor throws `gpipe::Error` for an unknown
    /// name, a shape mismatch, a self-tie or a chain.
    std::vector<Tie> ties = {};
    /// The ops to run instead of `ScheduleKind::make(num_devices, micro_batches)`'s: a schedule
    /// chosen at run time (`gpipe::search_schedule`, `gpipe::plan`), with any placement. It must
    /// be for num_devices devices, `micro_batches` micro-batches and chunks_per_device chunks
    /// (else `gpipe::Error`), and the validator proves it as it proves a generated one.
    std::optional<Schedule> schedule = std::nullopt;
    /// step() skips the update when the gradients' total norm is not finite (a NaN or an inf in
    /// any gradient of any stage, process or replica: every process decides alike): the
    /// parameters and the optimizer's state and step count stay as they were, skipped_steps()
    /// counts it. Costs one pass over the gradients per step unless clip_grad_norm ran since
    /// the last change of the gradients.
    bool skip_non_finite = false;
  };

  /// S, the model's stages.
  static constexpr std::size_t num_stages = Model::num_stages;
  /// How the backend's transport completes a send: the schedule is ordered and validated for it.
  static constexpr Sends sends = transport::Transport<Backend>::sends;
  /// Pipeline devices the schedule uses: S / chunks_per_device (S, or S / V for
  /// `Interleaved<V>`). The backend needs at least this many (exactly this many per replica when
  /// it runs across processes).
  static constexpr std::size_t num_devices = Model::num_stages / ScheduleKind::chunks_per_device;

  /// Builds and validates the schedule for `options.micro_batches`, allocates the parameters and
  /// gradients of every stage this process runs on that stage's device (under `MixedBf16` also
  /// the parameters' bf16 copy, which the GEMMs read), initializes the
  /// parameters from `options.seed` and zeroes the gradients. `backend` must outlive the trainer.
  /// Throws `gpipe::Error` for micro_batches == 0, stage_remat of another length than num_stages, a
  /// backend with fewer devices than num_devices
  /// (across processes: other than num_devices per replica) or a bad tie; `OutOfMemory` when an
  /// allocation exceeds a device's capacity (across processes: on every process when one
  /// process's does: none is left waiting, and the processes can go on together).
  Trainer(Backend& backend, Options options)
      : backend_(backend),
        options_(std::move(options)),
        runner_(backend, generate_schedule(backend, options_), activation_programs_,
                detail::loss_program<Loss, ActivationKernels>, shape(), options_.micro_batches,
                detail::stage_policies(options_.remat, options_.stage_remat, num_stages)),
        store_(backend, programs_, runner_.devices_of_stages(), Model::parameters(), options_.ties,
               !std::is_same_v<typename Precision::activation_type, float>) {
    store_.initialize(options_.seed);
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// The options it was built with.
  const Options& options() const { return options_; }
  /// The ops every step runs, per device, for (num_devices, micro_batches); ordered for the
  /// transport's `sends` and validated.
  const Schedule& schedule() const { return runner_.schedule(); }
  /// The backend device that holds stage `stage` (parameters, gradients, optimizer state) and runs
  /// its ops.
  std::size_t device_of_stage(std::size_t stage) const {
    return runner_.schedule().device_of_stage(stage);
  }
  /// The backend it runs on.
  Backend& backend() const { return backend_; }

  /// x: (N, in_features) row-major; y: N class ids (SoftmaxCrossEntropy) or (N, out_features)
  /// floats (MSELoss). Returns the mean loss over the mini-batch and adds its gradients.
  float forward_backward(std::span<const float> x,
                         std::span<const target_type> y) requires(!Model::is_token_model) {
    begin_step();
    return located(runner_.forward_backward(x, y, store_));
  }

  /// Token models: tokens and targets are (B, T) token ids, row-major, B whole samples of T =
  /// Model::tokens_per_sample. Returns the mean loss over the B T tokens' targets (those not
  /// ignored: `SoftmaxCrossEntropy` skips -100) and adds its gradients. Each sample is one
  /// document.
  float forward_backward(std::span<const std::int32_t> tokens,
                         std::span<const target_type> targets) requires(Model::is_token_model) {
    begin_step();
    return located(runner_.forward_backward(tokens, targets, std::nullopt, store_));
  }

  /// Token models with packed documents: as forward_backward(tokens, targets), with
  /// document_ids (B, T) each token's document. Within a sample a token attends only to the
  /// earlier tokens of its own run of equal ids (runs end at sample borders; two runs of one id
  /// are two documents), and positions restart at 0 where a run starts. Throws `gpipe::Error`
  /// for document_ids of another length than tokens, leaving the trainer as it was.
  float forward_backward(
      std::span<const std::int32_t> tokens, std::span<const target_type> targets,
      std::span<const std::int32_t> document_ids) requires(Model::is_token_model) {
    begin_step();
    return located(runner_.forward_backward(tokens, targets, document_ids, store_));
  }

  /// Inference: the model's output (N, out_features) for x (N, in_features), micro-batches
  /// pipelined through the stages; gradients are untouched.
  std::vector<float> predict(std::span<const float> x) requires(!Model::is_token_model) {
    return runner_.predict(x, store_);
  }

  /// Token models: the logits (B T, out_features) of every token of (B, T) token ids.
  std::vector<float> predict(std::span<const std::int32_t> tokens) requires(Model::is_token_model) {
    return runner_.predict(tokens, std::nullopt, store_);
  }

  /// Token models with packed documents: the logits of every token, document_ids (B, T) as for
  /// forward_backward(tokens, targets, document_ids).
  std::vector<float> predict(
      std::span<const std::int32_t> tokens,
      std::span<const std::int32_t> document_ids) requires(Model::is_token_model) {
    return runner_.predict(tokens, document_ids, store_);
  }

  /// Timing of the last successful forward_backward (empty if the backend does not time work).
  const StepStats& last_step() const { return runner_.last_step(); }

  /// What the last step's measured bubble is made of, measured = schedule + imbalance +
  /// overhead (computed when asked: it runs the schedule's simulator twice; see
  /// `gpipe::bubble_breakdown`); all zero when the backend does not time work.
  BubbleBreakdown bubble_breakdown() const { return runner_.bubble_breakdown(); }

  /// Sets every gradient (of this process's stages) to 0 and waits for the devices. Each
  /// `forward_backward` adds to the gradients, so without it gradients sum over mini-batches.
  void zero_grad() {
    between_steps("Trainer::zero_grad", [&] { store_.zero_grad(); });
    known_norm_.reset();
  }

  /// One optimizer update of every parameter from its accumulated gradient, on each stage's
  /// device. The optimizer's state is kept here, per stage, and restarts when the optimizer's
  /// type changes.
  template <class Optimizer>
  void step(const Optimizer& optimizer) {
    static_assert(detail::explain_optimizer_for<Optimizer, Kernels>(),
                  "gpipe: Trainer::step's argument is not an optimizer for this backend (named "
                  "above)");
    last_step_skipped_ = false;
    if (options_.skip_non_finite) {
      const double norm = known_norm_
                              ? *known_norm_
                              : between_steps("Trainer::step", [&] { return store_.grad_norm(); });
      if (!std::isfinite(norm)) return skip_step();
    }
    between_steps("Trainer::step", [&] { optimizer_.step(optimizer, store_, backend_); });
    end_step();
  }

  /// Ends the training step without an update (the caller's decision, e.g. a loss spike; or
  /// step()'s under skip_non_finite): parameters and optimizer state stay as they were,
  /// skipped_steps() counts it, last_step_seconds() times it. The gradients are left as they are.
  void skip_step() {
    ++skipped_steps_;
    last_step_skipped_ = true;
    end_step();
  }
  /// Steps ended without an update since construction (skip_step, or step() under
  /// Options::skip_non_finite).
  std::size_t skipped_steps() const { return skipped_steps_; }
  /// Whether the last step ended without an update.
  bool last_step_skipped() const { return last_step_skipped_; }

  /// The names of the gradients that hold a NaN or an inf now (a tied pair under the name `save`
  /// writes), in parameter order; empty when every gradient is finite. One pass over the
  /// gradients; collective with several processes (every process gets the same list).
  std::vector<std::string> non_finite_gradients() {
    known_norm_ =
        between_steps("Trainer::non_finite_gradients", [&] { return store_.grad_norm(); });
    return store_.non_finite_tensors();
  }

  /// Turns on (or off) locating the first non-finite value of each training step, for
  /// non_finite_origin(): every forward_backward then checks, on the devices, what each of its
  /// compute ops wrote (a forward's output or loss, a backward_input's input gradient, each
  /// gradient tensor after a backward_weight) and the input rows on the host, and the processes
  /// agree on the first finding in the schedule's issue order. It costs a pass over each op's
  /// result and over each stage's gradients per micro-batch, a few small collectives per step,
  /// and the step runs op by op (no CUDA graph); off (the default) it costs nothing.
  void locate_non_finite(bool on = true) { runner_.locate_non_finite(on); }
  /// Under locate_non_finite: where the first non-finite value of the current training step (of
  /// the last one, after step() or skip_step(), until the next forward_backward) came from:
  /// stage, micro-batch, replica and tensor (`gpipe::NonFiniteOrigin`), the same on every
  /// process; none when every value was finite, or when locating was off. A gradient that was
  /// already non-finite when a forward_backward began (not zeroed since an earlier step) is not
  /// blamed on it.
  const std::optional<NonFiniteOrigin>& non_finite_origin() const { return origin_; }

  /// The wall time of the last training step over every process, in seconds: from the earliest
  /// process's start of its first `forward_backward` after the previous `step` (or after
  /// construction) to the latest process's end of `step`, everything in between included (every
  /// forward_backward of gradient accumulation, clipping, ties, the optimizer), so that a training
  /// loop times itself without barriers of its own. Collective with several processes: every
  /// process calls it (one MPI_Allreduce of two doubles; across machines the ranks' clocks are
  /// aligned as their traces' are). Throws `gpipe::Error` before the first `step`.
  double last_step_seconds() const {
    detail::require(last_span_.has_value(),
                    "last_step_seconds: no training step has ended yet (a step ends with step())");
    return transport::Transport<Backend>(backend_).wall_seconds(last_span_->first,
                                                                last_span_->second);
  }

  /// torch.nn.utils.clip_grad_norm_ over the whole model: the L2 norm of every gradient of every
  /// stage, process and replica (a tied pair counted once); when max_norm / (norm + 1e-6) < 1,
  /// every gradient is scaled by that factor. Returns the norm before clipping, the same on every
  /// process. Each tensor's squares are summed in double in a fixed order on its device and the
  /// tensors' sums in parameter order, so the same gradients give the same norm bit for bit
  /// whatever the split into stages, devices and processes. Throws `gpipe::Error` for a negative
  /// max_norm; a non-finite norm is returned and leaves the gradients as they are.
  float clip_grad_norm(double max_norm) {
    detail::require(max_norm >= 0, [&] {
      return "clip_grad_norm's max_norm must be >= 0, got " + std::to_string(max_norm);
    });
    const double norm =
        between_steps("Trainer::clip_grad_norm", [&] { return store_.clip_grad_norm(max_norm); });
    // what step() under skip_non_finite asks (scaling by a factor below 1 keeps it finite)
    known_norm_ = norm;
    return static_cast<float>(norm);
  }

  /// Multiplies every gradient by `factor` (on every process, each its own stages). Gradient
  /// accumulation: after A forward_backward calls on A equal mini-batches the gradients are the
  /// sum of their means; `scale_gradients(1.0 / A)` makes them the gradient of the mean over all
  /// A (nanoGPT's `loss / gradient_accumulation_steps`). Throws `gpipe::Error` for a factor that
  /// is not finite.
  void scale_gradients(double factor) {
    detail::require(std::isfinite(factor),
                    "scale_gradients' factor must be finite, got " + std::to_string(factor));
    between_steps("Trainer::scale_gradients",
                  [&] { store_.scale_gradients(static_cast<float>(factor)); });
    known_norm_.reset();
  }

  /// Writes a checkpoint to directory `dir`: the parameters, the optimizer's state under
  /// PyTorch's names and its step count, and `user` (strings the caller wants back, e.g. the
  /// data position), in the sharded safetensors layout (runtime/checkpoint.hpp). Collective with
  /// several processes: each writes its own stages' shard (replica 0), rank 0 the index. Crash
  /// safe: `dir` is a link to the newest complete version, replaced atomically once it is on
  /// disk, so a process killed at any moment leaves the previous checkpoint or the new one.
  void save_checkpoint(const std::filesystem::path& dir,
                       const std::map<std::string, std::string>& user = {}) {
    detail::Checkpoint<Backend>(backend_, store_, optimizer_).save(dir, user);
  }
  /// Restores a checkpoint of `save_checkpoint` into this trainer, whatever K, M, schedule,
  /// processes and replicas wrote it, and returns its `user` map. The next `step` continues the
  /// optimizer (bit for bit with the same K, M and schedule on the host backend); one with
  /// another kind of optimizer than the checkpoint's is a `gpipe::Error`. A missing or damaged
  /// file, a missing tensor, a wrong shape or another model is a `gpipe::Error` naming the file
  /// and the tensor, and leaves the trainer as it was.
  std::map<std::string, std::string> load_checkpoint(const std::filesystem::path& dir) {
    return detail::Checkpoint<Backend>(backend_, store_, optimizer_).load(dir);
  }

  /// Every parameter tensor: name, shape, stage.
  const std::vector<ParameterInfo>& parameter_info() const { return store_.infos(); }

  /// The values of parameter `name`, row-major in its `parameter_info()` shape. Throws
  /// `gpipe::Error` for an unknown name or, with a multi_process_backend, a parameter of another
  /// process's stage (the message names its owner).
  std::vector<float> parameter(std::string_view name) const { return store_.parameter(name); }
  /// The gradient accumulated for parameter `name` since the last `zero_grad()`, as `parameter`
  /// gives values (same shape and errors); a tied pair both hold the sum of their gradients.
  std::vector<float> gradient(std::string_view name) const { return store_.gradient(name); }
  /// Sets a parameter; for a tied one, the tensor it shares with its partner. With several
  /// processes, a parameter of another process's stage is an Error; for a tied pair on two
  /// processes both call it (the leader's writes, the follower's receives).
  void set_parameter(std::string_view name, std::span<const float> values) {
    store_.set_parameter(name, values);
  }

  /// Parameters from a safetensors file with exactly the model's names and shapes (as PyTorch's
  /// load_state_dict with strict=True); a tied pair may be given under either name or both
  /// (equal). With `names`, each parameter is read under `names.file_name(name)` and the tensors
  /// `names` skips are ignored: `trainer.load("gpt2.safetensors", gpipe::nanogpt_names<Gpt>())`
  /// reads nanoGPT's state dict. With several processes each reads the file and keeps its own
  /// stages' tensors.
  void load(const std::filesystem::path& path, const NameMap& names = {}) {
    store_.load(path, names);
  }
  /// The model's parameters as one safetensors file (F32, a tied tensor once, under `Tie::to`, or
  /// the name `names` gives it), which `load` reads back. With several processes, every process
  /// calls it (each stage's owner sends its tensors) and the first device's writes it.
  void save(const std::filesystem::path& path, const NameMap& names = {}) const {
    store_.save(path, names);
  }
  /// The accumulated gradients as `save` writes the parameters: same names, shapes and processes.
  void save_gradients(const std::filesystem::path& path) const { store_.save_gradients(path); }

 private:
  using Kernels = typename Backend::Kernels;
  using Clock = std::chrono::steady_clock;

  // Runs `work`, between-steps work of the member `what`. A throw from it may come on this
  // process alone, which then skips collectives that the others wait in: with several processes
  // it tells them at once (Transport::fail_between_steps) and rethrows.
  template <class Work>
  decltype(auto) between_steps(std::string_view what, Work&& work) {
    try {
      return std::forward<Work>(work)();
    } catch (...) {
      transport::Transport<Backend>(backend_).fail_between_steps(what, std::current_exception());
      throw;
    }
  }

  // A training step starts with the first forward_backward after the last step().
  void begin_step() {
    if (!step_start_) {
      step_start_ = Clock::now();
      origin_.reset();
    }
    known_norm_.reset();
  }
  // After a forward_backward: the training step's first non-finite value, if it is the first.
  float located(float loss) {
    if (!origin_) origin_ = runner_.non_finite_origin();
    return loss;
  }
  void end_step() {
    const Clock::time_point end = Clock::now();
    last_span_ = {step_start_.value_or(end), end};
    step_start_.reset();
  }

  static constexpr detail::ModelShape shape() {
    return {.in_features = Model::in_features,
            .out_features = Model::out_features,
            .tokens_per_sample = Model::tokens_per_sample,
            .vocab_size = Model::is_token_model ? Model::vocab_size : 0};
  }
  // The schedule kind's op lists (or the options' schedule, checked against the shape), after
  // checking that the backend runs num_devices devices.
  static Schedule generate_schedule(const Backend& backend, const Options& options) {
    const std::size_t micro_batches = options.micro_batches;
    detail::require(micro_batches >= 1, "micro_batches must be at least 1");
    // before the device count: a plan of two stages per device handed to a tag of one would
    // otherwise be refused for the backend's devices, which are right for the plan
    if (options.schedule)
      detail::require(options.schedule->num_chunks == ScheduleKind::chunks_per_device, [&] {
        const std::string given = std::to_string(options.schedule->num_chunks);
        return "Options::schedule runs " + given + " stage(s) per device, and this trainer's " +
               "schedule kind \"" + std::string(std::string_view(ScheduleKind::name)) + "\" runs " +
               std::to_string(ScheduleKind::chunks_per_device) +
               ": build the trainer with a schedule kind of " + given +
               " per device (a plan's: gpipe::PlannedSchedule<" + given + ">)";
      });
    transport::Transport<Backend>::check_device_count(backend, num_devices, num_stages);
    if (!options.schedule) return ScheduleKind::make(num_devices, micro_batches);
    const Schedule& given = *options.schedule;
    detail::require(given.num_devices == num_devices && given.num_micro_batches == micro_batches &&
                        given.num_chunks == ScheduleKind::chunks_per_device,
                    "Options::schedule is for " + std::to_string(given.num_devices) + " devices, " +
                        std::to_string(given.num_micro_batches) + " micro-batches and " +
                        std::to_string(given.num_chunks) +
                        " chunks per device; this trainer runs " + std::to_string(num_devices) +
                        ", " + std::to_string(micro_batches) + " and " +
                        std::to_string(ScheduleKind::chunks_per_device));
    return given;
  }

  // The stages' programs on the backend's context (the parameter store's sizes and
  // initialization) and on the one the ops run on (the same one for Fp32).
  static constexpr std::span<const detail::StageProgram<Kernels>> programs_ =
      detail::model_program<Model, Kernels>;
  static constexpr std::span<const detail::StageProgram<ActivationKernels>> activation_programs_ =
      detail::model_program<Model, ActivationKernels>;

  Backend& backend_;
  Options options_;
  detail::StepRunner<Backend, target_type, Precision> runner_;
  detail::ParameterStore<Backend> store_;
  detail::OptimizerState<Backend> optimizer_;
  std::optional<Clock::time_point> step_start_;  // the open training step's start, if any
  // the last training step's start and end on this process (step())
  std::optional<std::pair<Clock::time_point, Clock::time_point>> last_span_;
  // the gradients' norm when known since they last changed (clip_grad_norm,
  // non_finite_gradients), for step() under skip_non_finite
  std::optional<double> known_norm_;
  std::size_t skipped_steps_ = 0;
  bool last_step_skipped_ = false;
  std::optional<NonFiniteOrigin> origin_;  // the training step's first non-finite value
};

}  // namespace gpipe
