#pragma once
// Trace records as Chrome Trace Event Format JSON, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open:
//   {"displayTimeUnit": "ms",
//    "metadata": {"title": ..., <TraceInfo::metadata>...},
//    "traceEvents": [
//      {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": <title>}},
//      {"name": "thread_name", "ph": "M", "pid": 0, "tid": d, "args": {"name": "device d"}}, ...
//      {"name": "F3", "cat": "forward", "ph": "X", "pid": 0, "tid": d, "ts": 12.5, "dur": 1000,
//       "args": {"stage": 1, "micro_batch": 3}}, ...]}
// One complete event ("X") per record, on the row (tid) of its device; work in flight beside a
// device's stream (WorkLabel::background: a gradient sum over the replicas, an activation
// offload's copy), which may overlap
// the device's ops, on a row of its own, tid K + d ("device d: in flight", K = 1 + the largest
// device). Names follow the GPipe
// paper's figures: "F3", "B3", "W3" for compute ops on micro-batch 3, "recv_activation 3" for
// transfers, the label itself for work without a micro-batch ("optimizer step"). cat is the
// label's what, args hold stage and micro_batch where the label has them. Times are microseconds
// as recorded, written with nanosecond resolution (integers when whole).

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"
#include "gpipe/io/json.hpp"

namespace gpipe {

namespace io {
/// What a trace file says about its run besides the records.
struct TraceInfo {
  std::string title = "gpipe";  ///< the process row's name, and metadata "title"
  /// Written under "metadata" next to "title" (K, M, schedule, date, ...); a "title" key here is
  /// ignored in favour of the field above.
  std::map<std::string, std::string> metadata{};
};
}  // namespace io

namespace detail {

// A time in microseconds as a JSON number: at most 3 decimals (nanoseconds), no trailing zeros,
// no exponent. Throws Error for NaN and infinities, which JSON cannot hold.
inline std::string json_microseconds(double us) {
  if (!std::isfinite(us)) throw Error("gpipe: a trace time is not a finite number");
  const double rounded = std::round(us * 1000.0) / 1000.0;
  std::array<char, 64> buffer{};
  const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(),
                                       rounded == 0 ? 0.0 : rounded, std::chars_format::fixed, 3);
  if (ec != std::errc{}) throw Error("gpipe: a trace time is too large to write");
  std::string_view text(buffer.data(), static_cast<std::size_t>(end - buffer.data()));
  while (text.back() == '0') text.remove_suffix(1);
  if (text.back() == '.') text.remove_suffix(1);
  return std::string(text);
}

// "F3" / "B3" / "W3" for compute ops, "<what> <mb>" for other work on a micro-batch, "<what>".
inline std::string trace_event_name(const WorkLabel& label) {
  const std::string_view what = label.what;
  if (label.micro_batch == WorkLabel::none) return std::string(what);
  const std::string mb = std::to_string(label.micro_batch);
  if (what == "forward") return "F" + mb;
  if (what == "backward_input") return "B" + mb;
  if (what == "backward_weight") return "W" + mb;
  return std::string(what) + " " + mb;
}

}  // namespace detail

namespace io {

/// The trace as a Chrome Trace Event Format document, which Perfetto and chrome://tracing open:
/// one complete event ("X") per record on its device's row (tid d; work in flight beside the
/// device's stream, `WorkLabel::background`, on a row of its own, tid K + d), named as in the GPipe
/// paper's figures ("F3", "B3", "W3" for compute ops on micro-batch 3, "recv_activation 3" for a
/// transfer, the label itself for work without a micro-batch), with `cat` the label's op and
/// `args` its stage and micro-batch. Times are microseconds as recorded; `info` names the
/// process row and fills the top-level "metadata".
inline std::string chrome_trace_json(std::span<const TraceEvent> events,
                                     const TraceInfo& info = {}) {
  using detail::json_quote;
  std::string out = "{\"displayTimeUnit\": \"ms\",\n\"metadata\": {\"title\": ";
  out += json_quote(info.title);
  for (const auto& [key, value] : info.metadata) {
    if (key == "title") continue;  // already written; keys must be unique
    out += ", " + json_quote(key) + ": " + json_quote(value);
  }
  out += "},\n\"traceEvents\": [\n";

  out +=
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": ";
  out += json_quote(info.title) + "}}";
  std::size_t num_devices = 0;
  for (const TraceEvent& e : events) num_devices = std::max(num_devices, e.device + 1);
  std::vector<bool> in_flight(num_devices, false);  // devices with background work
  for (const TraceEvent& e : events)
    in_flight[e.device] = in_flight[e.device] || e.label.background;
  const auto row = [&](std::size_t tid, const std::string& name) {
    out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " +
           std::to_string(tid) + ", \"args\": {\"name\": \"" + name + "\"}}";
    out += ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": " +
           std::to_string(tid) + ", \"args\": {\"sort_index\": " + std::to_string(tid) + "}}";
  };
  for (std::size_t d = 0; d < num_devices; ++d) row(d, "device " + std::to_string(d));
  for (std::size_t d = 0; d < num_devices; ++d)
    if (in_flight[d]) row(num_devices + d, "device " + std::to_string(d) + ": in flight");

  for (const TraceEvent& e : events) {
    const WorkLabel& label = e.label;
    out += ",\n{\"name\": " + json_quote(detail::trace_event_name(label));
    out += ", \"cat\": " + json_quote(label.what);
    const std::size_t tid = label.background ? num_devices + e.device : e.device;
    out += ", \"ph\": \"X\", \"pid\": 0, \"tid\": " + std::to_string(tid);
    out += ", \"ts\": " + detail::json_microseconds(e.start_us);
    out += ", \"dur\": " + detail::json_microseconds(std::max(0.0, e.end_us - e.start_us));
    out += ", \"args\": {";
    const char* separator = "";
    if (label.stage != WorkLabel::none) {
      out += "\"stage\": " + std::to_string(label.stage);
      separator = ", ";
    }
    if (label.micro_batch != WorkLabel::none) {
      out += separator;
      out += "\"micro_batch\": " + std::to_string(label.micro_batch);
    }
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

/// Writes chrome_trace_json(events, info) to `path`. Throws Error when the file cannot be written.
inline void write_chrome_trace(const std::filesystem::path& path,
                               std::span<const TraceEvent> events, const TraceInfo& info = {}) {
  const std::string text = chrome_trace_json(events, info);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) file.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (file) file.close();
  if (!file) throw Error("gpipe: cannot write the Chrome trace to " + path.string());
}

}  // namespace io
}  // namespace gpipe
