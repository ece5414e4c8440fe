// libFuzzer target: llm.c's files, io::load_llmc_tokens and io::load_llmc_gpt2. The first byte
// picks the loader; the file is that format's 1024-byte header with its magic and version, the
// next 56 bytes in place of header entries 2-15 (the sizes), and the rest of the input after it.
// Any file must load or throw gpipe::Error; a crash, a sanitizer report, another exception or
// running out of memory (a header's sizes taken on trust) is a bug. Built and run by
// scripts/fuzz.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "fuzz_file.hpp"
#include "gpipe/io/llmc.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path = gpipe::fuzz::scratch_file("llmc");
  if (size == 0) return 0;
  const bool checkpoint = (data[0] & 1) != 0;
  std::string bytes(4 * gpipe::io::llmc_header_ints, '\0');
  const std::int32_t magic = checkpoint ? gpipe::io::llmc_gpt2_magic : gpipe::io::llmc_tokens_magic;
  const std::int32_t version =
      checkpoint ? gpipe::io::llmc_gpt2_version : gpipe::io::llmc_tokens_version;
  std::memcpy(bytes.data(), &magic, 4);  // little-endian, as the loaders check
  std::memcpy(bytes.data() + 4, &version, 4);
  const std::size_t sizes = std::min<std::size_t>(size - 1, 56);
  std::memcpy(bytes.data() + 8, data + 1, sizes);
  bytes.append(reinterpret_cast<const char*>(data + 1 + sizes), size - 1 - sizes);
  gpipe::fuzz::write_file(path, bytes.data(), bytes.size());
  try {
    if (checkpoint)
      gpipe::io::load_llmc_gpt2(path);
    else
      gpipe::io::load_llmc_tokens(path);
  } catch (const gpipe::Error&) {
  }
  return 0;
}
