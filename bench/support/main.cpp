// The main of every gpipe benchmark program: Google Benchmark's, plus context lines that say
// what the numbers were measured with (backend, cores, host GEMM library, build).

#include <benchmark/benchmark.h>

#include <string>
#include <thread>

#ifndef GPIPE_HOST_GEMM_REFERENCE
#include "gpipe/backend/host/kernels/gemm_library.hpp"
#endif

// A program may define this to take its own flags out of argv before Google Benchmark parses
// them (weak: most programs do not).
extern "C" int gpipe_bench_preparse(int* argc, char** argv) __attribute__((weak));

int main(int argc, char** argv) {
  if (gpipe_bench_preparse != nullptr && gpipe_bench_preparse(&argc, argv) != 0) return 1;
  benchmark::AddCustomContext("gpipe_version", "0.1.0");
  benchmark::AddCustomContext("gpipe_hardware_threads",
                              std::to_string(std::thread::hardware_concurrency()));
#ifdef GPIPE_HOST_GEMM_REFERENCE
  benchmark::AddCustomContext("gpipe_host_gemm", "plain loops (GPIPE_HOST_ONEDNN=OFF)");
#else
  benchmark::AddCustomContext(
      "gpipe_host_gemm", gpipe::host::gemm_library_description() + ", 1 thread per device worker");
#endif
#ifdef NDEBUG
  benchmark::AddCustomContext("gpipe_build", "optimized");
#else
  benchmark::AddCustomContext("gpipe_build", "debug (numbers are not representative)");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
