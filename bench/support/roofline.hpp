#pragma once
// A step's launch records (gpipe/backend/cuda/launch_log.cuh) summed up, and priced on a roofline
// of an NVIDIA H200 SXM: each launch takes max(FLOPs / peak, bytes / bandwidth) plus a fixed cost
// per launch, one after another (one stream's worth of work; virtual devices of one GPU share
// it). Beside them, the ideal non-GEMM traffic of a GPT-2 step, against which the records'
// bytes outside GEMMs are judged (issue 44's targets).
//
// The same summary comes from a GPU run and from the CUDA emulator's dry run (nothing computed,
// every launch recorded), so the prediction can be read on a machine without a GPU and compared
// with the measured step on one.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gpipe/backend/cuda/launch_log.cuh"

namespace gpipe::bench {

// The machine the prediction prices launches on: an H200 SXM, from NVIDIA's data sheet (dense
// peaks), and a per-launch cost for back-to-back kernels on one stream without CUDA Graphs (an
// assumption, to be compared with the measured step on the first GPU at hand).
struct Roofline {
  double tensor_flops = 989e12;  // bf16 tensor cores, dense
  double simt_flops = 67e12;     // fp32 on the CUDA cores (FP32 GEMMs without TF32, our kernels)
  double bandwidth = 4.8e12;     // HBM3e bytes per second
  double host_bandwidth = 50e9;  // PCIe 5 x16, uploads and downloads
  double launch_s = 2e-6;        // per launch
};

// One kernel's (or cuBLAS call's) share of a step.
struct KernelShare {
  std::string name;
  std::size_t launches = 0;
  double flops = 0, bytes = 0, seconds = 0;
};

// A step's records, summed.
struct StepRecords {
  std::size_t launches = 0;  // everything enqueued: kernels, GEMMs, copies, memsets
  std::size_t gemms = 0;
  double gemm_flops = 0, gemm_bytes = 0, gemm_s = 0;
  double other_flops = 0, other_bytes = 0, other_s = 0;  // outside GEMMs
  double launch_s = 0;                                   // launches times the fixed cost
  std::vector<KernelShare> kernels;                      // by predicted time, largest first
  double predicted_s() const { return gemm_s + other_s + launch_s; }
};

inline double roofline_seconds(const gpipe::cuda::LaunchRecord& r, const Roofline& m) {
  const double bytes = r.bytes_read + r.bytes_written;
  if (r.kind == gpipe::cuda::LaunchKind::host_copy) return bytes / 2 / m.host_bandwidth;
  const double peak = r.tensor_cores ? m.tensor_flops : m.simt_flops;
  return std::max(r.flops / peak, bytes / m.bandwidth);
}

inline StepRecords summarize(const std::vector<gpipe::cuda::LaunchRecord>& records,
                             const Roofline& m = {}) {
  StepRecords s;
  std::map<std::string, KernelShare> by_name;
  for (const gpipe::cuda::LaunchRecord& r : records) {
    const double seconds = roofline_seconds(r, m), bytes = r.bytes_read + r.bytes_written;
    ++s.launches;
    if (r.kind == gpipe::cuda::LaunchKind::gemm) {
      ++s.gemms;
      s.gemm_flops += r.flops;
      s.gemm_bytes += bytes;
      s.gemm_s += seconds;
    } else {
      s.other_flops += r.flops;
      s.other_bytes += bytes;
      s.other_s += seconds;
    }
    KernelShare& k = by_name[std::string(r.kernel)];
    k.name = r.kernel;
    ++k.launches;
    k.flops += r.flops;
    k.bytes += bytes;
    k.seconds += seconds + m.launch_s;
  }
  s.launch_s = static_cast<double>(s.launches) * m.launch_s;
  for (auto& [name, k] : by_name) s.kernels.push_back(k);
  std::sort(s.kernels.begin(), s.kernels.end(),
            [](const KernelShare& a, const KernelShare& b) { return a.seconds > b.seconds; });
  return s;
}

// Prints the step's kernels (predicted time, launches, GFLOP, MB) under `title`.
inline void print_step_records(const std::string& title, const StepRecords& s) {
  std::printf(
      "%s: %zu launches (%zu GEMMs), predicted %.3f ms on an H200 (GEMMs %.3f, other "
      "kernels %.3f, launch costs %.3f)\n",
      title.c_str(), s.launches, s.gemms, 1e3 * s.predicted_s(), 1e3 * s.gemm_s, 1e3 * s.other_s,
      1e3 * s.launch_s);
  std::printf("  %-44s %9s %10s %10s %9s\n", "kernel", "launches", "GFLOP", "MB", "pred ms");
  for (const KernelShare& k : s.kernels)
    std::printf("  %-44s %9zu %10.2f %10.1f %9.3f\n", k.name.c_str(), k.launches, k.flops / 1e9,
                k.bytes / 1e6, 1e3 * k.seconds);
}

// The ideal bytes outside GEMMs per token of a GPT-2 step (L blocks of width D, vocabulary V,
// N parameters, `tokens` per step) with bf16 activations and float master weights, each
// activation read and written once per op that needs it; bias adds and bias gradients in the
// GEMMs' epilogues:
//   a block, in activations of 2 bytes:
//     forward:  LayerNorm 2D (x in, y out) twice, attention 4D (q, k, v in, o out), residual
//               adds 3D twice, GELU 8D (4D in, 4D out)                             = 22 D
//     backward: residual adds 3D twice, LayerNorm 3D (x, dy in, dx out) twice, GELU 12D,
//               attention 8D (q, k, v, o, do in; dq, dk, dv out)                   = 32 D
//   the embedding: forward wte's and wpe's rows in (float) and y out; backward dy in and the
//     gradient rows read and written (float)                                        = 28 D bytes
//   the final LayerNorm: 5 D activations; the loss in place: logits in, dlogits out = 2 V
//   AdamW with the bf16 copy fused: per parameter p, g, m, v in, p, m, v out (float), the copy
//     out (bf16) = 30 bytes, spread over the step's tokens.
constexpr double gpt_ideal_other_bytes_per_token(std::size_t L, std::size_t D, std::size_t V,
                                                 std::size_t N, std::size_t tokens) {
  const double d = static_cast<double>(D);
  const double blocks = static_cast<double>(L) * 54 * d * 2;
  const double embedding = 28 * d, final_norm = 5 * d * 2, loss = 2 * static_cast<double>(V) * 2;
  const double optimizer = 30 * static_cast<double>(N) / static_cast<double>(tokens);
  return blocks + embedding + final_norm + loss + optimizer;
}

}  // namespace gpipe::bench
