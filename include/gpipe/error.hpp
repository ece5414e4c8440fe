#pragma once
// gpipe::Error and its refinements: every failure the library reports to a user.

#include <cstddef>
#include <stdexcept>
#include <string>

namespace gpipe {

/// Base of every error the library throws. Messages say what was expected and what was found.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An allocation would exceed a device's configured capacity.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Throws Error(message) when `condition` is false; for checks of user input.
inline void require(bool condition, const std::string& message) {
  if (!condition) throw Error("gpipe: " + message);
}

}  // namespace detail
}  // namespace gpipe
