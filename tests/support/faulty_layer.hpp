#pragma once
// FaultyIdentity<N>: a user-defined layer (y = x) that throws from the op named by injected_fault
// on the micro-batch of faulty_rows rows, or holds its device there for stall_ms (a device that
// stops sending without failing), for the tests of failures inside a stream on every backend
// (tests/support/conformance_errors.hpp) and of deadlines (tests/support/mpi_deadlines.hpp).
// FaultyModel puts it in the middle stage of three. NanLinear<N> writes a NaN instead, for the
// tests of Trainer::locate_non_finite; NanModel puts it at the end of the middle stage of three.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <thread>

#include "gpipe/model.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe::test {

// Which op of FaultyIdentity throws (or, stall_forward, sleeps stall_ms), set by the tests.
enum class Fault { none, forward, backward_input, stall_forward };
inline std::atomic<Fault> injected_fault{Fault::none};
inline std::atomic<int> stall_ms{0};

// The micro-batch that FaultyIdentity fails. With the batch below (5 rows, 3 micro-batches split
// 2, 2, 1) micro-batch 2 is the only one with one row, so the layer can tell it by its size,
// whatever the schedule or remat policy.
inline constexpr std::size_t faulty_batch = 5, faulty_micro_batches = 3, faulty_rows = 1;

template <std::size_t N>
struct FaultyIdentity : ParameterFree {
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr std::size_t stash_per_row = 0;
  static constexpr std::size_t grad_stash_per_row = 0;

  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    if (injected_fault == Fault::forward && a.rows == faulty_rows)
      throw std::runtime_error("injected forward failure");
    if (injected_fault == Fault::stall_forward && a.rows == faulty_rows)
      std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms.load()));
    ctx.copy(a.rows * N, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx, const BackwardInputArgs<typename Ctx::value_type>& a) {
    if (injected_fault == Fault::backward_input && a.rows == faulty_rows)
      throw std::runtime_error("injected backward failure");
    ctx.copy(a.rows * N, a.dy, a.dx);
  }
};
static_assert(layer<FaultyIdentity<8>>);

using FaultyModel = Pipeline<Stage<Linear<4, 8>, ReLU>,
                             Stage<Linear<8, 8>, FaultyIdentity<8>, ReLU>, Stage<Linear<8, 3>>>;

// Which op of NanLinear writes a NaN (into its output, or its weight's gradient), on which call
// of that op since nan_calls was set to 0: the tests pick one micro-batch's call from the
// schedule (nan_call_of), under Remat::never, where each op runs once per micro-batch.
enum class NanAt { none, forward, backward_weight };
inline std::atomic<NanAt> nan_at{NanAt::none};
inline std::atomic<int> nan_call{0};
inline std::atomic<int> nan_calls{0};

// Linear<N, N> with NaN faults.
template <std::size_t N>
struct NanLinear : Linear<N, N> {
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    Linear<N, N>::forward(ctx, a);
    if (nan_at == NanAt::forward && nan_calls++ == nan_call)
      ctx.fill(1, std::numeric_limits<float>::quiet_NaN(), a.y);
  }
  template <class Ctx>
  static void backward_weight(Ctx& ctx, const BackwardWeightArgs<typename Ctx::value_type>& a) {
    Linear<N, N>::backward_weight(ctx, a);
    if (nan_at == NanAt::backward_weight && nan_calls++ == nan_call)
      ctx.fill(1, std::numeric_limits<float>::quiet_NaN(), a.grads);
  }
};
static_assert(layer<NanLinear<8>>);

// Parameters 0.weight, 0.bias | 2.weight, 2.bias, 3.weight, 3.bias (NanLinear) | 4.weight, 4.bias.
using NanModel =
    Pipeline<Stage<Linear<4, 8>, ReLU>, Stage<Linear<8, 8>, NanLinear<8>>, Stage<Linear<8, 3>>>;

// The call (from 0) of `kind` on `device` that runs micro-batch mb, in the schedule's order.
inline int nan_call_of(const Schedule& schedule, std::size_t device, OpKind kind, std::size_t mb) {
  int call = 0;
  for (const Op& op : schedule.ops[device]) {
    if (op.kind != kind) continue;
    if (op.micro_batch == mb) return call;
    ++call;
  }
  return -1;
}

}  // namespace gpipe::test
