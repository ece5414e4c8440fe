#pragma once
// What the MPI benchmark programs (bench/mpi_*.cpp) do alike before Google Benchmark sees argv:
// take their own flags out of it (every rank must agree on them: a count of iterations, not a
// time), and leave printing and --benchmark_out to rank 0.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace gpipe::bench {

// Takes every `--<name>=N` out of argv: N of the last one, `fallback` when there is none, and 0
// when that is not a positive whole number.
inline long take_count(int* argc, char** argv, std::string_view name, long fallback) {
  const std::string prefix = "--" + std::string(name) + "=";
  long value = fallback;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (!std::string_view(argv[i]).starts_with(prefix)) {
      argv[out++] = argv[i];
      continue;
    }
    const char* digits = argv[i] + prefix.size();
    char* end = nullptr;
    value = std::strtol(digits, &end, 10);
    if (end == digits || *end != '\0' || value < 0) value = 0;
  }
  *argc = out;
  return value;
}

// On ranks other than 0: drops --benchmark_out... from argv (rank 0 writes the file) and sends
// the console to /dev/null.
inline void quiet(int* argc, char** argv) {
  int out = 1;
  for (int i = 1; i < *argc; ++i)
    if (!std::string_view(argv[i]).starts_with("--benchmark_out")) argv[out++] = argv[i];
  *argc = out;
  if (std::freopen("/dev/null", "w", stdout) == nullptr) std::fclose(stdout);
}

}  // namespace gpipe::bench
