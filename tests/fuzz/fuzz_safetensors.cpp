// libFuzzer target: io::load_safetensors on a file of the fuzzer's bytes. Any file must load or
// throw gpipe::Error; a crash, a sanitizer report, another exception or running out of memory is
// a bug. Built and run by scripts/fuzz.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz_file.hpp"
#include "gpipe/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path = gpipe::fuzz::scratch_file("safetensors");
  gpipe::fuzz::write_file(path, data, size);
  try {
    gpipe::io::load_safetensors(path);
  } catch (const gpipe::Error&) {
  }
  return 0;
}
