#pragma once
// --warmup_steps=N of the step benchmarks (bench_gpt_step, bench_llama_step): untimed steps
// before the timed ones, taken out of argv before Google Benchmark parses it.

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpipe::bench {

// Takes --warmup_steps=N out of argv into `steps` (left as it is without the flag). Returns 0, or
// 1 after a message naming `program` where N is not a whole number >= 0.
inline int take_warmup_steps(int* argc, char** argv, const char* program, long& steps) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--warmup_steps=", 15) != 0) {
      argv[out++] = argv[i];
      continue;
    }
    char* end = nullptr;
    steps = std::strtol(argv[i] + 15, &end, 10);
    if (end == argv[i] + 15 || *end != '\0' || steps < 0) {
      std::fprintf(stderr, "%s: --warmup_steps needs a whole number >= 0\n", program);
      return 1;
    }
  }
  *argc = out;
  return 0;
}

}  // namespace gpipe::bench
