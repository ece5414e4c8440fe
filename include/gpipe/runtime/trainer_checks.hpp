#pragma once
// What Trainer<Model, Loss, Backend, ScheduleKind, Precision> checks when it is declared, so that a
// model, loss or schedule kind that cannot run names what it lacks there, rather than deep inside
// the first forward_backward.

#include <cstddef>
#include <type_traits>
#include <utility>

#include "gpipe/error.hpp"
#include "gpipe/model/loss.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/schedule/kind.hpp"

namespace gpipe::detail {

// True when the backend runs Model in Precision; otherwise a static_assert that says why not.
template <class Precision, class Backend, class Model>
constexpr bool explain_precision_for() {
  if constexpr (!precision<Precision> ||
                std::is_same_v<typename Precision::activation_type, float>) {
    return true;
  } else if constexpr (!requires(typename Backend::Kernels & k) { k.bf16_context(); }) {
    static_assert(lacks<Backend>,
                  "gpipe: MixedBf16 needs a backend with bf16 kernels (host::Backend, "
                  "mpi::Backend, cuda::Backend, mpi::CudaBackend); this one has none");
    return false;
  } else if constexpr (Model::is_token_model && Model::vocab_size > 65536) {
    static_assert(lacks<Model>,
                  "gpipe: MixedBf16 carries token ids in 16 bits: a vocabulary of at most 65536");
    return false;
  } else {
    return true;
  }
}
// Whether every layer of every stage runs with the kernel context Ctx (see explain_layer_for).
template <class Model, class Ctx, std::size_t... S>
constexpr bool model_runs_on(std::index_sequence<S...>) {
  return (Model::template stage_t<S>::template explain_runs_on<Ctx>() && ...);
}

// True when Trainer<Model, Loss, Backend, ScheduleKind, Precision> can be built; otherwise the
// static_asserts below name what is missing: the precision, a layer the backend cannot run in it
// (with the kernel context), the piece a Loss or ScheduleKind lacks, or a stage count that is not
// a multiple of the schedule's chunks per device.
template <class Model, class Loss, class Backend, class ScheduleKind, class Precision>
constexpr bool explain_trainer_for() {
  static_assert(precision<Precision>,
                "gpipe: the Trainer's fifth argument is its precision: gpipe::Fp32 or "
                "gpipe::MixedBf16");
  static_assert(explain_precision_for<Precision, Backend, Model>());
  using ActivationKernels = typename ActivationContext<typename Backend::Kernels,
                                                       typename Precision::activation_type>::type;
  // Each explain_* names the piece it finds missing above these messages (model/layer.hpp,
  // model/loss.hpp, schedule/kind.hpp).
  static_assert(
      model_runs_on<Model, ActivationKernels>(std::make_index_sequence<Model::num_stages>{}),
      "gpipe: a layer of the model cannot run on this backend in this precision (named "
      "above, with the kernel context: host::Kernels<gpipe::bf16> for MixedBf16)");
  static_assert(explain_loss_for<Loss, ActivationKernels>(),
                "gpipe: the Trainer's Loss is not a loss for this backend (named above)");
  static_assert(explain_schedule_kind<ScheduleKind>(),
                "gpipe: the Trainer's ScheduleKind is not a schedule kind (named above)");
  static_assert(
      !schedule_kind<ScheduleKind> || Model::num_stages % ScheduleKind::chunks_per_device == 0,
      "gpipe: the schedule puts chunks_per_device stages on each device; the number of "
      "stages must be a multiple of it");
  return true;
}

}  // namespace gpipe::detail
