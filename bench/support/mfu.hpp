#pragma once
// Model FLOPs utilization as llm.c's train_gpt2cu reports it, so that gpipe's GPT rows and
// llm.c's step compare on one scale: FLOPs per token 6 N + 6 L D T (N the parameters counted
// once, a tied head not again: every weight in one matmul forward, two backward; the second term
// attention's q k^T and P v), against the GPU's dense bf16 tensor-core peak (also for fp32 rows).

#include <array>
#include <cstddef>
#include <string_view>

namespace gpipe::bench {

// 6 N + 6 L D T: N parameters (a tied head counted once), L blocks of width D, T tokens a sample.
constexpr double gpt_flops_per_token(std::size_t N, std::size_t L, std::size_t D, std::size_t T) {
  return 6.0 * static_cast<double>(N) +
         6.0 * static_cast<double>(L) * static_cast<double>(D) * static_cast<double>(T);
}

// Dense (no sparsity) bf16 tensor-core peak in TFLOP/s of a GPU from its cudaDeviceProp::name,
// from NVIDIA's data sheets (SXM parts at their boost clock); 0 for a GPU not in the table. The
// first entry whose key the name contains wins, so the more specific keys come first.
inline double bf16_dense_peak_tflops(std::string_view gpu_name) {
  struct Entry {
    std::string_view key;
    double tflops;
  };
  constexpr std::array<Entry, 11> table{{{"H100 PCIe", 756},
                                         {"H100 NVL", 835},
                                         {"H200", 989},
                                         {"H100", 989},
                                         {"B200", 2250},
                                         {"A100", 312},
                                         {"L40S", 362},
                                         {"L40", 181},
                                         {"L4", 121},
                                         {"A10", 125},
                                         {"RTX 4090", 165}}};
  for (const Entry& e : table)
    if (gpu_name.find(e.key) != std::string_view::npos) return e.tflops;
  return 0;
}

}  // namespace gpipe::bench
