#pragma once
// gpipe::Error and its refinements: every failure the library reports to a user.

#include <concepts>
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
// The same, with the message built by `message()` only when `condition` is false: for checks on
// paths that run per op, where building the string every time would cost more than the op's
// bookkeeping.
template <std::invocable Message>
void require(bool condition, Message&& message) {
  if (!condition) throw Error("gpipe: " + std::string(message()));
}

// Always false, but only once instantiated: a static_assert in a branch of `if constexpr` that
// names the piece a type lacks (the branch's condition says which). The explain_* helpers of the
// concepts (model/layer.hpp, model/loss.hpp, optim/optimizer.hpp, schedule/kind.hpp) use it, so
// that a compile error says what to add.
template <class...>
inline constexpr bool lacks = false;

}  // namespace detail
}  // namespace gpipe
