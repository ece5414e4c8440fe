#pragma once
// Splitting a mini-batch of N rows into M micro-batches whose sizes differ by at most one
// sample: the first (N / R) % M micro-batches get one sample more. A sample is R rows (R = 1, or
// T tokens in a token model), and a micro-batch never splits one.
//   (N = 10, M = 4)         => rows 3, 3, 2, 2 starting at 0, 3, 6, 8
//   (N = 10, M = 4, R = 2)  => 5 samples: rows 4, 2, 2, 2 starting at 0, 4, 6, 8

#include <cstddef>

namespace gpipe {

/// A mini-batch of N rows split into M micro-batches of whole samples (R rows each) whose sizes
/// differ by at most one sample, the larger ones first:
///
///     (N = 10, M = 4)         => rows 3, 3, 2, 2 starting at 0, 3, 6, 8
///     (N = 10, M = 4, R = 2)  => 5 samples: rows 4, 2, 2, 2 starting at 0, 4, 6, 8
struct MicroBatchSplit {
  std::size_t rows = 0;           ///< N, a multiple of sample_rows
  std::size_t micro_batches = 1;  ///< M, 1 <= M <= N / sample_rows
  std::size_t sample_rows = 1;    ///< R

  /// N / R, the samples of the mini-batch.
  constexpr std::size_t samples() const { return rows / sample_rows; }
  /// Rows of micro-batch `mb` (0 <= mb < M): R (samples() / M), one sample more for each of the
  /// first samples() % M.
  constexpr std::size_t size(std::size_t mb) const {
    return sample_rows * (samples() / micro_batches + (mb < samples() % micro_batches ? 1 : 0));
  }
  /// The first row of micro-batch `mb` (0 <= mb <= M; `begin(M)` is N): the sizes before it.
  constexpr std::size_t begin(std::size_t mb) const {
    const std::size_t extra = samples() % micro_batches;
    return sample_rows * (mb * (samples() / micro_batches) + (mb < extra ? mb : extra));
  }
};

static_assert(MicroBatchSplit{10, 4}.size(0) == 3 && MicroBatchSplit{10, 4}.size(3) == 2);
static_assert(MicroBatchSplit{10, 4}.begin(2) == 6 && MicroBatchSplit{10, 4}.begin(3) == 8);
static_assert(MicroBatchSplit{10, 4, 2}.size(0) == 4 && MicroBatchSplit{10, 4, 2}.size(1) == 2);
static_assert(MicroBatchSplit{10, 4, 2}.begin(1) == 4 && MicroBatchSplit{10, 4, 2}.begin(3) == 8);

}  // namespace gpipe
