#pragma once
// Embedding on the CUDA backend. Forward: one thread per output element. W, over every SM and
// without atomics, in the host reference's order (gpipe/backend/host/layers/embedding.hpp: rows
// in order), so the sums are the same bits every run and on the host:
//   1. the rows sorted by token id, stably (an LSD radix sort of 8-bit digits, three passes for
//      ids < 2^24, which float and bf16 ids are; chunks of 256 rows, one block each: count the
//      chunk's digits, one scan over (digit, chunk), scatter each digit's rows in chunk order);
//   2. dwte: one block per run of equal ids in the sorted order, a thread per column adding the
//      run's rows of dy in row order;
//   3. dwpe: a thread per (position, column) adding its rows r = s T + p in order of s.
// With document ids (packed documents) a row's position p_r is its distance from the first row
// of its run of equal ids in its sample (cuda::document_positions, kernels/positions.cuh),
// forward reads wpe at p_r, and dwpe is done as dwte is, the rows
// sorted stably by position (enough 8-bit passes for positions below T) and each position's rows
// added in row order, the host's order again.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/layers/embedding.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/cuda/kernels/common.cuh"
#include "gpipe/backend/cuda/kernels/positions.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/error.hpp"
#include "gpipe/model/embedding.hpp"
#include "gpipe/model/kernel_context.hpp"

namespace gpipe::cuda {

namespace detail {
// A row's token id: held as a float with a whole value, or (bf16 activations) in the 16 bits.
__device__ __forceinline__ std::size_t token_id(float id) {
  return static_cast<std::size_t>(lrintf(id));
}
__device__ __forceinline__ std::size_t token_id(bf16 id) { return id.bits; }
}  // namespace detail

/// y(rows, width) = wte(id_r, :) + wpe(p_r, :), summed in float and stored as T; ids are floats
/// holding whole numbers, or for bf16 activations the 16 bits of each bf16; p_r = position[r], or
/// r % tokens where position is null
template <class T>
__global__ void embedding_forward_kernel(std::size_t rows, std::size_t tokens, std::size_t width,
                                         const T* ids, const float* wte, const float* wpe,
                                         const std::uint32_t* position, T* y) {
  for (std::size_t i = detail::global_thread(); i < rows * width; i += detail::grid_threads()) {
    const std::size_t r = i / width, c = i % width;
    const std::size_t id = detail::token_id(ids[r]);
    const std::size_t p = position == nullptr ? r % tokens : position[r];
    const float e = wte[id * width + c];
    y[i] = detail::narrow<T>(wpe == nullptr ? e : e + wpe[p * width + c]);
  }
}

namespace detail {
// The keys the rows are sorted by: their token ids (dwte) ...
template <class T>
struct TokenKeys {
  const T* ids;
  __device__ __forceinline__ std::size_t operator()(std::size_t r) const {
    return token_id(ids[r]);
  }
};
// ... or their positions (dwpe with documents).
struct PositionKeys {
  const std::uint32_t* position;
  __device__ __forceinline__ std::size_t operator()(std::size_t r) const { return position[r]; }
};

// The radix sort of step 1 (see the top of this file): digits of radix_bits, chunks of
// sort_chunk rows (a block of radix threads each), enough passes for ids below 2^24.
inline constexpr unsigned radix_bits = 8, radix = 1u << radix_bits, radix_passes = 3;
inline constexpr std::size_t sort_chunk = radix;
static_assert(radix_bits * radix_passes >= 24, "gpipe: the id sort covers ids below 2^24");

// The passes that sort keys below `bound` (at least one).
inline unsigned passes_below(std::size_t bound) {
  unsigned passes = 1;
  while (passes * radix_bits < 64 && (bound - 1) >> (passes * radix_bits) != 0) ++passes;
  return passes;
}

inline std::size_t sort_chunks(std::size_t rows) { return (rows + sort_chunk - 1) / sort_chunk; }

// Row i of the order `order` (identity where null).
__device__ __forceinline__ std::uint32_t row_at(const std::uint32_t* order, std::size_t i) {
  return order == nullptr ? static_cast<std::uint32_t>(i) : order[i];
}

// Chunk blockIdx.x's digits at `shift` into digits[]: row i of the chunk's, 0xffff past the end.
template <class Keys>
__device__ void load_chunk_digits(std::size_t rows, Keys keys, const std::uint32_t* order,
                                  unsigned shift, std::uint16_t* digits) {
  const std::size_t i = blockIdx.x * sort_chunk + threadIdx.x;
  digits[threadIdx.x] =
      i < rows ? static_cast<std::uint16_t>((keys(row_at(order, i)) >> shift) & (radix - 1))
               : std::uint16_t{0xffff};
  __syncthreads();
}
}  // namespace detail

/// count(radix, chunks): count[d chunks + j] = rows of chunk j (rows j sort_chunk ..) of `order`
/// whose key has digit d at `shift`; a block of radix threads per chunk, thread d counting d.
template <class Keys>
__global__ void __launch_bounds__(detail::radix)
    embedding_digit_count_kernel(std::size_t rows, Keys keys, const std::uint32_t* order,
                                 unsigned shift, std::uint32_t* count) {
  __shared__ std::uint16_t digits[detail::sort_chunk];
  detail::load_chunk_digits(rows, keys, order, shift, digits);
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < detail::sort_chunk; ++i) n += digits[i] == threadIdx.x;
  count[threadIdx.x * gridDim.x + blockIdx.x] = n;
}

/// x(n) = its exclusive prefix sums, in place: one block of 1024 threads, each a contiguous
/// segment.
template <class T>
__global__ void __launch_bounds__(1024) exclusive_scan_kernel(std::size_t n, T* x) {
  __shared__ T sums[1024];
  const std::size_t per = (n + blockDim.x - 1) / blockDim.x;
  const std::size_t begin = threadIdx.x * per, end = begin + per < n ? begin + per : n;
  T s = 0;
  for (std::size_t i = begin; i < end; ++i) s += x[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    T run = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const T v = sums[t];
      sums[t] = run;
      run += v;
    }
  }
  __syncthreads();
  T run = sums[threadIdx.x];
  for (std::size_t i = begin; i < end; ++i) {
    const T v = x[i];
    x[i] = run;
    run += v;
  }
}

/// sorted(rows) = `order` (identity where null) stably sorted by the digit at `shift`: thread d
/// of chunk j's block writes the chunk's rows with digit d, in order, from offset[d chunks + j].
template <class Keys>
__global__ void __launch_bounds__(detail::radix)
    embedding_digit_scatter_kernel(std::size_t rows, Keys keys, const std::uint32_t* order,
                                   unsigned shift, const std::uint32_t* offset,
                                   std::uint32_t* sorted) {
  __shared__ std::uint16_t digits[detail::sort_chunk];
  detail::load_chunk_digits(rows, keys, order, shift, digits);
  std::uint32_t at = offset[threadIdx.x * gridDim.x + blockIdx.x];
  for (std::size_t i = 0; i < detail::sort_chunk; ++i)
    if (digits[i] == threadIdx.x)
      sorted[at++] = detail::row_at(order, blockIdx.x * detail::sort_chunk + i);
}

/// table(key, c) += dy(r, c) for the rows r of each run of one key in `sorted` (rows sorted by
/// key, stably), in float: a block per run start, a thread per column, the run's rows in order.
/// Keys are token ids (table dwte) or positions (dwpe with documents).
template <class Keys, class T>
__global__ void embedding_backward_wte_kernel(std::size_t rows, std::size_t width, Keys keys,
                                              const std::uint32_t* sorted, const T* dy,
                                              float* table) {
  for (std::size_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const std::size_t key = keys(sorted[i]);
    if (i > 0 && keys(sorted[i - 1]) == key) continue;  // not a run's start
    std::size_t end = i + 1;
    while (end < rows && keys(sorted[end]) == key) ++end;
    for (std::size_t c = threadIdx.x; c < width; c += blockDim.x) {
      float acc = table[key * width + c];
      for (std::size_t k = i; k < end; ++k) acc += detail::widen(dy[sorted[k] * width + c]);
      table[key * width + c] = acc;
    }
  }
}

/// dwpe(p, c) += dy(s tokens + p, c) over the samples s in order, in float: a thread per (p, c);
/// rows a multiple of tokens.
template <class T>
__global__ void embedding_backward_wpe_kernel(std::size_t rows, std::size_t tokens,
                                              std::size_t width, const T* dy, float* dwpe) {
  for (std::size_t i = detail::global_thread(); i < tokens * width; i += detail::grid_threads()) {
    float acc = dwpe[i];
    for (std::size_t r = i / width; r < rows; r += tokens)
      acc += detail::widen(dy[r * width + i % width]);
    dwpe[i] = acc;
  }
}

}  // namespace gpipe::cuda

namespace gpipe {

/// Embedding's kernels on the CUDA backend: a gather for forward, and for the weight gradient the
/// rows sorted by id on the device and each id's rows added in order (the top of this file):
/// deterministic, in the host's order, over every SM. There is
/// no input gradient: the ids are constant. On bf16 activations (gpipe::MixedBf16) the ids are in
/// the 16 bits of each bf16 (the executor stores them so), wte + wpe is summed in float and
/// rounded once, and dy is widened to float. With document ids (rows, device memory) each row's
/// position restarts at 0 where its run of equal ids starts (EmbeddingOp's contract).
/// Without a position table (wpe and dwpe null: TokenEmbedding) only wte is read and written.
template <class T>
struct LayerKernels<EmbeddingOp, cuda::KernelContext<T>> {
  /// y(rows, width) = wte(id_r, :) + wpe(p_r, :), overwritten; ids (rows) are token ids, which
  /// the Trainer has checked against the vocabulary (not checked again here); p_r = r % tokens,
  /// or with document (rows) the row's place in its run.
  static void forward(cuda::KernelContext<T>& k, std::size_t rows, std::size_t tokens,
                      std::size_t width, const T* ids, const float* wte, const float* wpe, T* y,
                      const std::int32_t* document = nullptr) {
    if (rows == 0) return;
    namespace d = cuda::detail;
    const std::uint32_t* position = nullptr;
    if (document != nullptr && wpe != nullptr) {
      auto* words = reinterpret_cast<std::uint32_t*>(k.scratch(rows));
      cuda::document_positions(rows, tokens, document, words, k.stream());
      position = words;
    }
    d::record_kernel("embedding_forward_kernel", {rows, width, 0},
                     static_cast<double>(rows * width),
                     d::bytes_of<T>(rows) +
                         d::bytes_of<float>(rows * width + (wpe == nullptr ? 0 : tokens * width)) +
                         (position != nullptr ? d::bytes_of<std::uint32_t>(rows) : 0.0),
                     d::bytes_of<T>(rows * width), k.stream());
    GPIPE_CUDA_LAUNCH(cuda::embedding_forward_kernel<T>, cuda::detail::grid_for(rows * width),
                      cuda::detail::block_size, k.stream())
    (rows, tokens, width, ids, wte, wpe, position, y);
    GPIPE_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
  }
  /// dwte(V, width) += dy(r, :) at row id_r and dwpe(tokens, width) += dy(r, :) at row p_r (r %
  /// tokens, or with document the row's place in its run), for every row r of dy(rows, width),
  /// in order of r.
  static void backward_weight(cuda::KernelContext<T>& k, std::size_t rows, std::size_t tokens,
                              std::size_t width, const T* ids, const T* dy, float* dwte,
                              float* dwpe, const std::int32_t* document = nullptr) {
    if (rows == 0) return;
    if (rows > std::numeric_limits<std::uint32_t>::max())
      throw Error("gpipe: Embedding's backward sorts at most 2^32 - 1 rows, got " +
                  std::to_string(rows));
    namespace d = cuda::detail;
    const std::size_t chunks = d::sort_chunks(rows), counts = d::radix * chunks;
    // scratch: two orders (rows each), the (digit, chunk) counts and with documents the rows'
    // positions, as 32-bit words
    const std::size_t position_words = document != nullptr ? rows : 0;
    auto* words = reinterpret_cast<std::uint32_t*>(k.scratch(2 * rows + counts + position_words));
    std::uint32_t* count = words + 2 * rows;
    const std::uint32_t* by_id =
        sort_rows(k, rows, cuda::detail::TokenKeys<T>{ids}, d::radix_passes, words, count);
    // each row's dy added to its id's row of dwte (read and written), dwpe likewise per position
    record_table(k, "embedding_backward_wte_kernel", rows, width, rows * width);
    constexpr auto by_ids = &cuda::embedding_backward_wte_kernel<d::TokenKeys<T>, T>;
    GPIPE_CUDA_LAUNCH(by_ids, d::grid_for(rows, 1), 128, k.stream())
    (rows, width, d::TokenKeys<T>{ids}, by_id, dy, dwte);
    GPIPE_CUDA_CHECK_LAUNCH("embedding_backward_wte_kernel");
    if (dwpe == nullptr) return;  // TokenEmbedding: no position table
    if (document != nullptr) {
      // the orders are free again: the launches above read them first (one stream)
      std::uint32_t* position = count + counts;
      cuda::document_positions(rows, tokens, document, position, k.stream());
      const std::uint32_t* by_position =
          sort_rows(k, rows, d::PositionKeys{position}, d::passes_below(tokens), words, count);
      record_table(k, "embedding_backward_wte_kernel", rows, width, tokens * width);
      constexpr auto by_positions = &cuda::embedding_backward_wte_kernel<d::PositionKeys, T>;
      GPIPE_CUDA_LAUNCH(by_positions, d::grid_for(rows, 1), 128, k.stream())
      (rows, width, d::PositionKeys{position}, by_position, dy, dwpe);
      GPIPE_CUDA_CHECK_LAUNCH("embedding_backward_wte_kernel");
      return;
    }
    d::record_kernel("embedding_backward_wpe_kernel", {rows, tokens, width},
                     static_cast<double>(rows * width),
                     d::bytes_of<T>(rows * width) + d::bytes_of<float>(tokens * width),
                     d::bytes_of<float>(tokens * width), k.stream());
    GPIPE_CUDA_LAUNCH(cuda::embedding_backward_wpe_kernel<T>, d::grid_for(tokens * width),
                      d::block_size, k.stream())
    (rows, tokens, width, dy, dwpe);
    GPIPE_CUDA_CHECK_LAUNCH("embedding_backward_wpe_kernel");
  }

 private:
  // The rows stably sorted by `keys` in `passes` 8-bit passes through two orders, orders(2 rows),
  // and the (digit, chunk) counts; returns the order that holds the result.
  template <class Keys>
  static const std::uint32_t* sort_rows(cuda::KernelContext<T>& k, std::size_t rows, Keys keys,
                                        unsigned passes, std::uint32_t* orders,
                                        std::uint32_t* count) {
    namespace d = cuda::detail;
    std::uint32_t* order[2] = {orders, orders + rows};
    const std::size_t chunks = d::sort_chunks(rows), counts = d::radix * chunks;
    const std::uint32_t* in = nullptr;  // the identity
    for (unsigned pass = 0; pass < passes; ++pass) {
      const unsigned shift = pass * d::radix_bits;
      std::uint32_t* out = order[pass % 2];
      record_sort_pass(k, rows, counts, in != nullptr);
      GPIPE_CUDA_LAUNCH(cuda::embedding_digit_count_kernel<Keys>, static_cast<unsigned>(chunks),
                        d::radix, k.stream())
      (rows, keys, in, shift, count);
      GPIPE_CUDA_CHECK_LAUNCH("embedding_digit_count_kernel");
      GPIPE_CUDA_LAUNCH(cuda::exclusive_scan_kernel<std::uint32_t>, 1, 1024, k.stream())
      (counts, count);
      GPIPE_CUDA_CHECK_LAUNCH("exclusive_scan_kernel");
      GPIPE_CUDA_LAUNCH(cuda::embedding_digit_scatter_kernel<Keys>, static_cast<unsigned>(chunks),
                        d::radix, k.stream())
      (rows, keys, in, shift, count, out);
      GPIPE_CUDA_CHECK_LAUNCH("embedding_digit_scatter_kernel");
      in = out;
    }
    return in;
  }

  // The launch record of one scatter-add of dy's rows into a table of `table` floats.
  static void record_table(cuda::KernelContext<T>& k, const char* kernel, std::size_t rows,
                           std::size_t width, std::size_t table) {
    namespace d = cuda::detail;
    d::record_kernel(kernel, {rows, width, 0}, static_cast<double>(rows * width),
                     d::bytes_of<T>(rows * width + rows) + d::bytes_of<std::uint32_t>(rows) +
                         d::bytes_of<float>(table),
                     d::bytes_of<float>(table), k.stream());
  }

  // The launch records of one radix pass: digit counts, their scan, the scatter (`ordered`: the
  // pass reads the previous pass's order).
  static void record_sort_pass(cuda::KernelContext<T>& k, std::size_t rows, std::size_t counts,
                               bool ordered) {
    namespace d = cuda::detail;
    const double ids = d::bytes_of<T>(rows) + (ordered ? d::bytes_of<std::uint32_t>(rows) : 0.0);
    const double count_bytes = d::bytes_of<std::uint32_t>(counts);
    d::record_kernel("embedding_digit_count_kernel", {rows, counts, 0}, 0, ids, count_bytes,
                     k.stream());
    d::record_kernel("exclusive_scan_kernel", {counts, 0, 0}, static_cast<double>(counts),
                     count_bytes, count_bytes, k.stream());
    d::record_kernel("embedding_digit_scatter_kernel", {rows, counts, 0}, 0, ids + count_bytes,
                     d::bytes_of<std::uint32_t>(rows), k.stream());
  }
};

}  // namespace gpipe
