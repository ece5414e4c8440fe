#pragma once
// transport_for<Backend>: a backend's copy policy, how transport::Transport<Backend>
// (transport/transport.hpp) copies a message between two devices of one process, and whether a
// send completes only with its receive. Backend::transport when the backend names one
// (gpipe::cuda::Backend: peer copies on copy streams, or NCCL), else transport::InProcess (a
// copy by the receiving device's kernels).

#include "gpipe/transport/in_process.hpp"

namespace gpipe::transport {

/// The transport of a Backend that names none: `InProcess`. Use `transport_for<Backend>`.
template <class Backend>
struct default_transport {
  using type = InProcess;  ///< the chosen transport
};
/// The transport of a Backend that names one as `Backend::transport` (e.g. `gpipe::cuda::Backend`).
template <class Backend>
requires requires { typename Backend::transport; }
struct default_transport<Backend> {
  using type = typename Backend::transport;  ///< the chosen transport
};

/// A Backend's copy policy (`stage_transport`): `Backend::transport` when it names one, else
/// `InProcess`.
template <class Backend>
using transport_for = typename default_transport<Backend>::type;

}  // namespace gpipe::transport
