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
  parameters,       ///< the stages' weights and biases
  gradients,        ///< the parameters' gradients, accumulated over a step's micro-batches
  optimizer_state,  ///< what the optimizer keeps between steps (e.g. Adam's moments)
  activations,      ///< a stage's input and its stash, live from forward to backward_weight
  workspace,        ///< temporaries of one op, and outputs until the next stage has them
  other,            ///< anything else; the default kind of `allocate`
};
/// Number of MemoryKind values: the length of MemoryStats' per-kind arrays, which are indexed
/// by `static_cast<std::size_t>(kind)`.
inline constexpr std::size_t num_memory_kinds = 6;

/// The enumerator's name, e.g. `"optimizer_state"`; `"unknown"` for a value outside the enum.
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
  std::size_t current = 0;  ///< bytes allocated now
  std::size_t peak = 0;     ///< most bytes allocated at once since the last reset_peak()
  /// The cap in bytes: an allocation that would take `current` past it throws OutOfMemory (a
  /// gpipe::Error) and allocates nothing. 0 = no cap.
  std::size_t capacity = 0;
  /// `current` per MemoryKind, indexed by `static_cast<std::size_t>(kind)`; sums to `current`.
  std::array<std::size_t, num_memory_kinds> current_by_kind{};
  /// Each kind's own peak since the last reset_peak(), indexed like `current_by_kind`.
  std::array<std::size_t, num_memory_kinds> peak_by_kind{};

  /// Bytes of `kind` allocated now.
  std::size_t current_of(MemoryKind kind) const {
    return current_by_kind[static_cast<std::size_t>(kind)];
  }
  /// Most bytes of `kind` allocated at once since the last reset_peak().
  std::size_t peak_of(MemoryKind kind) const {
    return peak_by_kind[static_cast<std::size_t>(kind)];
  }
};

/// Where a piece of stream work belongs: an op name ("forward", "optimizer step", ...) and, where
/// it has them, a stage and micro-batch.
struct WorkLabel {
  /// The `stage` or `micro_batch` of work that has none (an optimizer step, a transfer of
  /// parameters, ...).
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  /// The op's name; a string literal in practice, since trace events keep the view.
  std::string_view what;
  std::size_t stage = none;        ///< pipeline stage the work belongs to, or `none`
  std::size_t micro_batch = none;  ///< micro-batch the work belongs to, or `none`
  bool internal = false;           ///< stream bookkeeping (event record and wait): not traced
  bool compute = false;  ///< a forward, backward_input or backward_weight: counts as busy time
  /// In flight beside the device's stream work rather than on it (a gradient sum over the
  /// replicas, from its start to its completion): never busy time; exporters draw it apart.
  bool background = false;
};

/// Compute time of one device since the last take: the sum of its compute work's durations and
/// the span from the first compute start to the last compute end (microseconds since the
/// backend's epoch; both 0 when no compute ran).
struct ComputeTiming {
  double busy_us = 0;         ///< sum of the compute work's durations, microseconds
  double first_start_us = 0;  ///< start of the first compute work
  double last_end_us = 0;     ///< end of the last compute work
  std::size_t ops = 0;        ///< pieces of compute work that ran; 0 when none did
};

/// One piece of stream work as it ran: microseconds since the backend's epoch.
struct TraceEvent {
  std::size_t device = 0;  ///< the device whose stream ran the work
  WorkLabel label;         ///< what the work was; never `internal` (bookkeeping is not traced)
  double start_us = 0;     ///< when the work started
  double end_us = 0;       ///< when the work ended
};

/// Where work labelled `label` ran on `device`, for error messages: "stage 2 (device 1),
/// micro-batch 5, forward", or "device 1, optimizer step" for work without stage and
/// micro-batch.
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

// The fixed order of a sum of squares (Trainer::clip_grad_norm), the same on every backend so
// that the same values give the same bits whatever splits them: chunks of squares_chunk
// elements; within a chunk squares_lanes lanes, lane j adding x[j]^2, x[j + lanes]^2, ... in
// double (a float's square is exact in double); the lanes then added as a tree (lane j +=
// lane j + lanes/2, then lanes/4, ..., 1); the chunk sums added in chunk order. Host:
// host::chunk_sum_of_squares; CUDA: cuda::sum_of_squares.
inline constexpr std::size_t squares_chunk = 2048;
inline constexpr std::size_t squares_lanes = 32;  // a power of two

}  // namespace detail
}  // namespace gpipe
