#pragma once
// The host backend's factory for the conformance suites (tests/support/conformance_*.hpp), as
// tests/support/cuda_factory.cuh is the CUDA backend's.

#include <cstddef>

#include "gpipe/backend/host/backend.hpp"

namespace gpipe::test {

struct HostFactory {
  using backend_type = host::Backend;
  static host::Backend make(std::size_t devices) { return host::Backend(devices); }
  // Each device capped at `capacity` bytes.
  static host::Backend make_capped(std::size_t devices, std::size_t capacity) {
    return host::Backend(devices, {.device_capacity = capacity});
  }

  // Float against double, relative to the largest reference entry of each tensor: a few float
  // ulps per accumulated term (observed below 1e-6 for every configuration). Parameters move by
  // lr-sized steps; relative to the parameter scale.
  static constexpr double gradient_tolerance = 2e-6;
  static constexpr double loss_tolerance = 1e-6;
  static constexpr double accumulate_tolerance = 1e-6;
  static constexpr double parameter_tolerance = 1e-5;
  static constexpr bool report_errors = false;
};

}  // namespace gpipe::test
