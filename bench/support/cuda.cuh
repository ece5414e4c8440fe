#pragma once
// What the CUDA benchmark programs (bench/*.cu) share: a main that exits cleanly without a GPU
// and adds the GPU and the measured ceilings to the output's context; the ceilings themselves
// (device-to-device copy bandwidth and a large FP32 cuBLAS GEMM, measured in the same run);
// random device data; and timing with CUDA events.
//
// Every program times device work with a pair of events around `reps` launches on one stream,
// after a warm-up, and reports per launch (Google Benchmark's manual time). Bandwidth counts the
// fewest bytes an op must move: each input read once, each output written once.
//
// The tests also build every program with the host compiler on the CUDA emulator
// (tests/support/cuda_emulation.hpp, GPIPE_CUDA_EMULATION) and run each benchmark once, with the
// sizes that sized() gives there: a smoke test of the programs' code, not a measurement.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "bench/support/cuda.cuh is CUDA code: compile it with nvcc"
#endif

#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/cuda.cuh"

namespace gpipe::bench {

// A benchmark's size: `full` on a GPU, `emulated` on the CPU emulator (small enough that every
// benchmark runs in about a second there), `full` again in a program built for the emulator's
// dry run (GPIPE_BENCH_FULL_SIZE: launches recorded, none run).
template <class T>
constexpr T sized([[maybe_unused]] T full, [[maybe_unused]] T emulated) {
#if defined(GPIPE_CUDA_EMULATION) && !defined(GPIPE_BENCH_FULL_SIZE)
  return emulated;
#else
  return full;
#endif
}

struct Ceilings {
  double copy_gbps = 0;     // cudaMemcpyAsync device to device, bytes read + written per second
  double sgemm_tflops = 0;  // cublasSgemm n^3, FP32 math (no TF32)
  int sgemm_n = 0;
};

inline Ceilings& ceilings() {
  static Ceilings c;
  return c;
}

// Uniform in [lo, hi) from a hash of the index and seed (never zeros: they time differently).
__global__ void random_fill_kernel(std::size_t n, std::uint32_t seed, float lo, float hi,
                                   float* out) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed * 0x85EBCA77u ^
                      static_cast<std::uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    out[i] = lo + (hi - lo) * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  }
}
inline void random_fill(std::size_t n, std::uint32_t seed, float lo, float hi, float* out,
                        cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::clamp<std::size_t>((n + 255) / 256, 1, 1024));
  GPIPE_CUDA_LAUNCH(random_fill_kernel, blocks, 256, stream)(n, seed, lo, hi, out);
  GPIPE_CUDA_CHECK_LAUNCH("random_fill_kernel");
}

// Times `launch` (which enqueues one op on `stream`) with CUDA events, `reps` launches per
// benchmark iteration after one warm-up launch; returns the mean seconds per launch.
template <class F>
double time_launches(benchmark::State& state, cudaStream_t stream, int reps, F&& launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  GPIPE_CUDA_CHECK(cudaEventCreate(&start));
  GPIPE_CUDA_CHECK(cudaEventCreate(&stop));
  launch();
  GPIPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  double total_s = 0;
  std::size_t launches = 0;
  for (auto _ : state) {
    GPIPE_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; ++i) launch();
    GPIPE_CUDA_CHECK(cudaEventRecord(stop, stream));
    GPIPE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    GPIPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    const double s = 1e-3 * ms / reps;
    state.SetIterationTime(s);
    total_s += 1e-3 * ms;
    launches += static_cast<std::size_t>(reps);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return launches == 0 ? 0 : total_s / static_cast<double>(launches);
}

// Bandwidth counters: achieved GB/s and its share of the measured copy bandwidth.
inline void report_bandwidth(benchmark::State& state, double bytes, double seconds) {
  if (seconds <= 0) return;
  const double gbps = bytes / seconds / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["%copy"] = 100 * gbps / ceilings().copy_gbps;
}
// FLOP counters: achieved TFLOP/s and its share of the measured SGEMM rate.
inline void report_flops(benchmark::State& state, double flops, double seconds) {
  if (seconds <= 0) return;
  const double tflops = flops / seconds / 1e12;
  state.counters["TFLOP/s"] = tflops;
  state.counters["%sgemm"] = 100 * tflops / ceilings().sgemm_tflops;
}

// Median of `reps` event-timed runs of f on stream, in seconds.
template <class F>
double median_seconds(cudaStream_t stream, int reps, F&& f) {
  cudaEvent_t start = nullptr, stop = nullptr;
  GPIPE_CUDA_CHECK(cudaEventCreate(&start));
  GPIPE_CUDA_CHECK(cudaEventCreate(&stop));
  f();  // warm-up
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    GPIPE_CUDA_CHECK(cudaEventRecord(start, stream));
    f();
    GPIPE_CUDA_CHECK(cudaEventRecord(stop, stream));
    GPIPE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    GPIPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1e-3 * ms);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The two ceilings on the current GPU: a 1 GiB device-to-device copy and an 8192^3 SGEMM (1 MiB
// and 64^3 on the emulator).
inline Ceilings measure_ceilings() {
  Ceilings c;
  cudaStream_t stream = nullptr;
  GPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    const std::size_t bytes = sized(std::size_t{1} << 30, std::size_t{1} << 20);
    void *src = nullptr, *dst = nullptr;
    GPIPE_CUDA_CHECK(cudaMalloc(&src, bytes));
    GPIPE_CUDA_CHECK(cudaMalloc(&dst, bytes));
    random_fill(bytes / 4, 1, -1, 1, static_cast<float*>(src), stream);
    const double s = median_seconds(stream, 20, [&] {
      GPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    });
    c.copy_gbps = 2.0 * static_cast<double>(bytes) / s / 1e9;
    GPIPE_CUDA_CHECK(cudaFree(src));
    GPIPE_CUDA_CHECK(cudaFree(dst));
  }
  {
    const int n = sized(8192, 64);
    const std::size_t count = static_cast<std::size_t>(n) * n;
    float *a = nullptr, *b = nullptr, *out = nullptr;
    GPIPE_CUDA_CHECK(cudaMalloc(&a, count * sizeof(float)));
    GPIPE_CUDA_CHECK(cudaMalloc(&b, count * sizeof(float)));
    GPIPE_CUDA_CHECK(cudaMalloc(&out, count * sizeof(float)));
    random_fill(count, 2, -1, 1, a, stream);
    random_fill(count, 3, -1, 1, b, stream);
    cublasHandle_t handle = nullptr;
    GPIPE_CUBLAS_CHECK(cublasCreate(&handle));
    GPIPE_CUBLAS_CHECK(cublasSetStream(handle, stream));
    GPIPE_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    const float one = 1, zero = 0;
    const double s = median_seconds(stream, 5, [&] {
      GPIPE_CUBLAS_CHECK(
          cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, out, n));
    });
    c.sgemm_tflops = 2.0 * n * static_cast<double>(n) * n / s / 1e12;
    c.sgemm_n = n;
    (void)cublasDestroy(handle);
    GPIPE_CUDA_CHECK(cudaFree(a));
    GPIPE_CUDA_CHECK(cudaFree(b));
    GPIPE_CUDA_CHECK(cudaFree(out));
  }
  GPIPE_CUDA_CHECK(cudaStreamDestroy(stream));
  return c;
}

// Whether GPU 0 is the CUDA emulator's dry run (tests/support/cuda_emulation/device.hpp): every
// launch recorded, none run, so times mean nothing there; launch records and memory do.
inline bool dry_run() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess &&
         std::string(prop.name).find("dry run") != std::string::npos;
}

struct MainOptions {
  // Measure the copy and SGEMM ceilings first (a second or two) and add them to the context; a
  // program whose numbers do not compare against them (bench_cuda_bubble) skips this.
  bool ceilings = true;
};

// main of a CUDA benchmark program: without a GPU it says so and exits 0; otherwise it measures
// the ceilings, adds them and the GPU to the context, and runs the registered benchmarks.
inline int cuda_benchmark_main(int argc, char** argv, MainOptions options = {}) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA GPU (%s); nothing to measure\n", argc > 0 ? argv[0] : "benchmark",
                error != cudaSuccess ? cudaGetErrorString(error) : "cudaGetDeviceCount found none");
    return 0;
  }
  cudaDeviceProp prop{};
  GPIPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  benchmark::AddCustomContext("gpu", std::string(prop.name) + ", " +
                                         std::to_string(prop.multiProcessorCount) + " SMs, " +
                                         std::to_string(prop.totalGlobalMem >> 20) + " MiB");
  benchmark::AddCustomContext(
      "cuda", "driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime));
  if (options.ceilings && !dry_run()) {
    ceilings() = measure_ceilings();
    benchmark::AddCustomContext("ceiling_copy_GBps", std::to_string(ceilings().copy_gbps));
    benchmark::AddCustomContext("ceiling_sgemm_TFLOPs", std::to_string(ceilings().sgemm_tflops));
    std::printf("ceilings: device-to-device copy %.0f GB/s, FP32 SGEMM %d^3 %.1f TFLOP/s\n",
                ceilings().copy_gbps, ceilings().sgemm_n, ceilings().sgemm_tflops);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace gpipe::bench
