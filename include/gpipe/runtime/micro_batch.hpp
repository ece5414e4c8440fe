#pragma once
// Splitting a mini-batch of N rows into M micro-batches whose sizes differ by at most one:
// the first N % M micro-batches get one row more.
//   (N = 10, M = 4) => rows 3, 3, 2, 2 starting at 0, 3, 6, 8

#include <cstddef>

namespace gpipe {

struct MicroBatchSplit {
  std::size_t rows = 0;           // N
  std::size_t micro_batches = 1;  // M, 1 <= M <= N

  constexpr std::size_t size(std::size_t mb) const {
    return rows / micro_batches + (mb < rows % micro_batches ? 1 : 0);
  }
  constexpr std::size_t begin(std::size_t mb) const {
    const std::size_t extra = rows % micro_batches;
    return mb * (rows / micro_batches) + (mb < extra ? mb : extra);
  }
};

static_assert(MicroBatchSplit{10, 4}.size(0) == 3 && MicroBatchSplit{10, 4}.size(3) == 2);
static_assert(MicroBatchSplit{10, 4}.begin(2) == 6 && MicroBatchSplit{10, 4}.begin(3) == 8);

}  // namespace gpipe
