#pragma once
// Token positions of packed documents on the host: each token's place in its run of equal
// document ids within its sample (README, "packed documents"), for every layer whose positions
// restart where a document starts (Embedding's learned positions; rotary ones likewise).
// CUDA's counterpart: gpipe/backend/cuda/kernels/positions.cuh.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpipe::host {

/// position (rows) <- each row's position in its sample of `tokens` rows (rows a multiple of
/// tokens): r % tokens without documents (document null), else r minus the first row of its run
/// of equal ids in document (rows) within its sample (runs end at sample borders; two runs of one
/// id are two documents). One pass over the rows.
inline void document_positions(std::size_t rows, std::size_t tokens, const std::int32_t* document,
                               std::vector<std::size_t>& position) {
  position.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const bool starts_run =
        r % tokens == 0 || (document != nullptr && document[r] != document[r - 1]);
    position[r] = starts_run ? 0 : position[r - 1] + 1;
  }
}

}  // namespace gpipe::host
