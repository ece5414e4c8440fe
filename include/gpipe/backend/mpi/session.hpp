#pragma once
// gpipe::mpi::Session: MPI's initialization for the program's lifetime, shared by the MPI
// backends of host devices (backend.hpp) and of GPUs (cuda_backend.cuh).

#include <mpi.h>

#include "gpipe/backend/mpi/check.hpp"

namespace gpipe::mpi {

/// MPI_Init_thread / MPI_Finalize for a program's lifetime, unless MPI is already initialized.
class Session {
 public:
  /// Initializes MPI with MPI_THREAD_SERIALIZED from main's `argc` and `argv` (which MPI may edit),
  /// unless it is already initialized, in which case the destructor leaves it alone too. Throws
  /// `gpipe::Error` when MPI_Init_thread fails.
  Session(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    detail::check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided),
                      "MPI_Init_thread");
    owns_ = true;
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    if (owns_) MPI_Finalize();
  }

 private:
  bool owns_ = false;
};

}  // namespace gpipe::mpi
