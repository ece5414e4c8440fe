// SVG timeline and measured bubble: the picture is well-formed, has one box per compute op and
// the micro-batch numbers, its title states the bubble; measured_bubble agrees with a hand count
// and, on a simulated GPipe schedule, with (K-1)/(M+K-1).

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"
#include "gpipe/io/svg_timeline.hpp"
#include "gpipe/runtime/trace_stats.hpp"
#include "gpipe/schedule/gpipe.hpp"
#include "gpipe/schedule/simulator.hpp"

namespace {

using gpipe::TraceEvent;

std::size_t count(std::string_view text, std::string_view needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string_view::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// Every element closed in order, every '&' an entity, no '<' or '>' inside text or attributes
// (a small check of XML well-formedness for what the writer emits: no comments or CDATA).
bool well_formed(std::string_view xml, std::string& why) {
  std::vector<std::string> open;
  bool root_seen = false;
  for (std::size_t i = 0; i < xml.size(); ++i) {
    if (xml[i] == '&') {
      const std::size_t semi = xml.find(';', i);
      const std::string_view entity = xml.substr(i, semi == std::string_view::npos ? 1 : semi - i);
      if (entity != "&amp" && entity != "&lt" && entity != "&gt" && entity != "&quot" &&
          entity != "&apos") {
        why = "bare '&' at byte " + std::to_string(i);
        return false;
      }
      continue;
    }
    if (xml[i] == '>') {
      why = "stray '>' at byte " + std::to_string(i);
      return false;
    }
    if (xml[i] != '<') continue;
    const std::size_t close = xml.find('>', i);
    if (close == std::string_view::npos) {
      why = "unterminated tag";
      return false;
    }
    std::string_view tag = xml.substr(i + 1, close - i - 1);
    i = close;
    if (tag.starts_with('?')) continue;  // the XML declaration
    if (count(tag, "<") != 0 || count(tag, "\"") % 2 != 0) {
      why = "malformed tag <" + std::string(tag) + ">";
      return false;
    }
    if (tag.starts_with('/')) {
      if (open.empty() || open.back() != tag.substr(1)) {
        why = "</" + std::string(tag.substr(1)) + "> closes " +
              (open.empty() ? std::string("nothing") : "<" + open.back() + ">");
        return false;
      }
      open.pop_back();
      continue;
    }
    const std::string name(tag.substr(0, tag.find_first_of(" \n/")));
    if (open.empty()) {
      if (root_seen) {
        why = "a second root element <" + name + ">";
        return false;
      }
      root_seen = true;
    }
    if (!tag.ends_with('/')) open.push_back(name);
  }
  if (!open.empty()) {
    why = "<" + open.back() + "> is never closed";
    return false;
  }
  if (!root_seen) why = "no root element";
  return root_seen;
}

// The contents of every <text class="label"> element, in order.
std::vector<std::string> box_labels(std::string_view svg) {
  std::vector<std::string> out;
  constexpr std::string_view open = "<text class=\"label\"";
  for (std::size_t at = svg.find(open); at != std::string_view::npos; at = svg.find(open, at + 1)) {
    const std::size_t begin = svg.find('>', at) + 1;
    out.emplace_back(svg.substr(begin, svg.find("</text>", begin) - begin));
  }
  return out;
}

std::vector<TraceEvent> simulated_gpipe(std::size_t K, std::size_t M) {
  const gpipe::Schedule schedule = gpipe::make_gpipe_schedule(K, M);
  return gpipe::trace_of(schedule, gpipe::simulate(schedule), 1000.0);  // 1 ms per unit of cost
}

}  // namespace

TEST_CASE("measured_bubble counts compute ops as busy and spans the first to the last of them") {
  // Two devices; transfers and work outside the schedule are not busy and do not stretch the
  // makespan. busy = (10 + 20) + (10 + 20) = 60, makespan = 50 - 0, bubble = 1 - 60 / (2 * 50).
  const std::vector<TraceEvent> events = {
      {.device = 0, .label = {"forward", 0, 0, false, true}, .start_us = 0, .end_us = 10},
      {.device = 0, .label = {"send_activation", 0, 0}, .start_us = 10, .end_us = 12},
      {.device = 1, .label = {"recv_activation", 1, 0}, .start_us = 8, .end_us = 12},
      {.device = 1, .label = {"forward", 1, 0, false, true}, .start_us = 12, .end_us = 22},
      {.device = 1, .label = {"backward_input", 1, 0, false, true}, .start_us = 22, .end_us = 37},
      {.device = 1, .label = {"backward_weight", 1, 0, false, true}, .start_us = 37, .end_us = 42},
      {.device = 0, .label = {"recv_gradient", 0, 0}, .start_us = 42, .end_us = 44},
      {.device = 0, .label = {"backward_input", 0, 0, false, true}, .start_us = 44, .end_us = 60},
      {.device = 0, .label = {"backward_weight", 0, 0, false, true}, .start_us = 60, .end_us = 64},
      {.device = 0, .label = {"optimizer step"}, .start_us = 64, .end_us = 90},
  };
  const gpipe::TraceStats stats = gpipe::trace_stats(events, 2);
  CHECK(stats.begin_us == 0);
  CHECK(stats.end_us == 64);
  CHECK(stats.makespan_us == 64);
  CHECK(stats.busy_us == std::vector<double>{30, 30});
  CHECK(gpipe::measured_bubble(events, 2) == doctest::Approx(1.0 - 60.0 / (2 * 64.0)));
  // The same records counted on 4 devices: two of them idle throughout.
  CHECK(gpipe::measured_bubble(events, 4) == doctest::Approx(1.0 - 60.0 / (4 * 64.0)));

  CHECK(gpipe::measured_bubble({}, 3) == 0);
  CHECK_THROWS_WITH_AS(gpipe::measured_bubble(events, 1), doctest::Contains("device 1"),
                       gpipe::Error);
  const std::vector<TraceEvent> backwards = {
      {.device = 0, .label = {"forward", 0, 0, false, true}, .start_us = 5, .end_us = 4}};
  CHECK_THROWS_AS(gpipe::measured_bubble(backwards, 1), gpipe::Error);
}

TEST_CASE("op_kind_of reads the labels the executor writes") {
  for (std::size_t k = 0; k < gpipe::num_op_kinds; ++k) {
    const auto kind = static_cast<gpipe::OpKind>(k);
    CHECK(gpipe::op_kind_of(gpipe::to_string(kind)) == kind);
  }
  CHECK_FALSE(gpipe::op_kind_of("optimizer step").has_value());
  CHECK(gpipe::is_busy_work(gpipe::WorkLabel{"backward_weight", 0, 0, false, true}));
  CHECK_FALSE(gpipe::is_busy_work(gpipe::WorkLabel{"send_gradient", 0, 0}));
  static_assert(gpipe::op_kind_of("forward") == gpipe::OpKind::forward);
}

TEST_CASE("a simulated GPipe schedule measures the paper's bubble (K-1)/(M+K-1)") {
  CHECK(gpipe::measured_bubble(simulated_gpipe(4, 8), 4) == doctest::Approx(3.0 / 11.0));
  for (const std::size_t K : {1, 2, 4, 8}) {
    for (const std::size_t M : {1, 2, 4, 8, 16, 32, 64}) {
      CAPTURE(K);
      CAPTURE(M);
      const double theory = static_cast<double>(K - 1) / static_cast<double>(M + K - 1);
      CHECK(gpipe::measured_bubble(simulated_gpipe(K, M), K) == doctest::Approx(theory));
    }
  }
}

TEST_CASE("trace_of gives one record per op with simulated times in microseconds") {
  const gpipe::Schedule schedule = gpipe::make_gpipe_schedule(3, 2);
  const gpipe::SimulationResult result =
      gpipe::simulate(schedule, {.forward = 2, .backward_input = 3, .backward_weight = 1});
  const std::vector<TraceEvent> events = gpipe::trace_of(schedule, result, 10.0);
  std::size_t ops = 0;
  for (const auto& list : schedule.ops) ops += list.size();
  REQUIRE(events.size() == ops);
  // Device 0 starts with F0 at 0 and F1 at 2 units.
  CHECK(events[0].label.what == "forward");
  CHECK(events[0].label.stage == 0);
  CHECK(events[0].label.micro_batch == 0);
  CHECK(events[0].end_us == 20);
  CHECK(gpipe::trace_stats(events, 3).makespan_us == doctest::Approx(result.makespan * 10));
  CHECK(gpipe::measured_bubble(events, 3) == doctest::Approx(result.bubble_fraction));

  CHECK_THROWS_AS(gpipe::trace_of(gpipe::make_gpipe_schedule(3, 3), result), gpipe::Error);
}

TEST_CASE(
    "the SVG timeline of GPipe K = 4, M = 8 is well-formed, with a box and a number per "
    "compute op and the bubble in its title") {
  const std::vector<TraceEvent> events = simulated_gpipe(4, 8);
  const std::string svg = gpipe::io::svg_timeline(events, {.title = "GPipe, K = 4, M = 8"});
  std::string why;
  CHECK_MESSAGE(well_formed(svg, why), why);
  CHECK(svg.starts_with("<?xml"));
  CHECK(count(svg, "<svg ") == 1);

  // 4 devices x 8 micro-batches x (F, B, W).
  CHECK(count(svg, "<rect class=\"op ") == 96);
  CHECK(count(svg, "<rect class=\"op F\"") == 32);
  CHECK(count(svg, "<rect class=\"op B\"") == 32);
  CHECK(count(svg, "<rect class=\"op W\"") == 32);
  CHECK(count(svg, "<rect class=\"row\"") == 4);
  // Simulated transfers take no time: nothing to draw.
  CHECK(count(svg, "class=\"transfer\"") == 0);

  // 3/11 = 27.27...%
  const std::size_t title = svg.find("<text class=\"title\"");
  REQUIRE(title != std::string::npos);
  const std::string_view title_text =
      std::string_view(svg).substr(title, svg.find("</text>", title) - title);
  CHECK(title_text.find("GPipe, K = 4, M = 8") != std::string_view::npos);
  CHECK(title_text.find("bubble 27.3%") != std::string_view::npos);

  // Each box is 1 ms of a 33 ms step, wide enough for its number at the default width.
  const std::vector<std::string> labels = box_labels(svg);
  CHECK(labels.size() == 96);
  for (int mb = 0; mb < 8; ++mb) {
    CHECK(std::count(labels.begin(), labels.end(), std::to_string(mb)) == 12);
  }
  for (const char* device : {">device 0<", ">device 1<", ">device 2<", ">device 3<"}) {
    CHECK(count(svg, device) == 1);
  }
  CHECK(svg.find(">time (ms)</text>") != std::string::npos);
}

TEST_CASE(
    "the SVG timeline escapes text, draws timed transfers and other work, and leaves out "
    "numbers that do not fit") {
  const std::vector<TraceEvent> events = {
      {.device = 0, .label = {"forward", 0, 0, false, true}, .start_us = 0, .end_us = 500},
      {.device = 0, .label = {"send_activation", 0, 0}, .start_us = 500, .end_us = 520},
      {.device = 1, .label = {"recv_activation", 1, 0}, .start_us = 500, .end_us = 530},
      {.device = 1, .label = {"forward", 1, 0, false, true}, .start_us = 530, .end_us = 531},
      {.device = 1, .label = {"a<b & \"c\""}, .start_us = 600, .end_us = 900},
  };
  const std::string svg = gpipe::io::svg_timeline(events, {.title = "<&>", .num_devices = 3});
  std::string why;
  CHECK_MESSAGE(well_formed(svg, why), why);
  CHECK(svg.find("&lt;&amp;&gt; \u2014 bubble") != std::string::npos);
  CHECK(count(svg, "<rect class=\"row\"") == 3);  // device 2 has no work and still has a row
  CHECK(count(svg, "<rect class=\"op ") == 2);
  CHECK(count(svg, "<rect class=\"transfer\"") == 2);
  CHECK(count(svg, "<rect class=\"other\"") == 1);
  CHECK(svg.find("a&lt;b &amp; &quot;c&quot;") != std::string::npos);
  // The 1 us forward on device 1 is about 1 px wide: no number in it.
  CHECK(box_labels(svg) == std::vector<std::string>{"0", "a&lt;b &amp; &quot;c&quot;"});
  CHECK(svg.find(">time (\u00b5s)</text>") != std::string::npos);

  const std::string bare = gpipe::io::svg_timeline(
      events, {.title = "bare", .num_devices = 0, .show_transfers = false, .show_other = false});
  CHECK(well_formed(bare, why));
  CHECK(count(bare, "class=\"transfer\"") == 0);
  CHECK(count(bare, "class=\"other\"") == 0);
  CHECK(count(bare, "<rect class=\"op ") == 2);
  CHECK(count(bare, "<rect class=\"row\"") == 2);

  CHECK_THROWS_AS(gpipe::io::svg_timeline(events, {.title = "", .num_devices = 1}), gpipe::Error);
  const std::string empty = gpipe::io::svg_timeline({});
  CHECK(well_formed(empty, why));
  CHECK(empty.find("bubble 0%") != std::string::npos);
}

TEST_CASE("the SVG timeline draws work in flight beside a stream as a thin bar at its row's top") {
  // device 1's gradient sum runs from 400 to 900 us, over its own other work and device 0's
  const std::vector<TraceEvent> events = {
      {.device = 0, .label = {"forward", 0, 0, false, true}, .start_us = 0, .end_us = 1000},
      {.device = 1, .label = {"forward", 1, 0, false, true}, .start_us = 0, .end_us = 300},
      {.device = 1,
       .label = {.what = "all-reduce gradients", .stage = 1, .background = true},
       .start_us = 400,
       .end_us = 900},
  };
  const std::string svg = gpipe::io::svg_timeline(events, {.title = "sums", .width = 1200});
  std::string why;
  CHECK_MESSAGE(well_formed(svg, why), why);
  CHECK(count(svg, "<rect class=\"in-flight\"") == 1);
  CHECK(count(svg, "<rect class=\"other\"") == 0);
  CHECK(svg.find("in flight (gradient sum, offload)") != std::string::npos);  // in the legend
  CHECK(svg.find("bubble 35%") != std::string::npos);  // it is not busy time: 1 - 1300 / 2000
  // at the top of device 1's row, thin
  const std::size_t bar = svg.find("<rect class=\"in-flight\"");
  const std::size_t row = svg.find("<rect class=\"row\"", svg.find("<rect class=\"row\"") + 1);
  const auto attribute = [&](std::size_t at, std::string_view name) {
    const std::size_t from = svg.find(std::string(name) + "=\"", at) + name.size() + 2;
    return std::stod(svg.substr(from, svg.find('"', from) - from));
  };
  CHECK(attribute(bar, "y") == attribute(row, "y"));
  CHECK(attribute(bar, "height") < attribute(row, "height") / 4);
  const std::string hidden =
      gpipe::io::svg_timeline(events, {.title = "sums", .show_background = false});
  CHECK(count(hidden, "class=\"in-flight\"") == 0);
}

TEST_CASE("write_svg_timeline writes the picture and reports a path it cannot write") {
  const std::vector<TraceEvent> events = simulated_gpipe(2, 4);
  gpipe::io::write_svg_timeline("timeline.svg", events);
  std::ifstream file("timeline.svg", std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(file), {}};
  CHECK(text == gpipe::io::svg_timeline(events));
  CHECK_THROWS_WITH_AS(gpipe::io::write_svg_timeline("no-such-dir/timeline.svg", events),
                       doctest::Contains("no-such-dir/timeline.svg"), gpipe::Error);
}
