// The schedules the schedule fuzz targets start from, and the mutations they apply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "gpipe/gpipe.hpp"

namespace gpipe::fuzz {

/// A broken rule of a fuzz target: a finding (libFuzzer reports the trap with its input).
inline void check(bool rule) {
  if (!rule) __builtin_trap();
}

/// Built-in kind `which % 8` for K devices and M micro-batches: 0-3 one stage per device (GPipe,
/// 1F1B, ZB-H1, ZB-H2), 4-7 two (Interleaved<2>, LoopedBFS<2>, ZB-V, DualPipeV). Throws
/// gpipe::Error where the kind needs more devices or micro-batches.
inline Schedule built_in_schedule(unsigned which, std::size_t k, std::size_t m) {
  switch (which % 8) {
    case 0:
      return GPipe::make(k, m);
    case 1:
      return OneFOneB::make(k, m);
    case 2:
      return ZeroBubbleH1::make(k, m);
    case 3:
      return ZeroBubbleH2::make(k, m);
    case 4:
      return Interleaved<2>::make(k, m);
    case 5:
      return LoopedBFS<2>::make(k, m);
    case 6:
      return ZeroBubbleV::make(k, m);
    default:
      return DualPipeV::make(k, m);
  }
}

/// Mutates `s` by 4 bytes at a time (what, device, position, value): an op swapped with another
/// of its device or with its successor, dropped, moved to another device or given another
/// micro-batch. `wild` adds ops repeated, micro-batches and chunks out of range, other kinds (one
/// past the last) and the placement flipped, which no runnable schedule has.
inline void mutate_schedule(Schedule& s, const std::uint8_t* data, std::size_t size, bool wild) {
  for (std::size_t i = 0; i + 4 <= size; i += 4) {
    const std::uint8_t value = data[i + 3];
    auto& ops = s.ops[data[i + 1] % s.num_devices];
    if (ops.empty()) continue;
    const std::size_t at = data[i + 2] % ops.size();
    const auto position = [&](std::size_t p) {
      return ops.begin() + static_cast<std::ptrdiff_t>(p);
    };
    switch (data[i] % (wild ? 9 : 5)) {
      case 0:
        std::swap(ops[at], ops[value % ops.size()]);
        break;
      case 1:
        std::swap(ops[at], ops[(at + 1) % ops.size()]);
        break;
      case 2:
        ops.erase(position(at));
        break;
      case 3: {
        const Op op = ops[at];
        ops.erase(position(at));
        auto& other = s.ops[value % s.num_devices];
        other.insert(other.begin() + static_cast<std::ptrdiff_t>(value % (other.size() + 1)), op);
        break;
      }
      case 4:
        ops[at].micro_batch =
            static_cast<std::uint32_t>(value % (s.num_micro_batches + (wild ? 1 : 0)));
        break;
      case 5: {
        const Op op = ops[at];
        ops.insert(position(value % ops.size()), op);
        break;
      }
      case 6:
        ops[at].chunk = static_cast<std::uint32_t>(value % (s.num_chunks + 1));
        break;
      case 7:
        ops[at].kind = static_cast<OpKind>(value % (num_op_kinds + 1));
        break;
      default:
        s.placement =
            s.placement == Placement::round_robin ? Placement::v_shape : Placement::round_robin;
        break;
    }
  }
}

}  // namespace gpipe::fuzz
