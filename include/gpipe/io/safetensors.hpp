#pragma once
// Safetensors files (the format of huggingface/safetensors): gpipe writes F32 and reads F32, F64,
// F16 and BF16 as float. Layout:
//   u64 little-endian N | N bytes of JSON header | data section
// where the header is {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [d0, ...],
// "data_offsets": [begin, end]}, ...}, offsets are bytes relative to the start of the data
// section, and the writer pads the header with spaces so that the data starts 8-byte aligned.
// The reader accepts what the reference implementation (safetensors 0.8) accepts: the tensors must
// tile the data section (no overlaps, no gaps, no trailing bytes) and each must span shape * dtype
// bytes. One deliberate difference: a tensor name given twice is an error here, where the
// reference silently keeps the last entry.

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <istream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/io/json.hpp"

// Tensor bytes are copied to and from memory as they are, so the host must match the format.
static_assert(std::endian::native == std::endian::little,
              "gpipe safetensors I/O assumes a little-endian host");
static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4);
static_assert(std::numeric_limits<double>::is_iec559 && sizeof(double) == 8);

namespace gpipe::io {

/// A tensor to save: row-major `data` of shape `shape` (a scalar has shape {} and one value).
struct TensorView {
  /// Its key in the file's header: non-empty, valid UTF-8, unique, not `__metadata__`.
  std::string name;
  std::vector<std::size_t> shape;  ///< extents, outermost first
  std::span<const float> data;     ///< the product of `shape` values; viewed, not copied
};

/// A loaded tensor; data.size() is the product of shape.
struct Tensor {
  std::vector<std::size_t> shape;  ///< extents, outermost first; {} for a scalar
  std::vector<float> data;         ///< row-major values, converted to float from the file's dtype
};

}  // namespace gpipe::io

namespace gpipe::detail {

// A longer header is taken as corruption rather than allocated; the reference implementation's
// limit, so every file it reads, gpipe reads.
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

enum class SafetensorsDtype { f32, f64, f16, bf16 };

struct SafetensorsDtypeInfo {
  std::string_view name;
  SafetensorsDtype dtype;
  std::size_t bytes;
};

inline constexpr SafetensorsDtypeInfo safetensors_dtypes[] = {
    {"F32", SafetensorsDtype::f32, 4},
    {"F64", SafetensorsDtype::f64, 8},
    {"F16", SafetensorsDtype::f16, 2},
    {"BF16", SafetensorsDtype::bf16, 2},
};

// One tensor of a validated header.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtypeInfo dtype;
  std::vector<std::size_t> shape;
  std::size_t elements = 0;
  std::uint64_t begin = 0;  // [begin, end): bytes relative to the data section
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in data order: tensors[i].end == tensors[i+1].begin
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  // file offset of the data section: 8 + header length
};

[[noreturn]] inline void safetensors_fail(const std::filesystem::path& path,
                                          const std::string& what) {
  throw Error("gpipe: safetensors file '" + path.string() + "': " + what);
}

// ": <reason>" for the errno that the last failed call left, or "" when it left none.
inline std::string errno_suffix(int error) {
  return error == 0 ? std::string() : ": " + std::generic_category().message(error);
}

// prod(shape) ({} -> 1), or nullopt when the product of the nonzero extents overflows size_t:
// then no order of multiplying the extents, as callers downstream may do, can overflow either.
inline std::optional<std::size_t> shape_elements(std::span<const std::size_t> shape) {
  std::size_t nonzero_product = 1;
  bool has_zero = false;
  for (const std::size_t extent : shape) {
    if (extent == 0) {
      has_zero = true;
    } else if (nonzero_product > std::numeric_limits<std::size_t>::max() / extent) {
      return std::nullopt;
    } else {
      nonzero_product *= extent;
    }
  }
  return has_zero ? 0 : nonzero_product;
}

// "[2, 3]"
inline std::string shape_string(std::span<const std::size_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// IEEE binary16 -> binary32. Exact: every half is a float; NaN payloads are kept.
inline float half_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  const std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// bfloat16 is the upper half of a binary32.
inline float bfloat16_to_float(std::uint16_t bfloat16) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bfloat16) << 16);
}

// Round to nearest even, as the hardware conversion does, but defined for every input: a double
// beyond float's range is undefined behaviour for static_cast, so those become +-inf here.
inline float double_to_float(double value) {
  // Halfway between FLT_MAX and 2^128; a tie rounds to the even neighbour, which is infinity.
  constexpr double overflow = 0x1.ffffffp127;
  if (value >= overflow) return std::numeric_limits<float>::infinity();
  if (value <= -overflow) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(value);
}

// `value` as a size_t, or nullopt when it is not a non-negative integer that fits. "-0" is
// rejected too, as the reference implementation does.
inline std::optional<std::uint64_t> json_to_size(const JsonValue& value) {
  if (!value.is<JsonInteger>()) return std::nullopt;
  const JsonInteger& integer = value.as<JsonInteger>();
  if (integer.negative) return std::nullopt;
  if (integer.magnitude > std::numeric_limits<std::size_t>::max()) return std::nullopt;
  return integer.magnitude;
}

// Each parse_safetensors_* below checks one field of a header entry; `where` ("tensor \"name\": ")
// starts its messages.

inline SafetensorsDtypeInfo parse_safetensors_dtype(const std::filesystem::path& path,
                                                    const std::string& where,
                                                    const JsonValue& dtype) {
  if (!dtype.is<std::string>()) {
    safetensors_fail(path,
                     where + "dtype must be a string, found " + std::string(json_type_name(dtype)));
  }
  const auto* known = std::find_if(std::begin(safetensors_dtypes), std::end(safetensors_dtypes),
                                   [&](const SafetensorsDtypeInfo& candidate) {
                                     return candidate.name == dtype.as<std::string>();
                                   });
  if (known == std::end(safetensors_dtypes)) {
    safetensors_fail(path, where + "unsupported dtype " + quoted_excerpt(dtype.as<std::string>()) +
                               " (gpipe reads F32, F64, F16 and BF16)");
  }
  return *known;
}

inline std::vector<std::size_t> parse_safetensors_shape(const std::filesystem::path& path,
                                                        const std::string& where,
                                                        const JsonValue& shape) {
  if (!shape.is<JsonArray>()) {
    safetensors_fail(path,
                     where + "shape must be an array, found " + std::string(json_type_name(shape)));
  }
  std::vector<std::size_t> extents;
  for (const JsonValue& extent : shape.as<JsonArray>()) {
    const std::optional<std::uint64_t> value = json_to_size(extent);
    if (!value) {
      safetensors_fail(path, where + "shape[" + std::to_string(extents.size()) +
                                 "] must be a non-negative integer that fits in size_t");
    }
    extents.push_back(static_cast<std::size_t>(*value));
  }
  return extents;
}

// [begin, end], within the data section of `data_bytes` bytes.
inline std::pair<std::uint64_t, std::uint64_t> parse_safetensors_offsets(
    const std::filesystem::path& path, const std::string& where, const JsonValue& offsets,
    std::uint64_t data_bytes) {
  const auto* pair = offsets.is<JsonArray>() ? &offsets.as<JsonArray>() : nullptr;
  const std::optional<std::uint64_t> begin =
      pair != nullptr && pair->size() == 2 ? json_to_size((*pair)[0]) : std::nullopt;
  const std::optional<std::uint64_t> end =
      pair != nullptr && pair->size() == 2 ? json_to_size((*pair)[1]) : std::nullopt;
  if (!begin || !end) {
    safetensors_fail(path, where + "data_offsets must be an array of two non-negative integers");
  }
  const std::string range =
      "data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) + "]";
  if (*begin > *end) safetensors_fail(path, where + range + " begin after end");
  if (*end > data_bytes) {
    safetensors_fail(path, where + range + " run past the end of the " +
                               std::to_string(data_bytes) + "-byte data section");
  }
  return {*begin, *end};
}

inline SafetensorsEntry parse_safetensors_entry(const std::filesystem::path& path,
                                                const JsonMember& member,
                                                std::uint64_t data_bytes) {
  const std::string where = "tensor " + quoted_excerpt(member.key) + ": ";
  const JsonValue& info = member.value;
  if (!info.is<JsonObject>()) {
    safetensors_fail(path, where + "expected an object with dtype, shape and data_offsets, found " +
                               std::string(json_type_name(info)));
  }
  const auto field = [&](std::string_view key) -> const JsonValue& {
    const JsonValue* value = info.find(key);
    if (value == nullptr) safetensors_fail(path, where + "missing key \"" + std::string(key) + '"');
    return *value;
  };

  SafetensorsEntry entry;
  entry.name = member.key;
  entry.dtype = parse_safetensors_dtype(path, where, field("dtype"));
  entry.shape = parse_safetensors_shape(path, where, field("shape"));
  const std::optional<std::size_t> elements = shape_elements(entry.shape);
  const std::size_t bytes_per_element = entry.dtype.bytes;
  if (!elements || *elements > std::numeric_limits<std::size_t>::max() / bytes_per_element) {
    safetensors_fail(path, where + "shape " + shape_string(entry.shape) +
                               " has more elements than fit in memory (product overflows)");
  }
  entry.elements = *elements;
  std::tie(entry.begin, entry.end) =
      parse_safetensors_offsets(path, where, field("data_offsets"), data_bytes);
  const std::uint64_t needed = std::uint64_t{entry.elements} * bytes_per_element;
  if (entry.end - entry.begin != needed) {
    safetensors_fail(path, where + "data_offsets [" + std::to_string(entry.begin) + ", " +
                               std::to_string(entry.end) + "] span " +
                               std::to_string(entry.end - entry.begin) + " bytes but shape " +
                               shape_string(entry.shape) + " of " + std::string(entry.dtype.name) +
                               " needs " + std::to_string(needed));
  }
  return entry;
}

inline std::map<std::string, std::string> parse_safetensors_metadata(
    const std::filesystem::path& path, const JsonValue& value) {
  if (value.is<std::nullptr_t>()) return {};  // the reference reads null as "no metadata"
  if (!value.is<JsonObject>()) {
    safetensors_fail(path, "__metadata__ must be an object of strings, found " +
                               std::string(json_type_name(value)));
  }
  std::map<std::string, std::string> metadata;
  for (const JsonMember& member : value.as<JsonObject>()) {
    if (!member.value.is<std::string>()) {
      safetensors_fail(path, "__metadata__ value for key " + quoted_excerpt(member.key) +
                                 " must be a string, found " +
                                 std::string(json_type_name(member.value)));
    }
    metadata.emplace(member.key, member.value.as<std::string>());
  }
  return metadata;
}

// Sorts `tensors` into data order and checks that they tile [0, data_bytes) exactly.
inline void check_safetensors_layout(const std::filesystem::path& path,
                                     std::vector<SafetensorsEntry>& tensors,
                                     std::uint64_t data_bytes) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  const auto range = [](const SafetensorsEntry& entry) {
    return "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
  };
  std::uint64_t covered = 0;  // the tensors so far tile [0, covered)
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsEntry& entry = tensors[i];
    if (entry.begin < covered) {
      // Sorted by begin and tiling so far, so the overlapped tensor is the last nonempty one.
      std::size_t previous = i - 1;
      while (tensors[previous].begin == tensors[previous].end) --previous;
      safetensors_fail(path, "tensor " + quoted_excerpt(entry.name) + " data_offsets " +
                                 range(entry) + " overlap tensor " +
                                 quoted_excerpt(tensors[previous].name) + " data_offsets " +
                                 range(tensors[previous]));
    }
    if (entry.begin > covered) {
      safetensors_fail(path, "data section bytes [" + std::to_string(covered) + ", " +
                                 std::to_string(entry.begin) +
                                 ") belong to no tensor (a gap before tensor " +
                                 quoted_excerpt(entry.name) + ")");
    }
    covered = entry.end;
  }
  if (covered != data_bytes) {
    safetensors_fail(path, "the last " + std::to_string(data_bytes - covered) + " of the " +
                               std::to_string(data_bytes) +
                               " bytes of the data section belong to no tensor");
  }
}

// Reads exactly `bytes` bytes or fails; the sizes were checked against the file's size, so a
// short read means the file changed or could not be read.
inline void safetensors_read(std::istream& in, const std::filesystem::path& path, void* out,
                             std::uint64_t bytes, std::string_view what) {
  if (bytes == 0) return;
  errno = 0;
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
  if (!in || static_cast<std::uint64_t>(in.gcount()) != bytes) {
    safetensors_fail(path, "unexpected end of file or read error while reading " +
                               std::string(what) + errno_suffix(errno));
  }
}

// Opens `path` for reading and returns its size in bytes.
inline std::uint64_t safetensors_open(const std::filesystem::path& path, std::ifstream& in) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) {
    safetensors_fail(path, "cannot open: no such file");
  }
  if (error) safetensors_fail(path, "cannot open: " + error.message());
  if (!std::filesystem::is_regular_file(status)) {
    safetensors_fail(path, "cannot open: not a regular file");
  }
  const std::uintmax_t bytes = std::filesystem::file_size(path, error);
  if (error) safetensors_fail(path, "cannot open: " + error.message());
  errno = 0;
  in.open(path, std::ios::binary);
  if (!in) safetensors_fail(path, "cannot open for reading" + errno_suffix(errno));
  return bytes;
}

// Reads and validates everything before the data section; leaves `in` at the data section.
inline SafetensorsHeader read_safetensors_header(std::istream& in,
                                                 const std::filesystem::path& path,
                                                 std::uint64_t file_bytes) {
  if (file_bytes < 8) {
    safetensors_fail(path, "file is " + std::to_string(file_bytes) +
                               " bytes, too short for the 8-byte header length");
  }
  std::uint64_t header_bytes = 0;
  safetensors_read(in, path, &header_bytes, 8, "the header length");
  if (header_bytes > safetensors_max_header_bytes) {
    safetensors_fail(path, "header length " + std::to_string(header_bytes) +
                               " exceeds the limit of " +
                               std::to_string(safetensors_max_header_bytes) +
                               " bytes (not a safetensors file, or corrupt)");
  }
  if (header_bytes > file_bytes - 8) {
    safetensors_fail(path, "header length " + std::to_string(header_bytes) + " exceeds the " +
                               std::to_string(file_bytes - 8) +
                               " bytes that follow it (truncated file?)");
  }
  std::string text(static_cast<std::size_t>(header_bytes), '\0');
  safetensors_read(in, path, text.data(), header_bytes, "the header");
  const JsonValue root = parse_json(text, "safetensors file '" + path.string() + "' header", 8);
  if (!root.is<JsonObject>()) {
    safetensors_fail(path,
                     "header must be a JSON object, found " + std::string(json_type_name(root)));
  }

  SafetensorsHeader header;
  header.data_start = 8 + header_bytes;
  const std::uint64_t data_bytes = file_bytes - header.data_start;
  for (const JsonMember& member : root.as<JsonObject>()) {
    if (member.key == "__metadata__") {
      header.metadata = parse_safetensors_metadata(path, member.value);
    } else {
      header.tensors.push_back(parse_safetensors_entry(path, member, data_bytes));
    }
  }
  check_safetensors_layout(path, header.tensors, data_bytes);
  return header;
}

// Reads `entry.elements` values of type Raw and converts each to float.
template <class Raw, class Convert>
void read_converted(std::istream& in, const std::filesystem::path& path,
                    const SafetensorsEntry& entry, std::vector<float>& out, Convert convert) {
  std::vector<Raw> raw(entry.elements);
  safetensors_read(in, path, raw.data(), entry.end - entry.begin,
                   "tensor " + quoted_excerpt(entry.name));
  std::transform(raw.begin(), raw.end(), out.begin(), convert);
}

// The tensors save_safetensors writes, sorted by name, after checking their names (non-empty,
// not "__metadata__", valid UTF-8, unique), shapes and sizes, and the metadata's text; otherwise
// gpipe::Error naming `path`.
inline std::vector<const io::TensorView*> checked_for_saving(
    const std::filesystem::path& path, std::span<const io::TensorView> tensors,
    const std::map<std::string, std::string>& metadata) {
  const auto fail = [&](const std::string& what) { safetensors_fail(path, what); };
  std::vector<const io::TensorView*> sorted;
  sorted.reserve(tensors.size());
  for (const io::TensorView& tensor : tensors) sorted.push_back(&tensor);
  std::sort(sorted.begin(), sorted.end(),
            [](const io::TensorView* a, const io::TensorView* b) { return a->name < b->name; });
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const io::TensorView& tensor = *sorted[i];
    if (tensor.name.empty()) fail("cannot save: a tensor has an empty name");
    if (tensor.name == "__metadata__") {
      fail("cannot save: \"__metadata__\" is reserved and cannot name a tensor");
    }
    if (!is_valid_utf8(tensor.name)) {
      fail("cannot save: tensor name " + quoted_excerpt(tensor.name) + " is not valid UTF-8");
    }
    if (i > 0 && sorted[i - 1]->name == tensor.name) {
      fail("cannot save: duplicate tensor name " + quoted_excerpt(tensor.name));
    }
    const std::optional<std::size_t> elements = shape_elements(tensor.shape);
    if (!elements || *elements > std::numeric_limits<std::size_t>::max() / sizeof(float)) {
      fail("cannot save: tensor " + quoted_excerpt(tensor.name) + " has shape " +
           shape_string(tensor.shape) + " whose product overflows");
    }
    if (tensor.data.size() != *elements) {
      fail("cannot save: tensor " + quoted_excerpt(tensor.name) + " has " +
           std::to_string(tensor.data.size()) + " values but shape " + shape_string(tensor.shape) +
           " needs " + std::to_string(*elements));
    }
  }
  for (const auto& [key, value] : metadata) {
    if (!is_valid_utf8(key) || !is_valid_utf8(value)) {
      fail("cannot save: metadata entry " + quoted_excerpt(key) + " is not valid UTF-8");
    }
  }
  return sorted;
}

// The JSON header of F32 tensors laid out in the order of `sorted`, with `metadata` (if any)
// under "__metadata__", padded with spaces to a multiple of 8 bytes.
inline std::string safetensors_header(std::span<const io::TensorView* const> sorted,
                                      const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      header += json_quote(key) + ':' + json_quote(value);
    }
    header += '}';
  }
  std::uint64_t offset = 0;
  for (const io::TensorView* tensor : sorted) {
    if (header.size() > 1) header += ',';
    header += json_quote(tensor->name) +
              ":{\"dtype\":\"F32\",\"shape\":" + shape_string(tensor->shape) +
              ",\"data_offsets\":[" + std::to_string(offset) + ',';
    offset += tensor->data.size_bytes();
    header += std::to_string(offset) + "]}";
  }
  header += '}';
  // Spaces are JSON whitespace, so the padding is invisible to readers but aligns the data.
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

}  // namespace gpipe::detail

namespace gpipe::io {

/// Writes `tensors` as F32, sorted by name in the header and laid out in that order in the data
/// section, with `metadata` (if any) under `"__metadata__"`. Every check runs before the file is
/// opened, so bad input never truncates an existing file; an I/O failure removes the partial file.
inline void save_safetensors(const std::filesystem::path& path, std::span<const TensorView> tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  const auto fail = [&](const std::string& what) { detail::safetensors_fail(path, what); };

  const std::vector<const TensorView*> sorted = detail::checked_for_saving(path, tensors, metadata);
  const std::string header = detail::safetensors_header(sorted, metadata);
  if (header.size() > detail::safetensors_max_header_bytes) {
    fail("cannot save: the header would be " + std::to_string(header.size()) +
         " bytes, over the limit of " + std::to_string(detail::safetensors_max_header_bytes));
  }

  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot open for writing" + detail::errno_suffix(errno));
  const std::uint64_t header_bytes = header.size();
  out.write(reinterpret_cast<const char*>(&header_bytes), sizeof header_bytes);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const TensorView* tensor : sorted) {
    if (tensor->data.empty()) continue;
    out.write(reinterpret_cast<const char*>(tensor->data.data()),
              static_cast<std::streamsize>(tensor->data.size_bytes()));
  }
  errno = 0;
  out.close();
  if (!out) {
    const int error = errno;
    // Only a regular file can be a partial copy of ours; never remove a device such as /dev/full.
    std::error_code ignored;
    if (std::filesystem::is_regular_file(path, ignored)) std::filesystem::remove(path, ignored);
    fail("write failed" + detail::errno_suffix(error));
  }
}

/// Every tensor of the file, F32/F64/F16/BF16 converted to float. Any other dtype, and any file
/// that is not exactly a valid safetensors file, is a gpipe::Error naming the file and the problem.
inline std::map<std::string, Tensor, std::less<>> load_safetensors(
    const std::filesystem::path& path) {
  std::ifstream in;
  const std::uint64_t file_bytes = detail::safetensors_open(path, in);
  const detail::SafetensorsHeader header = detail::read_safetensors_header(in, path, file_bytes);
  std::map<std::string, Tensor, std::less<>> tensors;
  // Data order, so the file is read front to back; the layout check made the tensors contiguous.
  for (const detail::SafetensorsEntry& entry : header.tensors) {
    Tensor tensor{entry.shape, std::vector<float>(entry.elements)};
    switch (entry.dtype.dtype) {
      case detail::SafetensorsDtype::f32:
        detail::safetensors_read(in, path, tensor.data.data(), entry.end - entry.begin,
                                 "tensor " + detail::quoted_excerpt(entry.name));
        break;
      case detail::SafetensorsDtype::f64:
        detail::read_converted<double>(in, path, entry, tensor.data, detail::double_to_float);
        break;
      case detail::SafetensorsDtype::f16:
        detail::read_converted<std::uint16_t>(in, path, entry, tensor.data, detail::half_to_float);
        break;
      case detail::SafetensorsDtype::bf16:
        detail::read_converted<std::uint16_t>(in, path, entry, tensor.data,
                                              detail::bfloat16_to_float);
        break;
    }
    tensors.emplace(entry.name, std::move(tensor));
  }
  return tensors;
}

/// The `"__metadata__"` strings of the file (empty when it has none), after validating its header.
inline std::map<std::string, std::string> load_safetensors_metadata(
    const std::filesystem::path& path) {
  std::ifstream in;
  const std::uint64_t file_bytes = detail::safetensors_open(path, in);
  return detail::read_safetensors_header(in, path, file_bytes).metadata;
}

}  // namespace gpipe::io
