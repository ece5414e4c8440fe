#pragma once
// Trace records as an SVG timeline in the manner of the GPipe paper's Figure 2: one row per
// device (device 0 at the top), time to the right, a box per compute op from its start to its end
// with the micro-batch number inside where it fits, forward / backward_input / backward_weight in
// three colours, transfers as thin grey bars along the bottom of the row, work in flight beside
// the device's stream (WorkLabel::background: a gradient sum over the replicas, an activation
// offload's copy to the host or back) as thin green bars along its top, other work (optimizer
// step, ...) in a fourth colour, and idle time left as the row's empty background. The title ends
// with the measured bubble fraction (runtime/trace_stats.hpp), e.g.
//   "GPipe, K = 4, M = 8 — bubble 27.3% (4 devices, step 33 ms)".
// Times on the axis are relative to the first drawn record.
//
// Boxes carry class="op F" (B, W), class="other", "transfer" or "in-flight" and a <title> tooltip
// ("stage 1 (device 1), micro-batch 3, forward: 12.0 – 13.0 ms"); background and legend shapes
// carry other classes, so a reader can count ops by class.

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"
#include "gpipe/runtime/trace_stats.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

namespace io {
/// How `svg_timeline` draws a trace.
struct SvgTimelineOptions {
  std::string title = "gpipe timeline";  ///< the bubble fraction is appended
  std::size_t num_devices = 0;           ///< rows (K of the bubble); 0: 1 + the largest device seen
  bool show_transfers = true;            ///< sends and recvs of nonzero duration, as thin bars
  bool show_other = true;                ///< work that is not a schedule op
  bool show_background = true;  ///< work in flight beside the stream (gradient sums, offloads)
  double width = 1200;          ///< of the whole picture, in px
  double row_height = 28;       ///< of one device's row, in px
};
}  // namespace io

namespace detail {

// '&', '<', '>', '"', '\'' as entities, for text and attribute values.
inline std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// `x` with at most `decimals` decimals and no trailing zeros: 12, 12.5, 0.25.
inline std::string svg_number(double x, int decimals = 2) {
  if (!std::isfinite(x)) x = 0;
  std::array<char, 64> buffer{};
  const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), x,
                                       std::chars_format::fixed, decimals);
  if (ec != std::errc{}) return "0";
  std::string_view text(buffer.data(), static_cast<std::size_t>(end - buffer.data()));
  if (text.find('.') != std::string_view::npos) {
    while (text.back() == '0') text.remove_suffix(1);
    if (text.back() == '.') text.remove_suffix(1);
  }
  if (text == "-0") return "0";
  return std::string(text);
}

// A time axis: a unit that keeps labels short and a "nice" tick step (1, 2 or 5 x 10^n) giving
// about `target` ticks over `span_us`.
struct TimeAxis {
  std::string_view unit = "\u00b5s";
  double unit_us = 1;  // microseconds per unit
  double step_us = 1;  // between ticks
  int decimals = 0;    // for tick labels in `unit`
};

inline TimeAxis time_axis(double span_us, double target = 10) {
  TimeAxis axis;
  if (span_us >= 2e6) {
    axis.unit = "s";
    axis.unit_us = 1e6;
  } else if (span_us >= 2e3) {
    axis.unit = "ms";
    axis.unit_us = 1e3;
  }
  const double raw = std::max(span_us, 1e-3) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  axis.step_us = step;
  axis.decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step / axis.unit_us))));
  return axis;
}

// Drawing classes of a record.
enum class TimelineKind { forward, backward_input, backward_weight, transfer, other, background };

inline TimelineKind timeline_kind(const WorkLabel& label) {
  if (label.background) return TimelineKind::background;
  const std::optional<OpKind> kind = op_kind_of(label.what);
  if (!kind) return TimelineKind::other;
  switch (*kind) {
    case OpKind::forward:
      return TimelineKind::forward;
    case OpKind::backward_input:
      return TimelineKind::backward_input;
    case OpKind::backward_weight:
      return TimelineKind::backward_weight;
    default:
      return TimelineKind::transfer;
  }
}

struct TimelineStyle {
  std::string_view css_class;  // class attribute of the box
  std::string_view fill;
  std::string_view text_fill;
  std::string_view legend;
};

// Forward cool, backward warm: B red, W amber (GPipe runs them back to back as one backward).
inline constexpr std::array<TimelineStyle, 6> timeline_styles{{
    {"op F", "#4e79a7", "#ffffff", "F  forward"},
    {"op B", "#e15759", "#ffffff", "B  backward (input grad)"},
    {"op W", "#f1a340", "#222222", "W  backward (weight grad)"},
    {"transfer", "#7f7f7f", "#ffffff", "send / recv"},
    {"other", "#b07aa1", "#ffffff", "other work"},
    {"in-flight", "#59a14f", "#ffffff", "in flight (gradient sum, offload)"},
}};

// Whether the timeline draws `e` under `options`.
inline bool timeline_draws(const TraceEvent& e, const io::SvgTimelineOptions& options) {
  switch (timeline_kind(e.label)) {
    case TimelineKind::transfer:
      return options.show_transfers && e.end_us > e.start_us;
    case TimelineKind::other:
      return options.show_other;
    case TimelineKind::background:
      return options.show_background && e.end_us > e.start_us;
    default:
      return true;
  }
}

// Where the timeline's parts go, px (title, legend, rows, axis from top to bottom), and the time
// span it draws: from the first drawn record's start to the last one's end.
struct TimelineLayout {
  static constexpr double left = 84, right = 24, title_y = 26, legend_y = 48, rows_top = 66;
  double t0 = 0, span_us = 1;
  double width = 0, row_h = 0, row_gap = 0, plot_w = 0, axis_y = 0, height = 0;
  std::array<bool, timeline_styles.size()> kind_seen{};  // which kinds are drawn
  TimeAxis axis;

  TimelineLayout(std::span<const TraceEvent> events, std::size_t num_devices,
                 const io::SvgTimelineOptions& options) {
    bool any = false;
    double t1 = 0;
    for (const TraceEvent& e : events) {
      if (!timeline_draws(e, options)) continue;
      t0 = any ? std::min(t0, e.start_us) : e.start_us;
      t1 = any ? std::max(t1, e.end_us) : e.end_us;
      any = true;
      kind_seen[static_cast<std::size_t>(timeline_kind(e.label))] = true;
    }
    span_us = t1 > t0 ? t1 - t0 : 1.0;
    width = std::max(options.width, 300.0);
    row_h = std::max(options.row_height, 8.0);
    row_gap = std::max(2.0, row_h / 5);
    plot_w = width - left - right;
    axis_y = rows_top + static_cast<double>(num_devices) * (row_h + row_gap) + 2;
    height = axis_y + 46;
    axis = time_axis(span_us);
  }
  double x_of(double t) const { return left + (t - t0) / span_us * plot_w; }
  double row_y(std::size_t device) const {
    return rows_top + static_cast<double>(device) * (row_h + row_gap);
  }
};

// The legend: the three compute kinds always, transfers, other work and work in flight when
// drawn.
inline void svg_legend(std::string& out, const TimelineLayout& layout) {
  double x = TimelineLayout::left;
  const double y = TimelineLayout::legend_y;
  for (std::size_t k = 0; k < timeline_styles.size(); ++k) {
    if (k >= 3 && !layout.kind_seen[k]) continue;
    const TimelineStyle& style = timeline_styles[k];
    out += "<rect class=\"legend\" x=\"" + svg_number(x) + "\" y=\"" + svg_number(y - 10) +
           "\" width=\"12\" height=\"12\" fill=\"" + std::string(style.fill) + "\"/>\n";
    out += "<text class=\"legend\" x=\"" + svg_number(x + 17) + "\" y=\"" + svg_number(y) +
           "\" font-size=\"12\" fill=\"#333333\">" + xml_escape(style.legend) + "</text>\n";
    x += 17 + 6.5 * static_cast<double>(style.legend.size()) + 20;
  }
}

// The rows: a light background each, so that idle time shows as gaps between boxes.
inline void svg_rows(std::string& out, const TimelineLayout& layout, std::size_t num_devices) {
  const double left = TimelineLayout::left;
  for (std::size_t d = 0; d < num_devices; ++d) {
    const double y = layout.row_y(d);
    out += "<rect class=\"row\" x=\"" + svg_number(left) + "\" y=\"" + svg_number(y) +
           "\" width=\"" + svg_number(layout.plot_w) + "\" height=\"" + svg_number(layout.row_h) +
           "\" fill=\"#f2f2f2\"/>\n";
    out += "<text class=\"device\" x=\"" + svg_number(left - 8) + "\" y=\"" +
           svg_number(y + layout.row_h / 2 + 4) +
           "\" font-size=\"12\" text-anchor=\"end\" fill=\"#333333\">device " + std::to_string(d) +
           "</text>\n";
  }
}

// A box per drawn record, with its micro-batch number inside where it fits (about 7 px per digit
// at 11 px), or its name for other work; transfers as thin bars along the bottom of the row.
inline void svg_boxes(std::string& out, const TimelineLayout& layout,
                      std::span<const TraceEvent> events, const io::SvgTimelineOptions& options) {
  const TimeAxis& axis = layout.axis;
  const double row_h = layout.row_h;
  const double font = std::min(11.0, row_h - 4);
  for (const TraceEvent& e : events) {
    if (!timeline_draws(e, options)) continue;
    const TimelineKind kind = timeline_kind(e.label);
    const TimelineStyle& style = timeline_styles[static_cast<std::size_t>(kind)];
    const double row_y = layout.row_y(e.device);
    const bool thin = kind == TimelineKind::transfer || kind == TimelineKind::background;
    const double h = thin ? std::max(2.0, row_h / 6) : row_h;
    // transfers along the row's bottom, work in flight beside the stream along its top
    const double y = kind == TimelineKind::transfer ? row_y + row_h - h : row_y;
    const double x = layout.x_of(e.start_us);
    const double w = std::max(0.0, layout.x_of(e.end_us) - x);
    out += "<rect class=\"" + std::string(style.css_class) + "\" x=\"" + svg_number(x) + "\" y=\"" +
           svg_number(y) + "\" width=\"" + svg_number(w) + "\" height=\"" + svg_number(h) +
           "\" fill=\"" + std::string(style.fill) +
           "\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>" +
           xml_escape(describe(e.label, e.device)) + ": " +
           svg_number((e.start_us - layout.t0) / axis.unit_us, axis.decimals + 2) + " \u2013 " +
           svg_number((e.end_us - layout.t0) / axis.unit_us, axis.decimals + 2) + " " +
           std::string(axis.unit) + "</title></rect>\n";
    if (thin || font < 6) continue;
    const std::string text =
        kind == TimelineKind::other
            ? std::string(e.label.what)
            : (e.label.micro_batch == WorkLabel::none ? std::string()
                                                      : std::to_string(e.label.micro_batch));
    if (text.empty() || w < 0.65 * font * static_cast<double>(text.size()) + 3) continue;
    out += "<text class=\"label\" x=\"" + svg_number(x + w / 2) + "\" y=\"" +
           svg_number(row_y + row_h / 2 + font * 0.36) + "\" font-size=\"" + svg_number(font) +
           "\" text-anchor=\"middle\" fill=\"" + std::string(style.text_fill) + "\">" +
           xml_escape(text) + "</text>\n";
  }
}

// The time axis: a line, ticks at the axis's step with their labels, and the unit.
inline void svg_time_axis(std::string& out, const TimelineLayout& layout) {
  const TimeAxis& axis = layout.axis;
  const double left = TimelineLayout::left, y = layout.axis_y, plot_w = layout.plot_w;
  out += "<line class=\"axis\" x1=\"" + svg_number(left) + "\" y1=\"" + svg_number(y) + "\" x2=\"" +
         svg_number(left + plot_w) + "\" y2=\"" + svg_number(y) +
         "\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
  const auto num_ticks =
      static_cast<std::size_t>(std::floor(layout.span_us / axis.step_us + 1e-9)) + 1;
  for (std::size_t i = 0; i < num_ticks; ++i) {
    const double t = static_cast<double>(i) * axis.step_us;
    const double x = left + t / layout.span_us * plot_w;
    out += "<line class=\"tick\" x1=\"" + svg_number(x) + "\" y1=\"" + svg_number(y) + "\" x2=\"" +
           svg_number(x) + "\" y2=\"" + svg_number(y + 5) +
           "\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
    out += "<text class=\"tick\" x=\"" + svg_number(x) + "\" y=\"" + svg_number(y + 18) +
           "\" font-size=\"11\" text-anchor=\"middle\" fill=\"#333333\">" +
           svg_number(t / axis.unit_us, axis.decimals) + "</text>\n";
  }
  out += "<text class=\"axis-label\" x=\"" + svg_number(left + plot_w / 2) + "\" y=\"" +
         svg_number(y + 38) + "\" font-size=\"12\" text-anchor=\"middle\" fill=\"#333333\">" +
         "time (" + std::string(axis.unit) + ")</text>\n";
}

}  // namespace detail

namespace io {

/// The timeline of `events` as an SVG document in the manner of the GPipe paper's Figure 2: a
/// row per device (device 0 at the top), time to the right from the first drawn record, a box per
/// compute op coloured by kind (forward, backward_input, backward_weight) with its micro-batch
/// inside, transfers as thin grey bars, work in flight beside the stream (gradient sums over the
/// replicas, activation offload's copies) as thin green bars along the row's top, other work in a
/// fourth colour; the title ends with the measured bubble fraction. Boxes carry class "op F" (B,
/// W), "other", "transfer" or "in-flight" and a `<title>` tooltip, so a reader can count ops by
/// class. Throws Error when an event lies on a device >= options.num_devices (where that is given)
/// or has an invalid time.
inline std::string svg_timeline(std::span<const TraceEvent> events,
                                const SvgTimelineOptions& options = {}) {
  using detail::svg_number;

  std::size_t num_devices = options.num_devices;
  if (num_devices == 0) {
    for (const TraceEvent& e : events) num_devices = std::max(num_devices, e.device + 1);
  }
  const TraceStats stats = trace_stats(events, num_devices);
  const detail::TimelineLayout layout(events, num_devices, options);
  const double left = detail::TimelineLayout::left;

  std::string title = options.title;
  title += " \u2014 bubble " + svg_number(100 * stats.bubble_fraction, 1) + "% (" +
           std::to_string(num_devices) + (num_devices == 1 ? " device" : " devices");
  if (stats.makespan_us > 0) {
    title += ", step " +
             svg_number(stats.makespan_us / layout.axis.unit_us, layout.axis.decimals + 1) + " " +
             std::string(layout.axis.unit);
  }
  title += ")";

  const std::string width = svg_number(layout.width), height = svg_number(layout.height);
  std::string out;
  out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + width + "\" height=\"" + height +
         "\" viewBox=\"0 0 " + width + " " + height +
         "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
  out += "<rect class=\"background\" x=\"0\" y=\"0\" width=\"" + width + "\" height=\"" + height +
         "\" fill=\"#ffffff\"/>\n";
  out += "<text class=\"title\" x=\"" + svg_number(left) + "\" y=\"" +
         svg_number(detail::TimelineLayout::title_y) +
         "\" font-size=\"16\" font-weight=\"bold\" fill=\"#222222\">" + detail::xml_escape(title) +
         "</text>\n";
  detail::svg_legend(out, layout);
  detail::svg_rows(out, layout, num_devices);
  detail::svg_boxes(out, layout, events, options);
  detail::svg_time_axis(out, layout);
  out += "</svg>\n";
  return out;
}

/// Writes svg_timeline(events, options) to `path`. Throws Error when the file cannot be written.
inline void write_svg_timeline(const std::filesystem::path& path,
                               std::span<const TraceEvent> events,
                               const SvgTimelineOptions& options = {}) {
  const std::string text = svg_timeline(events, options);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) file.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (file) file.close();
  if (!file) throw Error("gpipe: cannot write the SVG timeline to " + path.string());
}

}  // namespace io
}  // namespace gpipe
