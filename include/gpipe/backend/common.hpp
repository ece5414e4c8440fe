#pragma once
// Vocabulary shared by every backend: memory statistics by purpose, the label a piece of stream
// work carries so that a failure inside it can say where it happened, and the trace record of a
// piece of work.

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "gpipe/error.hpp"

namespace gpipe {

/// What an allocation is for. Activations are what a step keeps from one op to a later one (a
/// stage's input and its stash); workspace is what lives within an op or until the next stage has
/// received it.
enum class MemoryKind : std::uint8_t {
  parameters,
  gradients,
  optimizer_state,
  activations,
  workspace,
  other,
};
inline constexpr std::size_t num_memory_kinds = 6;

constexpr std::string_view to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::parameters:
      return "parameters";
    case MemoryKind::gradients:
      return "gradients";
    case MemoryKind::optimizer_state:
      return "optimizer_state";
    case MemoryKind::activations:
      return "activations";
    case MemoryKind::workspace:
      return "workspace";
    case MemoryKind::other:
      return "other";
  }
  return "unknown";
}

/// Bytes on one device: now, the most since the last reset_peak(), and the cap (0 = none); the
/// same per purpose (each purpose's peak is its own maximum, so they need not add up to peak).
struct MemoryStats {
  std::size_t current = 0;
  std::size_t peak = 0;
  std::size_t capacity = 0;
  std::array<std::size_t, num_memory_kinds> current_by_kind{};
  std::array<std::size_t, num_memory_kinds> peak_by_kind{};

  std::size_t current_of(MemoryKind kind) const {
    return current_by_kind[static_cast<std::size_t>(kind)];
  }
  std::size_t peak_of(MemoryKind kind) const {
    return peak_by_kind[static_cast<std::size_t>(kind)];
  }
};

/// Where a piece of stream work belongs: an op name ("forward", "optimizer step", ...) and, where
/// it has them, a stage and micro-batch.
struct WorkLabel {
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::string_view what;
  std::size_t stage = none;
  std::size_t micro_batch = none;
  bool internal = false;  ///< stream bookkeeping (event record and wait): not traced
  bool compute = false;   ///< a forward, backward_input or backward_weight: counts as busy time
};

/// Compute time of one device since the last take: the sum of its compute work's durations and
/// the span from the first compute start to the last compute end (microseconds since the
/// backend's epoch; both 0 when no compute ran).
struct ComputeTiming {
  double busy_us = 0;
  double first_start_us = 0;
  double last_end_us = 0;
  std::size_t ops = 0;
};

/// One piece of stream work as it ran: microseconds since the backend's epoch.
struct TraceEvent {
  std::size_t device = 0;
  WorkLabel label;
  double start_us = 0;
  double end_us = 0;
};

/// "stage 2 (device 1), micro-batch 5, forward"
inline std::string describe(const WorkLabel& label, std::size_t device) {
  std::string out;
  if (label.stage != WorkLabel::none)
    out += "stage " + std::to_string(label.stage) + " (device " + std::to_string(device) + "), ";
  else
    out += "device " + std::to_string(device) + ", ";
  if (label.micro_batch != WorkLabel::none)
    out += "micro-batch " + std::to_string(label.micro_batch) + ", ";
  out += label.what;
  return out;
}

namespace detail {

// Rethrows a failure from stream work on the caller's thread with where it happened in front of
// its message ("gpipe: stage 1 (device 1), micro-batch 2, forward: ..."). OutOfMemory stays
// OutOfMemory; every other exception becomes a gpipe::Error.
[[noreturn]] inline void rethrow_from(std::exception_ptr error, const std::string& where) {
  auto strip = [](std::string message) {
    constexpr std::string_view prefix = "gpipe: ";
    if (message.starts_with(prefix)) message.erase(0, prefix.size());
    return message;
  };
  const std::string head = "gpipe: " + where + ": ";
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(head + strip(e.what()));
  } catch (const Error& e) {
    throw Error(head + strip(e.what()));
  } catch (const std::exception& e) {
    throw Error(head + e.what());
  } catch (...) {
    throw Error(head + "unknown exception");
  }
}

}  // namespace detail
}  // namespace gpipe
