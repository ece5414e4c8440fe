// Chrome trace export: the document parses back as JSON (with the library's own strict reader),
// has one complete event per record with the documented fields, names its device rows, carries
// the run's metadata and escapes whatever strings it is given.

#include <doctest/doctest.h>

#include <cstddef>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/error.hpp"
#include "gpipe/io/chrome_trace.hpp"
#include "gpipe/io/json.hpp"

namespace {

using gpipe::TraceEvent;
using gpipe::WorkLabel;
using gpipe::detail::JsonArray;
using gpipe::detail::JsonInteger;
using gpipe::detail::JsonObject;
using gpipe::detail::JsonValue;

constexpr std::string_view odd_name = "odd \"name\" \\ / \n\t\x01 caf\xc3\xa9 <&>";

// Whole-microsecond times: the reader accepts integers only.
std::vector<TraceEvent> sample_events() {
  return {
      {.device = 0, .label = {"forward", 0, 3}, .start_us = 0, .end_us = 1000},
      {.device = 1, .label = {"recv_activation", 1, 3}, .start_us = 1000, .end_us = 1010},
      {.device = 1, .label = {"forward", 1, 3}, .start_us = 1010, .end_us = 2010},
      {.device = 1, .label = {"backward_input", 1, 3}, .start_us = 2010, .end_us = 4010},
      {.device = 1, .label = {"backward_weight", 1, 3}, .start_us = 4010, .end_us = 5000},
      {.device = 0, .label = {"optimizer step"}, .start_us = 6000, .end_us = 6500},
      {.device = 2, .label = {odd_name, 2, 7}, .start_us = 7000, .end_us = 7001},
  };
}

std::int64_t integer(const JsonValue& value) {
  const auto& i = value.as<JsonInteger>();
  const auto magnitude = static_cast<std::int64_t>(i.magnitude);
  return i.negative ? -magnitude : magnitude;
}

const JsonValue& member(const JsonValue& object, std::string_view key) {
  const JsonValue* found = object.find(key);
  REQUIRE_MESSAGE(found != nullptr, "missing key ", key);
  return *found;
}

// The "X" events of a parsed document, in order.
std::vector<const JsonValue*> complete_events(const JsonValue& document) {
  std::vector<const JsonValue*> out;
  for (const JsonValue& e : member(document, "traceEvents").as<JsonArray>()) {
    if (member(e, "ph").as<std::string>() == "X") out.push_back(&e);
  }
  return out;
}

}  // namespace

TEST_CASE("a Chrome trace parses back as JSON with one complete event per record") {
  const std::vector<TraceEvent> events = sample_events();
  const JsonValue document = gpipe::detail::parse_json(gpipe::io::chrome_trace_json(events));
  REQUIRE(document.is<JsonObject>());

  const std::vector<const JsonValue*> complete = complete_events(document);
  REQUIRE(complete.size() == events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    const JsonValue& e = *complete[i];
    CAPTURE(i);
    CHECK(member(e, "cat").as<std::string>() == events[i].label.what);
    CHECK(integer(member(e, "pid")) == 0);
    CHECK(integer(member(e, "tid")) == static_cast<std::int64_t>(events[i].device));
    CHECK(integer(member(e, "ts")) == static_cast<std::int64_t>(events[i].start_us));
    CHECK(integer(member(e, "dur")) ==
          static_cast<std::int64_t>(events[i].end_us - events[i].start_us));
  }
}

TEST_CASE(
    "Chrome trace events are named like the GPipe paper's figures and carry stage and "
    "micro-batch") {
  const std::vector<TraceEvent> events = sample_events();
  const JsonValue document = gpipe::detail::parse_json(gpipe::io::chrome_trace_json(events));
  const std::vector<const JsonValue*> complete = complete_events(document);
  REQUIRE(complete.size() == events.size());

  const std::vector<std::string> names = {
      "F3", "recv_activation 3", "F3", "B3", "W3", "optimizer step", std::string(odd_name) + " 7"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    CHECK(member(*complete[i], "name").as<std::string>() == names[i]);
  }

  const JsonValue& args = member(*complete[3], "args");
  CHECK(integer(member(args, "stage")) == 1);
  CHECK(integer(member(args, "micro_batch")) == 3);
  // Work without a stage or micro-batch has neither argument.
  const JsonValue& step_args = member(*complete[5], "args");
  CHECK(step_args.as<JsonObject>().empty());
}

TEST_CASE("a Chrome trace names one thread row per device and its process after the title") {
  const std::vector<TraceEvent> events = sample_events();  // devices 0, 1, 2
  const JsonValue document =
      gpipe::detail::parse_json(gpipe::io::chrome_trace_json(events, {.title = "K = 3, M = 1"}));

  std::vector<std::string> thread_names(3);
  std::size_t sort_indices = 0;
  std::string process_name;
  for (const JsonValue& e : member(document, "traceEvents").as<JsonArray>()) {
    if (member(e, "ph").as<std::string>() != "M") continue;
    const std::string& kind = member(e, "name").as<std::string>();
    const JsonValue& args = member(e, "args");
    if (kind == "process_name") {
      process_name = member(args, "name").as<std::string>();
    } else if (kind == "thread_name") {
      const auto tid = static_cast<std::size_t>(integer(member(e, "tid")));
      REQUIRE(tid < thread_names.size());
      thread_names[tid] = member(args, "name").as<std::string>();
    } else if (kind == "thread_sort_index") {
      CHECK(integer(member(args, "sort_index")) == integer(member(e, "tid")));
      ++sort_indices;
    }
  }
  CHECK(process_name == "K = 3, M = 1");
  CHECK(thread_names == std::vector<std::string>{"device 0", "device 1", "device 2"});
  CHECK(sort_indices == 3);
}

TEST_CASE("work in flight beside a device's stream gets a row of its own in a Chrome trace") {
  std::vector<TraceEvent> events = sample_events();  // devices 0, 1, 2: K = 3
  events.push_back({.device = 1,
                    .label = {.what = "all-reduce gradients", .stage = 1, .background = true},
                    .start_us = 4500,
                    .end_us = 6000});
  const JsonValue document = gpipe::detail::parse_json(gpipe::io::chrome_trace_json(events));
  std::map<std::int64_t, std::string> thread_names;
  for (const JsonValue& e : member(document, "traceEvents").as<JsonArray>())
    if (member(e, "ph").as<std::string>() == "M" &&
        member(e, "name").as<std::string>() == "thread_name")
      thread_names[integer(member(e, "tid"))] = member(member(e, "args"), "name").as<std::string>();
  CHECK(thread_names ==
        std::map<std::int64_t, std::string>{
            {0, "device 0"}, {1, "device 1"}, {2, "device 2"}, {4, "device 1: in flight"}});
  const std::vector<const JsonValue*> complete = complete_events(document);
  REQUIRE(complete.size() == events.size());
  CHECK(member(*complete.back(), "name").as<std::string>() == "all-reduce gradients");
  CHECK(integer(member(*complete.back(), "tid")) == 4);  // K + 1
  CHECK(integer(member(*complete.back(), "dur")) == 1500);
  CHECK(integer(member(*complete[3], "tid")) == 1);  // device 1's own work stays on its row
}

TEST_CASE("Chrome trace metadata holds the title and every given key, escaped") {
  gpipe::io::TraceInfo info{.title = "run \"A\"\n",
                            .metadata = {{"K", "4"}, {"M", "8"}, {std::string(odd_name), "x\\y"}}};
  info.metadata["title"] = "ignored";
  const JsonValue document = gpipe::detail::parse_json(gpipe::io::chrome_trace_json({}, info));
  const JsonValue& metadata = member(document, "metadata");
  CHECK(member(metadata, "title").as<std::string>() == "run \"A\"\n");
  CHECK(member(metadata, "K").as<std::string>() == "4");
  CHECK(member(metadata, "M").as<std::string>() == "8");
  CHECK(member(metadata, odd_name).as<std::string>() == "x\\y");
  CHECK(metadata.as<JsonObject>().size() == 4);
  CHECK(complete_events(document).empty());
}

TEST_CASE("Chrome trace times keep nanoseconds and never use an exponent") {
  using gpipe::detail::json_microseconds;
  CHECK(json_microseconds(0) == "0");
  CHECK(json_microseconds(1000) == "1000");
  CHECK(json_microseconds(12.5) == "12.5");
  CHECK(json_microseconds(1.23456) == "1.235");
  CHECK(json_microseconds(0.0001) == "0");
  CHECK(json_microseconds(-0.0001) == "0");
  CHECK(json_microseconds(1e12) == "1000000000000");

  const std::vector<TraceEvent> events = {
      {.device = 0, .label = {"forward", 0, 0}, .start_us = 12.5, .end_us = 13.75}};
  const std::string json = gpipe::io::chrome_trace_json(events);
  CHECK(json.find("\"ts\": 12.5,") != std::string::npos);
  CHECK(json.find("\"dur\": 1.25,") != std::string::npos);

  const std::vector<TraceEvent> bad = {{.device = 0,
                                        .label = {"forward", 0, 0},
                                        .start_us = 0,
                                        .end_us = std::numeric_limits<double>::infinity()}};
  CHECK_THROWS_AS(gpipe::io::chrome_trace_json(bad), gpipe::Error);
}

TEST_CASE("write_chrome_trace writes the document and reports a path it cannot write") {
  const std::vector<TraceEvent> events = sample_events();
  gpipe::io::write_chrome_trace("trace.json", events, {.title = "file"});
  std::ifstream file("trace.json", std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(file), {}};
  CHECK(text == gpipe::io::chrome_trace_json(events, {.title = "file"}));

  CHECK_THROWS_WITH_AS(gpipe::io::write_chrome_trace("no-such-dir/trace.json", events),
                       doctest::Contains("no-such-dir/trace.json"), gpipe::Error);
}
