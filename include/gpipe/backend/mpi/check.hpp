#pragma once
// MPI's failures and limits as gpipe::Error: an MPI call's return code, and a count that must fit
// MPI's int.

#include <mpi.h>

#include <cstddef>
#include <limits>
#include <string>

#include "gpipe/error.hpp"

namespace gpipe::detail {

/// Throws `gpipe::Error` naming `call` and MPI's text for `code` unless `code` is MPI_SUCCESS.
inline void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("gpipe: ") + call + " failed: " + std::string(text, length));
}

/// `n` as an MPI count; throws `gpipe::Error` when it exceeds an int.
inline int mpi_count(std::size_t n) {
  detail::require(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                  "a message of " + std::to_string(n) + " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

}  // namespace gpipe::detail
