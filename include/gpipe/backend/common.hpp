#pragma once
// Vocabulary shared by every backend: memory statistics and the label a piece of stream work
// carries so that a failure inside it can say where it happened.

#include <cstddef>
#include <string>
#include <string_view>

namespace gpipe {

// Bytes on one device: now, the most since the last reset_peak(), and the cap (0 = none).
struct MemoryStats {
  std::size_t current = 0;
  std::size_t peak = 0;
  std::size_t capacity = 0;
};

// Where a piece of stream work belongs: an op name ("forward", "optimizer step", ...) and, where
// it has them, a stage and micro-batch.
struct WorkLabel {
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::string_view what;
  std::size_t stage = none;
  std::size_t micro_batch = none;
};

// "stage 2 (device 1), micro-batch 5, forward"
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

}  // namespace gpipe
