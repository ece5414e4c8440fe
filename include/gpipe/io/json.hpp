#pragma once
// A small, strict JSON reader for file headers (safetensors): RFC 8259 except that numbers must be
// integers whose magnitude fits in 64 bits (offsets are u64, and no header we read has fractions).
// Strings must be valid UTF-8 with well-formed escapes (surrogates paired), object keys must be
// unique, and nesting is bounded so that hostile input cannot exhaust the stack. Every rejection
// is a gpipe::Error naming the byte offset; a valid document never makes the reader crash.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "gpipe/error.hpp"

namespace gpipe::detail {

struct JsonValue;
struct JsonMember;
using JsonArray = std::vector<JsonValue>;
using JsonObject = std::vector<JsonMember>;  // in document order; keys are unique

// value = (negative ? -1 : 1) * magnitude; "-0" reads as negative zero, which callers treat as 0.
struct JsonInteger {
  bool negative = false;
  std::uint64_t magnitude = 0;
};

struct JsonValue {
  std::variant<std::nullptr_t, bool, JsonInteger, std::string, JsonArray, JsonObject> data;
  std::size_t offset = 0;  // byte offset of the value's first character, for error messages

  template <class T>
  bool is() const {
    return std::holds_alternative<T>(data);
  }
  template <class T>
  const T& as() const {
    return std::get<T>(data);
  }
  // The member named `key`, or nullptr when there is none or this is not an object.
  const JsonValue* find(std::string_view key) const;
};

struct JsonMember {
  std::string key;
  std::size_t key_offset = 0;
  JsonValue value;
};

inline const JsonValue* JsonValue::find(std::string_view key) const {
  if (!is<JsonObject>()) return nullptr;
  for (const JsonMember& member : as<JsonObject>()) {
    if (member.key == key) return &member.value;
  }
  return nullptr;
}

// "null", "boolean", "integer", "string", "array" or "object", for messages.
inline std::string_view json_type_name(const JsonValue& value) {
  constexpr std::string_view names[] = {"null", "boolean", "integer", "string", "array", "object"};
  return names[value.data.index()];
}

// Length of the well-formed UTF-8 sequence (Unicode table 3-7: no overlongs, no surrogates, at
// most U+10FFFF) starting at s[i], or 0 when the bytes there are not one.
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  // 0x100 stands for "past the end" and fails every continuation-byte range below.
  const auto byte = [&](std::size_t k) -> unsigned {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0x100u;
  };
  const unsigned lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned second_low = 0x80;
  unsigned second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;   // overlong
    if (lead == 0xED) second_high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;   // overlong
    if (lead == 0xF4) second_high = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (byte(1) < second_low || byte(1) > second_high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  return length;
}

inline bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t length = utf8_sequence_length(s, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

// `s` as a JSON string literal. Only '"', '\\' and control characters are escaped, so valid UTF-8
// in gives valid UTF-8 out.
inline std::string json_quote(std::string_view s) {
  constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (byte < 0x20) {
          out += "\\u00";
          out += hex[byte >> 4];
          out += hex[byte & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// json_quote of at most the first `max_bytes` bytes of `s` (cut on a UTF-8 boundary), so that a
// hostile name cannot make an error message megabytes long.
inline std::string quoted_excerpt(std::string_view s, std::size_t max_bytes = 200) {
  if (s.size() <= max_bytes) return json_quote(s);
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return json_quote(s.substr(0, cut)) + "...";
}

// Appends code point `code` (at most U+10FFFF, not a surrogate) as UTF-8.
inline void append_utf8(std::string& out, std::uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

// The character that the escape backslash-`c` stands for, or '\0' when `c` is not one of
// " \ / b f n r t (\u escapes are parsed apart).
constexpr char json_unescaped(char c) {
  switch (c) {
    case '"':
    case '\\':
    case '/':
      return c;
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return '\0';
  }
}

// The value of hex digit `c`, or -1.
constexpr int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A member whose key an earlier member of `object` has (of the smallest such key), or nullptr.
// Sorting pointers keeps this O(n log n) for headers with many thousands of tensors.
inline const JsonMember* first_duplicate_key(const JsonObject& object) {
  std::vector<const JsonMember*> sorted;
  sorted.reserve(object.size());
  for (const JsonMember& member : object) sorted.push_back(&member);
  std::sort(sorted.begin(), sorted.end(), [](const JsonMember* a, const JsonMember* b) {
    return a->key != b->key ? a->key < b->key : a->key_offset < b->key_offset;
  });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->key == sorted[i - 1]->key) return sorted[i];
  }
  return nullptr;
}

class JsonParser {
 public:
  // `source` names the text in messages ("gpipe: <source>: invalid JSON at byte N: ...");
  // `base_offset` is added to reported offsets, for text embedded in a larger file.
  JsonParser(std::string_view text, std::string_view source, std::size_t base_offset,
             std::size_t max_depth)
      : text_(text), source_(source), base_offset_(base_offset), max_depth_(max_depth) {}

  // The single value that makes up the whole text (surrounding whitespace allowed).
  JsonValue parse_document() {
    skip_whitespace();
    JsonValue value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail(pos_, "unexpected " + describe(pos_) + " after the document");
    return value;
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& reason) const {
    throw Error("gpipe: " + source_ + ": invalid JSON at byte " +
                std::to_string(base_offset_ + at) + ": " + reason);
  }

  // The byte at `at` for a message: 'x', byte 0xNN, or end of input.
  std::string describe(std::size_t at) const {
    if (at >= text_.size()) return "end of input";
    const auto byte = static_cast<unsigned char>(text_[at]);
    if (byte >= 0x20 && byte < 0x7F) return std::string("'") + text_[at] + "'";
    constexpr char hex[] = "0123456789abcdef";
    return std::string("byte 0x") + hex[byte >> 4] + hex[byte & 0xF];
  }

  void skip_whitespace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool at_end() const { return pos_ >= text_.size(); }

  JsonValue parse_value(std::size_t depth) {
    if (at_end()) fail(pos_, "expected a value, found end of input");
    const std::size_t start = pos_;
    JsonValue value;
    value.offset = start;
    switch (text_[pos_]) {
      case '{':
        value.data = parse_object(depth + 1);
        break;
      case '[':
        value.data = parse_array(depth + 1);
        break;
      case '"':
        value.data = parse_string();
        break;
      case 't':
        expect_literal("true");
        value.data = true;
        break;
      case 'f':
        expect_literal("false");
        value.data = false;
        break;
      case 'n':
        expect_literal("null");
        value.data = nullptr;
        break;
      default:
        if (text_[pos_] == '-' || is_digit(text_[pos_])) {
          value.data = parse_integer();
        } else {
          fail(pos_, "expected a value, found " + describe(pos_));
        }
    }
    return value;
  }

  void check_depth(std::size_t depth) const {
    if (depth > max_depth_) {
      fail(pos_, "nesting deeper than " + std::to_string(max_depth_) + " levels");
    }
  }

  // open (element (, element)*)? close, with whitespace between tokens; pos_ at open. `what`
  // ("object", "array") names the container in messages.
  template <class Element>
  void parse_items(char close, std::string_view what, Element element) {
    ++pos_;  // open
    skip_whitespace();
    if (!at_end() && text_[pos_] == close) {
      ++pos_;
      return;
    }
    while (true) {
      skip_whitespace();
      element();
      skip_whitespace();
      if (!at_end() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (!at_end() && text_[pos_] == close) {
        ++pos_;
        return;
      }
      fail(pos_, "expected ',' or '" + std::string(1, close) + "' in " + std::string(what) +
                     ", found " + describe(pos_));
    }
  }

  JsonObject parse_object(std::size_t depth) {
    check_depth(depth);
    JsonObject object;
    parse_items('}', "object", [&] {
      if (at_end() || text_[pos_] != '"') {
        fail(pos_, "expected a string key in object, found " + describe(pos_));
      }
      JsonMember member;
      member.key_offset = pos_;
      member.key = parse_string();
      skip_whitespace();
      if (at_end() || text_[pos_] != ':') {
        fail(pos_, "expected ':' after object key, found " + describe(pos_));
      }
      ++pos_;
      skip_whitespace();
      member.value = parse_value(depth);
      object.push_back(std::move(member));
    });
    if (const JsonMember* duplicate = first_duplicate_key(object)) {
      fail(duplicate->key_offset, "duplicate key " + quoted_excerpt(duplicate->key));
    }
    return object;
  }

  JsonArray parse_array(std::size_t depth) {
    check_depth(depth);
    JsonArray array;
    parse_items(']', "array", [&] { array.push_back(parse_value(depth)); });
    return array;
  }

  void expect_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) {
      fail(pos_, "expected a value, found " + describe(pos_));
    }
    pos_ += word.size();
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  // -?(0|[1-9][0-9]*); fractions and exponents are rejected rather than rounded.
  JsonInteger parse_integer() {
    const std::size_t start = pos_;
    JsonInteger integer;
    if (text_[pos_] == '-') {
      integer.negative = true;
      ++pos_;
    }
    if (at_end() || !is_digit(text_[pos_])) {
      fail(pos_, "expected a digit, found " + describe(pos_));
    }
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && is_digit(text_[pos_ + 1])) {
      fail(pos_, "leading zeros are not allowed in numbers");
    }
    while (!at_end() && is_digit(text_[pos_])) {
      const auto digit = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (integer.magnitude > (UINT64_MAX - digit) / 10) {
        fail(start, "integer does not fit in 64 bits");
      }
      integer.magnitude = integer.magnitude * 10 + digit;
      ++pos_;
    }
    if (!at_end() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      fail(start, "only integers are supported, found a number with a fraction or exponent");
    }
    return integer;
  }

  std::uint32_t parse_hex4() {
    std::uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      if (at_end()) fail(pos_, "expected 4 hex digits after \\u, found end of input");
      const int digit = hex_digit_value(text_[pos_]);
      if (digit < 0) fail(pos_, "expected 4 hex digits after \\u, found " + describe(pos_));
      code = code * 16 + static_cast<std::uint32_t>(digit);
      ++pos_;
    }
    return code;
  }

  // A \uXXXX escape (pos_ at the 'u'), joining a surrogate pair into one code point.
  std::uint32_t parse_unicode_escape(std::size_t escape_start) {
    ++pos_;  // 'u'
    const std::uint32_t code = parse_hex4();
    if (code >= 0xDC00 && code <= 0xDFFF)
      fail(escape_start, "unpaired low surrogate in \\u escape");
    if (code < 0xD800 || code > 0xDBFF) return code;
    if (text_.substr(pos_, 2) != "\\u") {
      fail(escape_start, "high surrogate in \\u escape is not followed by a low surrogate");
    }
    pos_ += 2;
    const std::uint32_t low = parse_hex4();
    if (low < 0xDC00 || low > 0xDFFF) {
      fail(escape_start, "high surrogate in \\u escape is not followed by a low surrogate");
    }
    return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
  }

  std::string parse_string() {
    const std::size_t start = pos_;
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (at_end()) fail(start, "unterminated string");
      const char c = text_[pos_];
      const auto byte = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (byte < 0x20) fail(pos_, "unescaped control character " + describe(pos_) + " in string");
      if (c == '\\') {
        const std::size_t escape_start = pos_;
        ++pos_;
        if (at_end()) fail(start, "unterminated string");
        if (text_[pos_] == 'u') {
          append_utf8(out, parse_unicode_escape(escape_start));
          continue;
        }
        const char unescaped = json_unescaped(text_[pos_]);
        if (unescaped == '\0') {
          fail(escape_start, "invalid escape character " + describe(pos_) + " after '\\'");
        }
        out += unescaped;
        ++pos_;
        continue;
      }
      const std::size_t length = utf8_sequence_length(text_, pos_);
      if (length == 0) fail(pos_, "invalid UTF-8 in string");
      out.append(text_.substr(pos_, length));
      pos_ += length;
    }
  }

  std::string_view text_;
  std::string source_;
  std::size_t base_offset_;
  std::size_t max_depth_;
  std::size_t pos_ = 0;
};

// Parses `text` as one JSON document; see JsonParser for `source` and `base_offset`.
inline JsonValue parse_json(std::string_view text, std::string_view source = "JSON text",
                            std::size_t base_offset = 0, std::size_t max_depth = 64) {
  return JsonParser(text, source, base_offset, max_depth).parse_document();
}

}  // namespace gpipe::detail
