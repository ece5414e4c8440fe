// libFuzzer target: gpipe's JSON parser (safetensors headers and checkpoint indexes go through
// it). Any input must parse or throw gpipe::Error; a crash, a sanitizer report, another exception
// or running out of memory is a bug. Built and run by scripts/fuzz.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpipe/io/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    gpipe::detail::parse_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const gpipe::Error&) {
  }
  return 0;
}
