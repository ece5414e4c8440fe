#pragma once
// Helpers for tests that check error messages.

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "gpipe/error.hpp"

namespace gpipe::test {

inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The message of the gpipe::Error (or refinement E) that f() throws; "" and a failed check when
// it throws nothing.
template <class E = Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL_CHECK("expected an exception");
  return {};
}

// f() throws a gpipe::Error whose message contains `part`.
template <class F>
void check_error(F&& f, std::string_view part) {
  const std::string message = error_of(f);
  CAPTURE(message);
  CHECK(contains(message, part));
}

}  // namespace gpipe::test
