#pragma once
// The in-process hand-over policy: how transport::Transport (transport/transport.hpp) hands a
// stage's output (or input gradient) to the neighbouring stage on another device of the same
// process. The receiving device's stream performs the copy into its own memory, after waiting for
// the sender's event, so that the bytes are counted on the device that holds them; the sender's
// buffer is released as soon as the copy is done.
//
// On the host backend the copy is a memcpy; a GPU backend does a peer copy on its copy stream or
// an NCCL send/recv pair (include/gpipe/transport/cuda.cuh).

#include <cstddef>

#include "gpipe/schedule/op.hpp"

namespace gpipe::transport {

/// The default hand-over policy, of every backend that names none (see `hand_over_for`): the
/// receiving device's stream copies the sender's buffer into its own memory after waiting for the
/// sender's event, so the bytes are counted where they live. On the host backend the copy is a
/// memcpy.
struct InProcessHandOver {
  /// The receiver reads the sender's memory whenever it gets to it: a send never blocks.
  static constexpr Sends sends = Sends::buffered;

  /// dst (n) on the receiver's device <- src (n) on the sender's device
  template <class Kernels, class T>
  static void receive(Kernels& receiver, const T* src, T* dst, std::size_t n) {
    if constexpr (requires { receiver.copy(n, src, dst); })
      receiver.copy(n, src, dst);
    else  // bf16 activations: the context for them copies
      receiver.bf16_context().copy(n, src, dst);
  }
};

}  // namespace gpipe::transport
