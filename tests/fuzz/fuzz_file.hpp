// Scratch files of the fuzz targets: one per process (libFuzzer's -jobs run several), in
// /dev/shm where it exists, removed with their siblings by scripts/fuzz.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace gpipe::fuzz {

inline std::filesystem::path scratch_file(const std::string& what) {
  const std::filesystem::path dir = std::filesystem::is_directory("/dev/shm")
                                        ? "/dev/shm"
                                        : std::filesystem::temp_directory_path();
  return dir / ("gpipe_fuzz_" + what + "_" + std::to_string(getpid()));
}

inline void write_file(const std::filesystem::path& path, const void* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace gpipe::fuzz
