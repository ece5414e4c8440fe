#pragma once
// FaultyIdentity<N>: a user-defined layer (y = x) that throws from the op named by injected_fault
// on the micro-batch of faulty_rows rows, or holds its device there for stall_ms (a device that
// stops sending without failing), for the tests of failures inside a stream on every backend
// (tests/support/conformance_errors.hpp) and of deadlines (tests/support/mpi_deadlines.hpp).
// FaultyModel puts it in the middle stage of three.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <thread>

#include "gpipe/model.hpp"

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

}  // namespace gpipe::test
