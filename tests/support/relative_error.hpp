#pragma once
// The error measure of every numerical check (gpipe/testing/relative_error.hpp), under the tests'
// namespace.

#include "gpipe/testing/relative_error.hpp"

namespace gpipe::test {

using testing::relative_error;

}  // namespace gpipe::test
