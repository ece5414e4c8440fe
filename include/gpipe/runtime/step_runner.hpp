#pragma once
// The trainer's step runner: the schedule (ordered and validated for the backend's transport),
// the checks of a step's inputs, the split of a batch over data-parallel replicas and
// micro-batches, the executor's run, the loss, and the step's timing. It knows the model as its
// stages' programs and shape, so it is compiled once per backend and target type.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/backend/concepts.hpp"
#include "gpipe/error.hpp"
#include "gpipe/runtime/executor.hpp"
#include "gpipe/runtime/micro_batch.hpp"
#include "gpipe/runtime/non_finite.hpp"
#include "gpipe/runtime/offload.hpp"
#include "gpipe/runtime/parameter_store.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/runtime/step_graphs.hpp"
#include "gpipe/runtime/step_stats.hpp"
#include "gpipe/schedule/inference.hpp"
#include "gpipe/schedule/rendezvous.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/schedule/validator.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe::detail {

// What the runner needs of a Pipeline's shape.
struct ModelShape {
  std::size_t in_features = 0, out_features = 0;
  std::size_t tokens_per_sample = 1;  // rows per sample: T for a token model, else 1
  std::size_t vocab_size = 0;         // a token model's V; 0: rows are features

  // Stage 0's rows are token ids (a token model), not features.
  bool takes_tokens() const { return vocab_size > 0; }
};

template <class Backend, class Target, class Precision = Fp32>
class StepRunner {
 public:
  // The context the stages' ops run on: the backend's, or its bf16 one (MixedBf16).
  using Kernels = typename ActivationContext<typename Backend::Kernels,
                                             typename Precision::activation_type>::type;
  static constexpr Sends sends = transport::Transport<Backend>::sends;

  // generated: the schedule kind's op lists for (devices, micro_batches), which the runner orders
  // for the transport's sends and validates (gpipe::Error if they do not fit it). stages and loss
  // outlive the runner. stage_remat: [stage] each stage's remat policy (gpipe::Error for
  // Remat::offload on a backend without a copy stream).
  StepRunner(Backend& backend, Schedule generated, std::span<const StageProgram<Kernels>> stages,
             const LossProgram<Kernels, Target>& loss, ModelShape shape, std::size_t micro_batches,
             std::vector<Remat> stage_remat);

  const Schedule& schedule() const { return schedule_; }
  std::vector<std::size_t> devices_of_stages() const {
    std::vector<std::size_t> out;
    for (std::size_t s = 0; s < stages_.size(); ++s) out.push_back(schedule_.device_of_stage(s));
    return out;
  }
  const StepStats& last_step() const { return last_step_; }
  BubbleBreakdown bubble_breakdown() const;

  // Trainer::locate_non_finite: whether the training steps check what each op writes.
  void locate_non_finite(bool on) {
    locate_ = on;
    if (!on) probe_.reset();
  }
  bool locates_non_finite() const { return locate_; }
  // The first non-finite value of the last training step run with locating on (the same on
  // every process); none when it found none or ran without.
  const std::optional<NonFiniteOrigin>& non_finite_origin() const { return origin_; }

  // Trainer::forward_backward of a model of feature rows.
  float forward_backward(std::span<const float> x, std::span<const Target> y,
                         ParameterStore<Backend>& store);
  // Trainer::forward_backward of a token model; document: each token's document id, or none
  // (one document per sample).
  float forward_backward(std::span<const std::int32_t> tokens, std::span<const Target> targets,
                         std::optional<std::span<const std::int32_t>> document,
                         ParameterStore<Backend>& store);
  // Trainer::predict of a model of feature rows.
  std::vector<float> predict(std::span<const float> x, ParameterStore<Backend>& store);
  // Trainer::predict of a token model; document as for forward_backward.
  std::vector<float> predict(std::span<const std::int32_t> tokens,
                             std::optional<std::span<const std::int32_t>> document,
                             ParameterStore<Backend>& store);

 private:
  // The checks of a step's inputs, `check()`'s result: on a failure, with several processes,
  // the step ends on every process at once with this one's Error (the others may have found
  // their own copy of the inputs right and issued their part: the executor's refuse tells them),
  // not after peer_timeout; in one process the Error is rethrown as it is. `store`: a training
  // step's (with replicas, its gradient sums must be started all the same), nullptr for predict.
  // No collective may come before the checks within a step.
  template <class Check>
  auto checked(Check check, ParameterStore<Backend>* store) {
    try {
      return check();
    } catch (...) {
      if (store == nullptr) transport_.abort_step(std::current_exception());
      executor(schedule_, issue_order_, *store).refuse(transport_.replicas() > 1);
    }
  }

  // Checks the targets, then runs one step on rows (tokens) x (rows, in_features); document:
  // (rows) the rows' document ids, already checked, or empty.
  float run_step(std::span<const float> x, std::span<const Target> y,
                 std::span<const std::int32_t> document, std::size_t rows,
                 ParameterStore<Backend>& store) {
    const std::size_t out = shape_.out_features, per_row = loss_.targets_per_row(out);
    const std::size_t T = shape_.tokens_per_sample;
    const std::size_t replicas = transport_.replicas();
    const MicroBatchSplit shares{rows, replicas, T};
    checked(
        [&] {
          require(y.size() == rows * per_row,
                  "y has " + std::to_string(y.size()) + " targets, expected " +
                      std::to_string(rows * per_row) + " (" + std::to_string(rows) +
                      (shape_.takes_tokens() ? " tokens x " : " rows x ") +
                      std::to_string(per_row) + ")");
          loss_.check(y, out);
          if (replicas > 1)
            require(shares.size(replicas - 1) / T >= micro_batches_,
                    "the batch has " + std::to_string(shares.samples()) +
                        " samples: " + std::to_string(replicas) +
                        " replicas x micro_batches = " + std::to_string(micro_batches_) +
                        " need at least " + std::to_string(replicas * micro_batches_));
        },
        &store);

    // A data-parallel replica runs its share of the samples, as evenly as they go.
    const std::size_t replica = transport_.replica();
    const std::size_t mine = shares.size(replica), first = shares.begin(replica);
    const auto my_x = x.subspan(first * shape_.in_features, mine * shape_.in_features);
    const auto my_y = y.subspan(first * per_row, mine * per_row);
    const auto my_document = document.empty() ? document : document.subspan(first, mine);
    // every replica divides by the whole mini-batch's normalizer (every process has all of y)
    const double normalizer = loss_.normalizer(y, out);

    const MicroBatchSplit split{mine, micro_batches_, T};
    origin_.reset();
    if (locate_ && !probe_) probe_.emplace(backend_, store.infos(), stages_.size());
    auto executor = this->executor(schedule_, issue_order_, store, &graphs_, &offload_,
                                   locate_ ? &*probe_ : nullptr);
    store.restart_tied_gradients();
    transport_.restart_timing();  // this step's count starts afresh (no collective: see there)
    // with replicas, each stage's gradients are summed over them during the step
    const double total = executor.run({.x = my_x,
                                       .y = my_y,
                                       .document = my_document,
                                       .split = split,
                                       .remat = remat_,
                                       .loss_scale = static_cast<float>(1.0 / normalizer),
                                       .sum_over_replicas = replicas > 1});
    last_step_ = step_stats(take_timing(), schedule_.num_devices);
    if (locate_) locate(my_x, split);
    store.sum_tied_gradients();
    float loss = static_cast<float>(total / normalizer);
    // the last stage's process has its replica's part; the replicas' parts add up
    transport_.broadcast(schedule_.device_of_stage(stages_.size() - 1), std::span<float>(&loss, 1));
    if (replicas > 1) transport_.allreduce_sum(std::span<float>(&loss, 1));
    return loss;
  }

  std::vector<float> run_predict(std::span<const float> x, std::span<const std::int32_t> document,
                                 std::size_t rows, ParameterStore<Backend>& store) {
    const std::size_t T = shape_.tokens_per_sample;
    std::vector<float> out(rows * shape_.out_features);
    const MicroBatchSplit split{rows, std::min(rows / T, micro_batches_), T};
    // the forward half of the pipeline as a program of its own, valid under both send rules
    // and in message order by construction (schedule/inference.hpp), proven all the same
    const Schedule program = inference_schedule_for(schedule_, split.micro_batches);
    require_valid(program, sends);
    const std::vector<OpPlace> order = issue_order(program);
    executor(program, order, store)
        .run({.x = x, .y = {}, .out = out, .document = document, .split = split});
    transport_.broadcast(schedule_.device_of_stage(stages_.size() - 1), std::span<float>(out));
    return out;
  }

  // The first stage's rows of a token model: each id as a float (exact: ids are below
  // vocab_size <= 2^24), after checking that the ids are whole samples, at least min_samples of
  // them, and every one in [0, V).
  std::vector<float> token_rows(std::span<const std::int32_t> tokens,
                                std::size_t min_samples) const {
    const std::size_t T = shape_.tokens_per_sample, V = shape_.vocab_size;
    require(!tokens.empty() && tokens.size() % T == 0,
            "the batch has " + std::to_string(tokens.size()) +
                " tokens, which is not a positive number of whole samples of T = " +
                std::to_string(T) + " tokens");
    const std::size_t samples = tokens.size() / T;
    require(samples >= min_samples,
            "the batch has " + std::to_string(samples) +
                " samples, fewer than micro_batches = " + std::to_string(min_samples) +
                " (every micro-batch needs at least one whole sample)");
    std::vector<float> rows(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::int32_t id = tokens[i];
      require(id >= 0 && static_cast<std::size_t>(id) < V,
              "token " + std::to_string(i) + " (sample " + std::to_string(i / T) + ", position " +
                  std::to_string(i % T) + ") is " + std::to_string(id) +
                  ", expected an id in [0, " + std::to_string(V) + ")");
      rows[i] = static_cast<float>(id);
    }
    return rows;
  }

  // The document ids of a step on `tokens`, when it has them: as many as tokens (any values:
  // only where they change matters). None gives an empty span, which the layers see as nullptr.
  static std::span<const std::int32_t> checked_document(
      std::span<const std::int32_t> tokens, std::optional<std::span<const std::int32_t>> document) {
    if (!document) return {};
    require(document->size() == tokens.size(),
            "document_ids has " + std::to_string(document->size()) + " ids, expected " +
                std::to_string(tokens.size()) + " (one per token, as many as tokens)");
    return *document;
  }

  std::vector<ComputeTiming> take_timing() { return backend_.take_timing(); }

  // After a located step's work: origin_ <- the first finding of every process and replica.
  // Collective: each device's process broadcasts its first key, then the replicas add up a
  // vector where each writes its own (as two floats of 24 bits: keys are below 2^48).
  void locate(std::span<const float> x, const MicroBatchSplit& split) {
    std::optional<std::size_t> input;
    if (!shape_.takes_tokens())
      for (std::size_t mb = 0; mb < split.micro_batches && !input; ++mb)
        for (std::size_t i = split.begin(mb) * shape_.in_features;
             i < split.begin(mb + 1) * shape_.in_features; ++i)
          if (!std::isfinite(x[i])) {
            input = mb;
            break;
          }
    const double mine = probe_->first_key(input);
    probe_->clear();
    double key = mine;
    for (std::size_t d = 0; d < schedule_.num_devices; ++d) {
      double theirs = mine;
      transport_.broadcast(d, std::span<double>(&theirs, 1));
      key = std::min(key, theirs);
    }
    constexpr double half = 16777216.0;  // 2^24
    const std::size_t replicas = transport_.replicas();
    std::vector<float> keys(2 * replicas, 0.0f);
    const double hi = std::isfinite(key) ? std::floor(key / half) : half - 1;
    keys[2 * transport_.replica()] = static_cast<float>(hi);
    keys[2 * transport_.replica() + 1] = static_cast<float>(key - hi * half);
    if (replicas > 1) transport_.allreduce_sum(std::span<float>(keys));
    std::size_t replica = 0;
    double best = (half - 1) * half;  // none
    for (std::size_t r = 0; r < replicas; ++r) {
      const double k =
          static_cast<double>(keys[2 * r]) * half + static_cast<double>(keys[2 * r + 1]);
      if (k < best) best = k, replica = r;
    }
    if (best < (half - 1) * half) origin_ = probe_->origin(best, schedule_, issue_order_, replica);
  }

  // An executor of `program` (issued in `order`; both outlive it) over the store's arrays; with
  // `graphs`, the training steps' (a backend may replay them); with `offload`, theirs too
  // (Remat::offload).
  Executor<Backend, Target, Precision> executor(
      const Schedule& program, std::span<const OpPlace> order, ParameterStore<Backend>& store,
      StepGraphs<Backend>* graphs = nullptr, Offload<Backend>* offload = nullptr,
      NonFiniteProbe<Backend, typename Precision::activation_type>* probe = nullptr) {
    return {backend_,
            program,
            order,
            stages_,
            loss_,
            store.params(),
            store.grads(),
            store.bf16_weights(),
            shape_.takes_tokens(),
            graphs,
            offload,
            probe};
  }

  Backend& backend_;
  transport::Transport<Backend> transport_;
  Schedule schedule_;
  std::vector<OpPlace> issue_order_;
  std::span<const StageProgram<Kernels>> stages_;
  const LossProgram<Kernels, Target>& loss_;
  ModelShape shape_;
  std::size_t micro_batches_;
  std::vector<Remat> remat_;  // [stage] each stage's policy
  StepStats last_step_;
  // Remat::offload's host blocks, where the backend has them (before graphs_, whose graphs copy to
  // and from them, so that it goes after them)
  Offload<Backend> offload_{backend_};
  StepGraphs<Backend> graphs_{backend_};  // the training steps' graphs, where the backend has them
  bool locate_ = false;                   // Trainer::locate_non_finite
  std::optional<NonFiniteProbe<Backend, typename Precision::activation_type>> probe_;
  std::optional<NonFiniteOrigin> origin_;  // the last training step's, when located
};

// The members the Trainer calls are defined out of the class, so that a program that declares
// StepRunner<host::Backend, ...> an explicit instantiation (extern template, under
// GPIPE_COMPILED_HOST: backend/host/compiled.hpp) compiles none of the step's code itself.

template <class Backend, class Target, class Precision>
StepRunner<Backend, Target, Precision>::StepRunner(Backend& backend, Schedule generated,
                                                   std::span<const StageProgram<Kernels>> stages,
                                                   const LossProgram<Kernels, Target>& loss,
                                                   ModelShape shape, std::size_t micro_batches,
                                                   std::vector<Remat> stage_remat)
    : backend_(backend),
      transport_(backend),
      schedule_(std::move(generated)),
      stages_(stages),
      loss_(loss),
      shape_(shape),
      micro_batches_(micro_batches),
      remat_(std::move(stage_remat)) {
  check_offload<Backend>(remat_);
  if constexpr (sends == Sends::rendezvous) schedule_ = order_for_rendezvous(schedule_);
  require_valid(schedule_, sends);
  if constexpr (sends == Sends::rendezvous) {
    // rendezvous transports (NCCL) also match a pair's messages by the order they are posted
    const MessageOrder order = messages_in_order(schedule_);
    require(order.ok, "the schedule's " +
                          std::string(order.gradients ? "gradients" : "activations") +
                          " from device " + std::to_string(order.sender) + " to device " +
                          std::to_string(order.receiver) +
                          " are received in another order than they are sent, and this "
                          "backend's transport (NCCL) matches them by order");
  }
  issue_order_ = issue_order(schedule_);
}

template <class Backend, class Target, class Precision>
BubbleBreakdown StepRunner<Backend, Target, Precision>::bubble_breakdown() const {
  BubbleBreakdown out = gpipe::bubble_breakdown(schedule_, last_step_);
  if constexpr (requires { backend_.devices_share_cores(out.busy_devices); })
    out.devices_share_cores = backend_.devices_share_cores(out.busy_devices);
  return out;
}

template <class Backend, class Target, class Precision>
float StepRunner<Backend, Target, Precision>::forward_backward(std::span<const float> x,
                                                               std::span<const Target> y,
                                                               ParameterStore<Backend>& store) {
  const std::size_t in = shape_.in_features;
  const std::size_t rows = checked(
      [&] {
        require(x.size() % in == 0,
                "x has " + std::to_string(x.size()) +
                    " floats, which is not a multiple of in_features = " + std::to_string(in) +
                    " (expected batch x " + std::to_string(in) + ", row-major)");
        require(x.size() / in >= micro_batches_,
                "the batch has " + std::to_string(x.size() / in) +
                    " rows, fewer than micro_batches = " + std::to_string(micro_batches_) +
                    " (every micro-batch needs at least one row)");
        return x.size() / in;
      },
      &store);
  return run_step(x, y, {}, rows, store);
}

template <class Backend, class Target, class Precision>
float StepRunner<Backend, Target, Precision>::forward_backward(
    std::span<const std::int32_t> tokens, std::span<const Target> targets,
    std::optional<std::span<const std::int32_t>> document, ParameterStore<Backend>& store) {
  std::span<const std::int32_t> ids;
  const std::vector<float> x = checked(
      [&] {
        std::vector<float> rows = token_rows(tokens, micro_batches_);
        ids = checked_document(tokens, document);
        return rows;
      },
      &store);
  return run_step(x, targets, ids, tokens.size(), store);
}

template <class Backend, class Target, class Precision>
std::vector<float> StepRunner<Backend, Target, Precision>::predict(std::span<const float> x,
                                                                   ParameterStore<Backend>& store) {
  const std::size_t in = shape_.in_features;
  checked(
      [&] {
        require(x.size() % in == 0 && !x.empty(),
                "x has " + std::to_string(x.size()) +
                    " floats, expected a positive multiple of in_features = " + std::to_string(in) +
                    " (batch x " + std::to_string(in) + ", row-major)");
      },
      nullptr);
  return run_predict(x, {}, x.size() / in, store);
}

template <class Backend, class Target, class Precision>
std::vector<float> StepRunner<Backend, Target, Precision>::predict(
    std::span<const std::int32_t> tokens, std::optional<std::span<const std::int32_t>> document,
    ParameterStore<Backend>& store) {
  std::span<const std::int32_t> ids;
  const std::vector<float> x = checked(
      [&] {
        std::vector<float> rows = token_rows(tokens, 1);
        ids = checked_document(tokens, document);
        return rows;
      },
      nullptr);
  return run_predict(x, ids, tokens.size(), store);
}

}  // namespace gpipe::detail
