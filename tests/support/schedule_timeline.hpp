#pragma once
// A schedule's simulated timeline as text, one line per device, one character per unit of time:
// F, B, W for chunk 0's compute ops, f, b, w for chunk 1's, digits for later chunks' forwards,
// '.' for idle. For pictures in tests and failure messages; costs must be whole numbers.

#include <cstddef>
#include <string>
#include <vector>

#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"

namespace gpipe::test {

inline char timeline_char(const Op& op) {
  const char upper = op.kind == OpKind::forward          ? 'F'
                     : op.kind == OpKind::backward_input ? 'B'
                                                         : 'W';
  if (op.chunk == 0) return upper;
  if (op.chunk == 1) return static_cast<char>(upper - 'A' + 'a');
  return static_cast<char>('0' + op.chunk % 10);
}

inline std::vector<std::string> render_timeline(const Schedule& schedule,
                                                const OpCosts& costs = {}) {
  const SimulationResult r = simulate(schedule, costs);
  std::vector<std::string> lines(schedule.num_devices,
                                 std::string(static_cast<std::size_t>(r.makespan), '.'));
  for (std::size_t d = 0; d < schedule.num_devices; ++d) {
    for (std::size_t p = 0; p < schedule.ops[d].size(); ++p) {
      const Op& op = schedule.ops[d][p];
      if (!is_compute(op.kind)) continue;
      for (auto t = static_cast<std::size_t>(r.start[d][p]);
           t < static_cast<std::size_t>(r.finish[d][p]); ++t) {
        lines[d][t] = timeline_char(op);
      }
    }
  }
  return lines;
}

inline std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

}  // namespace gpipe::test
