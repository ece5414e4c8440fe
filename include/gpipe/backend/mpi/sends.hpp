#pragma once
// mpi::Backend's messages on the wire: the MPI type of their elements, and the sends in flight,
// each keeping its buffer until MPI is done with it, so that a send never blocks its device.

#include <mpi.h>

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/backend/mpi/check.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::detail {

/// The MPI type of a message's elements, float or bf16 (which travels as its 16 bits).
template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                "gpipe: mpi::Backend's messages are float or bf16");
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else
    return MPI_UINT16_T;
}

/// A rank's sends in flight (MPI_Isend), which own their buffers. Not thread-safe: the backend
/// holds its lock.
class MpiSends {
 public:
  MpiSends() = default;
  MpiSends(const MpiSends&) = delete;
  MpiSends& operator=(const MpiSends&) = delete;

  /// Sends src's elements to rank `peer` of `comm` with `tag`, and takes src over until the send
  /// completes.
  template <class T>
  void start(host::Buffer<T>& src, int peer, int tag, MPI_Comm comm) {
    Pending pending;
    const T* data = src.data();
    const int count = mpi_count(src.size());
    if constexpr (std::is_same_v<T, float>)
      pending.buffer = std::move(src);
    else
      pending.buffer_bf16 = std::move(src);
    check_mpi(MPI_Isend(data, count, mpi_type<T>(), peer, tag, comm, &pending.request),
              "MPI_Isend");
    pending_.push_back(std::move(pending));
  }
  /// Frees the buffers of the sends that have completed.
  void release_completed() {
    for (std::size_t i = 0; i < pending_.size();) {
      int done = 0;
      check_mpi(MPI_Test(&pending_[i].request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) {
        pending_[i] = std::move(pending_.back());
        pending_.pop_back();
      } else {
        ++i;
      }
    }
  }
  /// Whether no send is in flight.
  bool empty() const { return pending_.empty(); }
  /// Lets the sends in flight go, after a failure (they may never be received); their buffers are
  /// kept while this lives, as MPI may still read them.
  void abandon() {
    for (Pending& p : pending_) {
      MPI_Request_free(&p.request);
      abandoned_.push_back(std::move(p));
    }
    pending_.clear();
  }

 private:
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    host::Buffer<float> buffer;      ///< the message's data: float
    host::Buffer<bf16> buffer_bf16;  ///< or bf16 (gpipe::MixedBf16)
  };
  std::vector<Pending> pending_;
  std::vector<Pending> abandoned_;  ///< sends let go after a failure
};

}  // namespace gpipe::detail
