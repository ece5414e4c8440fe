#pragma once
// hand_over_for<Backend>: a backend's hand-over policy, how transport::Transport<Backend>
// (transport/transport.hpp) copies a message between two devices of one process, and whether a
// send completes only with its receive: `Backend::hand_over` when the backend names one
// (gpipe::cuda::Backend: peer copies on copy streams, or NCCL), else InProcessHandOver (a copy by
// the receiving device's kernels).

#include "gpipe/transport/in_process.hpp"

namespace gpipe::transport {

/// The hand-over policy of a Backend that names none: `InProcessHandOver`. Use
/// `hand_over_for<Backend>`.
template <class Backend>
struct default_hand_over {
  using type = InProcessHandOver;  ///< the chosen policy
};
/// The hand-over policy of a Backend that names one as `Backend::hand_over` (e.g.
/// `gpipe::cuda::Backend`).
template <class Backend>
requires requires { typename Backend::hand_over; }
struct default_hand_over<Backend> {
  using type = typename Backend::hand_over;  ///< the chosen policy
};

/// A Backend's hand-over policy (`hand_over_policy`): `Backend::hand_over` when it names one,
/// else `InProcessHandOver`.
template <class Backend>
using hand_over_for = typename default_hand_over<Backend>::type;

}  // namespace gpipe::transport
