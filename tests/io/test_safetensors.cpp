// Safetensors reading and writing, and the strict JSON reader under it: round trips, the exact
// bytes the writer produces, dtype conversions on hand-built files, and one clear gpipe::Error for
// every kind of corrupt or invalid input.

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/io/json.hpp"
#include "gpipe/io/safetensors.hpp"
#include "support/errors.hpp"
#include "support/temp_path.hpp"

namespace {

using gpipe::test::contains;

namespace fs = std::filesystem;
using gpipe::io::load_safetensors;
using gpipe::io::load_safetensors_metadata;
using gpipe::io::save_safetensors;
using gpipe::io::TensorView;

using gpipe::test::TempPath;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string u64_le(std::uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return out;
}

// A file with this exact header (unpadded unless the caller pads) followed by `data`.
std::string safetensors_bytes(std::string_view header, std::string_view data) {
  return u64_le(header.size()) + std::string(header) + std::string(data);
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The message of the gpipe::Error that loading `bytes` as a file throws ("" if none is thrown).
std::string load_error(std::string_view bytes) {
  TempPath file("gpipe_test_safetensors");
  write_bytes(file.path(), bytes);
  try {
    load_safetensors(file.path());
  } catch (const gpipe::Error& error) {
    const std::string message = error.what();
    CHECK(message.find(file.path().string()) != std::string::npos);  // names the file
    return message;
  }
  return "";
}

// Same, for a file with header text `header` (unpadded) and `data_bytes` zero bytes of data.
std::string header_error(std::string_view header, std::size_t data_bytes = 0) {
  return load_error(safetensors_bytes(header, std::string(data_bytes, '\0')));
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("test_safetensors_round_trip keeps names, shapes and every value's bits") {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> scalar = {3.5f};
    const std::vector<float> vector = {1.0f,
                                       -0.0f,
                                       inf,
                                       -inf,
                                       std::numeric_limits<float>::denorm_min(),
                                       std::numeric_limits<float>::max()};
    std::vector<float> matrix(12);
    for (std::size_t i = 0; i < matrix.size(); ++i)
      matrix[i] = 0.25f * static_cast<float>(i) - 1.0f;
    const std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
    // Given out of name order: the writer sorts.
    const std::vector<TensorView> tensors = {
        {"layer.2.weight", {3, 4}, matrix},
        {"1.bias", {6}, vector},
        {"0.scale", {}, scalar},
        {"empty", {0}, {}},
        {"empty_2d", {2, 0}, {}},
        {"nan", {1, 1, 1}, nan},
        {"\xc3\xa9t\xc3\xa9 \"quoted\"\n", {1}, scalar},
    };
    TempPath file("gpipe_test_safetensors");
    save_safetensors(file.path(), tensors);
    const auto loaded = load_safetensors(file.path());
    REQUIRE(loaded.size() == tensors.size());
    for (const TensorView& expected : tensors) {
      CAPTURE(expected.name);
      const auto found = loaded.find(expected.name);
      REQUIRE(found != loaded.end());
      CHECK(found->second.shape == expected.shape);
      REQUIRE(found->second.data.size() == expected.data.size());
      for (std::size_t i = 0; i < expected.data.size(); ++i) {
        CHECK(same_bits(found->second.data[i], expected.data[i]));
      }
    }
    CHECK(load_safetensors_metadata(file.path()).empty());
  }

  TEST_CASE("test_safetensors_save writes a sorted, space-padded header and data in that order") {
    const std::vector<float> a = {1.0f};
    const std::vector<float> b = {2.0f, 3.0f};
    const std::vector<TensorView> tensors = {{"b", {2}, b}, {"a", {}, a}};
    TempPath file("gpipe_test_safetensors");
    save_safetensors(file.path(), tensors);
    const std::string bytes = read_bytes(file.path());
    const std::string header = R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
    const std::size_t padded = (header.size() + 7) / 8 * 8;
    const std::string expected = u64_le(padded) + header +
                                 std::string(padded - header.size(), ' ') +
                                 raw_bytes(std::vector<float>{1.0f, 2.0f, 3.0f});
    CHECK(bytes == expected);
    CHECK((bytes.size() - 12) % 8 == 0);
  }

  TEST_CASE("test_safetensors_metadata round trips, escapes included") {
    const std::vector<float> x = {1.0f, 2.0f};
    const std::vector<TensorView> tensors = {{"x", {2}, x}};
    const std::map<std::string, std::string> metadata = {
        {"format", "pt"},
        {"note", "quote \" backslash \\ newline \n tab \t control \x01 unicode \xe2\x82\xac"},
        {"", "empty key"},
    };
    TempPath file("gpipe_test_safetensors");
    save_safetensors(file.path(), tensors, metadata);
    CHECK(load_safetensors_metadata(file.path()) == metadata);
    CHECK(load_safetensors(file.path()).at("x").data == x);
  }

  TEST_CASE("test_safetensors_save of no tensors is a valid empty file") {
    TempPath file("gpipe_test_safetensors");
    save_safetensors(file.path(), {}, {{"k", "v"}});
    CHECK(load_safetensors(file.path()).empty());
    CHECK(load_safetensors_metadata(file.path()).at("k") == "v");
  }

  TEST_CASE("test_safetensors_save rejects invalid tensors before touching the file") {
    const std::vector<float> five(5, 1.0f);
    const std::vector<float> one = {1.0f};
    TempPath file("gpipe_test_safetensors");
    write_bytes(file.path(), "precious");
    const auto save_error = [&](const std::vector<TensorView>& tensors,
                                const std::map<std::string, std::string>& metadata = {}) {
      try {
        save_safetensors(file.path(), tensors, metadata);
      } catch (const gpipe::Error& error) {
        CHECK(contains(error.what(), file.path().string()));
        return std::string(error.what());
      }
      return std::string();
    };
    CHECK(contains(save_error({{"w", {2, 3}, five}}), "has 5 values but shape [2, 3] needs 6"));
    CHECK(contains(save_error({{"w", {1}, one}, {"v", {1}, one}, {"w", {1}, one}}),
                   "duplicate tensor name \"w\""));
    CHECK(contains(save_error({{"", {1}, one}}), "empty name"));
    CHECK(contains(save_error({{"__metadata__", {1}, one}}), "reserved"));
    CHECK(contains(save_error({{"bad\xff", {1}, one}}), "not valid UTF-8"));
    CHECK(contains(save_error({{"w", {1}, one}}, {{"k", "\xc0\x80"}}), "not valid UTF-8"));
    const std::size_t huge = std::size_t{1} << 40;
    CHECK(contains(save_error({{"w", {huge, huge}, one}}), "overflows"));
    CHECK(read_bytes(file.path()) == "precious");
  }

  TEST_CASE("test_safetensors_save reports I/O failures") {
    TempPath directory("gpipe_test_safetensors");
    const fs::path inside = directory.path() / "missing_dir" / "x.safetensors";
    const std::vector<float> one = {1.0f};
    const std::vector<TensorView> tensors = {{"w", {1}, one}};
    CHECK_THROWS_WITH_AS(save_safetensors(inside, tensors),
                         doctest::Contains("cannot open for writing"), gpipe::Error);
    // A device that accepts the open and fails every write: a full disk.
    if (fs::is_character_file("/dev/full")) {
      CHECK_THROWS_WITH_AS(save_safetensors("/dev/full", tensors),
                           doctest::Contains("write failed"), gpipe::Error);
      CHECK(fs::is_character_file("/dev/full"));
    }
  }

  TEST_CASE("test_safetensors_load converts F64, F16 and BF16 to float") {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<double> f64 = {1.5,
                                     -0.1,
                                     1e300,
                                     -1e300,
                                     1e-300,
                                     0x1.fffffefffffffp127,
                                     0x1.ffffffp127,
                                     std::numeric_limits<double>::quiet_NaN()};
    const std::vector<float> f64_expected = {1.5f, -0.1f,
                                             inf,  -inf,
                                             0.0f, std::numeric_limits<float>::max(),
                                             inf,  std::numeric_limits<float>::quiet_NaN()};
    // 1, -2, 65504 (max), 2^-24 (smallest subnormal), 2^-14 (smallest normal), inf, -inf, -0.
    const std::vector<std::uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400,
                                            0x7C00, 0xFC00, 0x8000, 0x7E00, 0x3555};
    const std::vector<float> f16_expected = {
        1.0f,       -2.0f,    65504.0f,
        0x1p-24f,   0x1p-14f, inf,
        -inf,       -0.0f,    std::numeric_limits<float>::quiet_NaN(),
        0x1.554p-2f};
    const std::vector<std::uint16_t> bf16 = {0x3F80, 0xC040, 0x7F80, 0x0001, 0x4049};
    const std::vector<float> bf16_expected = {1.0f, -3.0f, inf, 0x1p-133f, 3.140625f};

    const std::string data = raw_bytes(f64) + raw_bytes(f16) + raw_bytes(bf16);
    const std::size_t f64_end = f64.size() * 8;
    const std::size_t f16_end = f64_end + f16.size() * 2;
    const std::size_t bf16_end = f16_end + bf16.size() * 2;
    // Header order differs from data order on purpose.
    const std::string header =
        R"({"h":{"dtype":"F16","shape":[2,5],"data_offsets":[)" + std::to_string(f64_end) + "," +
        std::to_string(f16_end) + R"(]},"b":{"dtype":"BF16","shape":[5],"data_offsets":[)" +
        std::to_string(f16_end) + "," + std::to_string(bf16_end) +
        R"(]},"d":{"dtype":"F64","shape":[8],"data_offsets":[0,)" + std::to_string(f64_end) + "]}}";
    TempPath file("gpipe_test_safetensors");
    write_bytes(file.path(), safetensors_bytes(header, data));
    const auto loaded = load_safetensors(file.path());
    const auto check_values = [](const std::vector<float>& actual,
                                 const std::vector<float>& expected) {
      REQUIRE(actual.size() == expected.size());
      for (std::size_t i = 0; i < expected.size(); ++i) {
        CAPTURE(i);
        if (std::isnan(expected[i])) {
          CHECK(std::isnan(actual[i]));
        } else {
          CHECK(same_bits(actual[i], expected[i]));
        }
      }
    };
    check_values(loaded.at("d").data, f64_expected);
    check_values(loaded.at("h").data, f16_expected);
    check_values(loaded.at("b").data, bf16_expected);
    CHECK(loaded.at("h").shape == std::vector<std::size_t>{2, 5});
  }

  TEST_CASE("test_safetensors_load rejects unreadable and truncated files") {
    TempPath missing("gpipe_test_safetensors");
    CHECK_THROWS_WITH_AS(load_safetensors(missing.path()), doctest::Contains("no such file"),
                         gpipe::Error);
    TempPath directory("gpipe_test_safetensors");
    fs::create_directory(directory.path());
    CHECK_THROWS_WITH_AS(load_safetensors(directory.path()),
                         doctest::Contains("not a regular file"), gpipe::Error);

    CHECK(contains(load_error(""), "too short for the 8-byte header length"));
    CHECK(contains(load_error("\x10\0\0"), "too short"));
    CHECK(contains(load_error(u64_le(1000) + "{}"), "header length 1000 exceeds the 2 bytes"));
    CHECK(contains(load_error(u64_le(200'000'000) + "{}"), "exceeds the limit of 100000000"));
    CHECK(contains(load_error(u64_le(~std::uint64_t{0}) + "{}"), "exceeds the limit"));
    // A well-formed file cut short inside its data.
    const std::vector<float> values = {1.0f, 2.0f, 3.0f};
    const std::vector<TensorView> tensors = {{"w", {3}, values}};
    TempPath whole("gpipe_test_safetensors");
    save_safetensors(whole.path(), tensors);
    const std::string bytes = read_bytes(whole.path());
    CHECK(contains(load_error(bytes.substr(0, bytes.size() - 1)), "run past the end"));
    CHECK(contains(load_error(bytes + "junk"), "belong to no tensor"));
  }

  TEST_CASE("test_safetensors_load rejects headers that are not valid JSON") {
    CHECK(
        contains(header_error(""), "invalid JSON at byte 8: expected a value, found end of input"));
    CHECK(contains(header_error("[]"), "header must be a JSON object, found array"));
    CHECK(contains(header_error("\xef\xbb\xbf{}"), "expected a value, found byte 0xef"));
    CHECK(contains(header_error("{"), "invalid JSON at byte 9: expected a string key"));
    CHECK(contains(header_error("{}x"),
                   "invalid JSON at byte 10: unexpected 'x' after the document"));
    CHECK(contains(header_error(R"({"a":})"), "expected a value, found '}'"));
    CHECK(contains(header_error(R"({"a" 1})"), "expected ':'"));
    CHECK(contains(header_error(R"({"a":1,})"), "expected a string key"));
    CHECK(contains(header_error(R"({"a":[1 2]})"), "expected ',' or ']'"));
    CHECK(contains(header_error(R"({"a\q":1})"), "invalid escape"));
    CHECK(contains(header_error(R"({"\ud800":1})"), "not followed by a low surrogate"));
    CHECK(contains(header_error(R"({"\udc00":1})"), "unpaired low surrogate"));
    CHECK(contains(header_error("{\"a\xff\":1}"), "invalid UTF-8"));
    CHECK(contains(header_error("{\"a\n\":1}"), "unescaped control character"));
    CHECK(contains(header_error(R"({"a)"), "unterminated string"));
    CHECK(contains(header_error(R"({"a":1.5})"), "only integers"));
    CHECK(contains(header_error(R"({"a":01})"), "leading zeros"));
    CHECK(contains(header_error(R"({"a":99999999999999999999})"), "does not fit in 64 bits"));
    CHECK(contains(header_error(R"({"a":tru})"), "expected a value"));
    CHECK(contains(header_error("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}"),
                   "nesting deeper than 64"));
    CHECK(contains(header_error(R"({"a":1,"a":2})"), "duplicate key \"a\""));
  }

  TEST_CASE("test_safetensors_load rejects invalid tensor entries") {
    // Header text, data bytes, expected message fragment.
    struct Case {
      std::string header;
      std::size_t data_bytes;
      std::string message;
    };
    const std::vector<Case> cases = {
        {R"({"w":[]})", 0, "tensor \"w\": expected an object"},
        {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, "missing key \"dtype\""},
        {R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4, "missing key \"shape\""},
        {R"({"w":{"dtype":"F32","shape":[1]}})", 4, "missing key \"data_offsets\""},
        {R"({"w":{"dtype":1,"shape":[1],"data_offsets":[0,4]}})", 4, "dtype must be a string"},
        {R"({"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4,
         "unsupported dtype \"I32\""},
        {R"({"w":{"dtype":"F32","shape":{},"data_offsets":[0,4]}})", 4, "shape must be an array"},
        {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
         "shape[0] must be a non-negative"},
        {R"({"w":{"dtype":"F32","shape":[1,"2"],"data_offsets":[0,4]}})", 4, "shape[1] must be"},
        {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4,
         "product overflows"},
        {R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]}})", 4,
         "product overflows"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "two non-negative integers"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4, "two non-negative"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, "two non-negative"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-0,4]}})", 4, "two non-negative"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":"0,4"}})", 4, "two non-negative"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, "[4, 0] begin after end"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", 4,
         "[0, 8] run past the end of the 4-byte data section"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", 4,
         "run past the end"},
        {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4,
         "[0, 4] span 4 bytes but shape [2] of F32 needs 8"},
        {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
         R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
         8, "duplicate key \"w\""},
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
         8, "tensor \"b\" data_offsets [4, 8] overlap tensor \"a\" data_offsets [0, 8]"},
        {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
         12, "bytes [4, 8) belong to no tensor"},
        {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8,
         "the last 4 of the 8 bytes of the data section belong to no tensor"},
        {R"({"__metadata__":{"k":1}})", 0, "__metadata__ value for key \"k\" must be a string"},
        {R"({"__metadata__":[]})", 0, "__metadata__ must be an object"},
    };
    for (const Case& c : cases) {
      CAPTURE(c.header);
      const std::string message = header_error(c.header, c.data_bytes);
      CAPTURE(message);
      CHECK(contains(message, c.message));
    }
  }

  TEST_CASE("test_safetensors_load accepts what the reference implementation accepts") {
    // Unknown keys in an entry are ignored, whitespace may surround any token, "__metadata__"
    // may be null, empty tensors may sit anywhere in the tiling and may share an offset.
    const std::string header =
        R"( {"__metadata__":null,"e1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}, "x" : )"
        R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":[null,true,false,{"k":"v"}]},)"
        R"("e2":{"dtype":"BF16","shape":[3,0],"data_offsets":[4,4]}} )";
    const std::vector<float> one = {42.0f};
    TempPath file("gpipe_test_safetensors");
    write_bytes(file.path(), safetensors_bytes(header, raw_bytes(one)));
    const auto loaded = load_safetensors(file.path());
    REQUIRE(loaded.size() == 3);
    CHECK(loaded.at("x").data == one);
    CHECK(loaded.at("e1").data.empty());
    CHECK(loaded.at("e2").shape == std::vector<std::size_t>{3, 0});
    CHECK(load_safetensors_metadata(file.path()).empty());
  }

  TEST_CASE("test_safetensors_json reads nested values and decodes escapes") {
    using gpipe::detail::JsonArray;
    using gpipe::detail::JsonInteger;
    using gpipe::detail::JsonObject;
    const auto value = gpipe::detail::parse_json(
        R"( {"s":"a\"\\\/\b\f\n\r\t\u00e9\u20ac\ud83d\ude00","n":[-12,0,18446744073709551615],)"
        R"("o":{},"t":true,"z":null} )");
    REQUIRE(value.is<JsonObject>());
    CHECK(value.find("s")->as<std::string>() ==
          "a\"\\/\b\f\n\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    const JsonArray& numbers = value.find("n")->as<JsonArray>();
    REQUIRE(numbers.size() == 3);
    CHECK(numbers[0].as<JsonInteger>().negative);
    CHECK(numbers[0].as<JsonInteger>().magnitude == 12);
    CHECK(numbers[2].as<JsonInteger>().magnitude == 18446744073709551615u);
    CHECK(value.find("o")->as<JsonObject>().empty());
    CHECK(value.find("t")->as<bool>());
    CHECK(value.find("z")->is<std::nullptr_t>());
    CHECK(value.find("missing") == nullptr);
    CHECK(value.find("s")->offset == 6);
    CHECK_THROWS_WITH_AS(gpipe::detail::parse_json("[1,]", "test input"),
                         "gpipe: test input: invalid JSON at byte 3: expected a value, found ']'",
                         gpipe::Error);
    CHECK_THROWS_WITH_AS(gpipe::detail::parse_json(""), doctest::Contains("end of input"),
                         gpipe::Error);
    CHECK_THROWS_WITH_AS(gpipe::detail::parse_json("[[[1]]]", "x", 0, 2),
                         doctest::Contains("nesting deeper than 2"), gpipe::Error);
  }

  TEST_CASE("test_safetensors_json utf8 validation follows the Unicode table") {
    using gpipe::detail::is_valid_utf8;
    CHECK(is_valid_utf8(""));
    CHECK(is_valid_utf8("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"));
    CHECK_FALSE(is_valid_utf8("\xc0\x80"));          // overlong NUL
    CHECK_FALSE(is_valid_utf8("\xe0\x80\x80"));      // overlong
    CHECK_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
    CHECK_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
    CHECK_FALSE(is_valid_utf8("\xe2\x82"));          // truncated
    CHECK_FALSE(is_valid_utf8("\x80"));              // lone continuation
  }

  TEST_CASE("test_safetensors_load of randomly corrupted files throws only gpipe::Error") {
    // Byte flips, truncations and insertions on a valid file: each result must load or throw
    // gpipe::Error; a crash, bad_alloc or any other exception fails the test.
    const std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
    const std::vector<TensorView> tensors = {{"a", {2, 3}, values}, {"b", {}, {values.data(), 1}}};
    TempPath file("gpipe_test_safetensors");
    save_safetensors(file.path(), tensors, {{"k", "v"}});
    const std::string original = read_bytes(file.path());
    std::mt19937 random(12345);
    const auto below = [&](std::size_t n) {
      return std::uniform_int_distribution<std::size_t>(0, n - 1)(random);
    };
    int loaded = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::string bytes = original;
      switch (trial % 3) {
        case 0:
          for (int flips = 0; flips < 1 + trial % 4; ++flips) {
            bytes[below(bytes.size())] = static_cast<char>(below(256));
          }
          break;
        case 1:
          bytes.resize(below(bytes.size()));
          break;
        case 2:
          bytes.insert(below(bytes.size()), 1, static_cast<char>(below(256)));
          break;
      }
      CAPTURE(trial);
      write_bytes(file.path(), bytes);
      try {
        load_safetensors(file.path());
        ++loaded;
      } catch (const gpipe::Error&) {
      }
    }
    CHECK(loaded > 0);  // flips inside the data section still give valid files
  }
}
