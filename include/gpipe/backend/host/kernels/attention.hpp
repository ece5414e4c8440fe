#pragma once
// Flash attention on the host, one head of one sample at a time: the algorithm of
// gpipe/model/attention.hpp in tiles of attention_query_block query rows by attention_key_block
// key rows, so that no (T, T) matrix exists (a tile of scores is all the scratch). Each tile's
// products are library GEMMs on strided views (host::gemm: two forward, five backward), the
// softmax runs on SIMD packs for float. Tiles and sums go in one fixed order: the result does not
// depend on how a caller splits heads over threads. The host reference of the CUDA kernels
// (gpipe/backend/cuda/kernels/attention.cuh).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "gpipe/backend/host/kernels/gemm.hpp"
#include "gpipe/backend/host/kernels/simd.hpp"
#include "gpipe/backend/host/kernels/softmax.hpp"

namespace gpipe::host {

/// Query rows per tile.
inline constexpr std::size_t attention_query_block = 64;
/// Key rows per tile.
inline constexpr std::size_t attention_key_block = 128;
/// Elements of F a head's forward needs as scratch: a tile of scores, a running max and sum.
inline constexpr std::size_t attention_forward_scratch =
    attention_query_block * attention_key_block + 2 * attention_query_block;
/// Elements of F a head's backward needs as scratch: a tile of P and one of dP, then dS.
inline constexpr std::size_t attention_backward_scratch =
    2 * attention_query_block * attention_key_block;

/// One head of one sample, F float or double: its `tokens` rows of q, k and v, each row's d
/// elements at the pointer plus a multiple of its stride; query t attends to the keys
/// [start[t], t] (start non-decreasing with start[t] <= t; null: 0 for every t, the causal mask).
template <class F>
struct AttentionHead {
  const F* q;                          ///< (tokens, d), rows ld_q apart
  const F* k;                          ///< (tokens, d), rows ld_k apart
  const F* v;                          ///< (tokens, d), rows ld_v apart
  std::size_t ld_q;                    ///< q's row stride
  std::size_t ld_k;                    ///< k's row stride
  std::size_t ld_v;                    ///< v's row stride
  std::size_t tokens;                  ///< T, rows of q, k and v
  std::size_t d;                       ///< the head size
  const std::size_t* start = nullptr;  ///< (tokens), or null

  /// The first key query t attends to.
  std::size_t first_key(std::size_t t) const { return start == nullptr ? 0 : start[t]; }
};

/// start (tokens) <- for each token the first token of its run of equal ids in `document`
/// (tokens): the mask of CausalAttentionOp's document ids for one sample.
inline void document_starts(const std::int32_t* document, std::size_t tokens,
                            std::vector<std::size_t>& start) {
  start.resize(tokens);
  for (std::size_t t = 0; t < tokens; ++t)
    start[t] = t > 0 && document[t] == document[t - 1] ? start[t - 1] : t;
}

}  // namespace gpipe::host

namespace gpipe::detail {

// The keys [lo, hi) of tile [u0, u0 + n) that query t attends to, relative to u0 (lo >= hi:
// none).
template <class F>
void attention_tile_keys(const host::AttentionHead<F>& h, std::size_t t, std::size_t u0,
                         std::size_t n, std::size_t& lo, std::size_t& hi) {
  const std::size_t first = h.first_key(t);
  lo = first > u0 ? first - u0 : 0;
  hi = std::min(t + 1 - std::min(t + 1, u0), n);
}

template <class F>
void attention_scale_row(std::size_t n, F alpha, F* x) {
  host::simd::transform(
      n, [alpha](auto e) { return e * alpha; }, x, x);
}

}  // namespace gpipe::detail

namespace gpipe::host {

/// One head's forward: o (tokens, d) = softmax(q k^T / sqrt d, masked) v, rows ld_o apart,
/// overwritten; lse[t ld_lse] = the log-sum-exp of query t's scaled scores over the keys it
/// attends to. scratch: attention_forward_scratch elements, contents undefined after.
template <class F>
void attention_forward_head(const AttentionHead<F>& h, F* o, std::size_t ld_o, F* lse,
                            std::size_t ld_lse, F* scratch) {
  constexpr std::size_t QB = attention_query_block, KB = attention_key_block;
  const F scale = F(1) / std::sqrt(static_cast<F>(h.d));
  F* s = scratch;      // (QB, KB): scores, then e^(S - m) in place
  F* m = s + QB * KB;  // (QB): running max
  F* l = m + QB;       // (QB): running sum
  for (std::size_t t0 = 0; t0 < h.tokens; t0 += QB) {
    const std::size_t n = std::min(QB, h.tokens - t0), end = t0 + n;  // keys before end
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = -std::numeric_limits<F>::infinity();
      l[i] = 0;
      std::fill_n(o + (t0 + i) * ld_o, h.d, F(0));
    }
    for (std::size_t u0 = h.first_key(t0); u0 < end; u0 += KB) {
      const std::size_t nc = std::min(KB, end - u0);
      // S (n, nc) = scale q k^T
      gemm(false, true, n, nc, h.d, scale, h.q + t0 * h.ld_q, h.k + u0 * h.ld_k, F(0), s,
           {h.ld_q, h.ld_k, KB});
      for (std::size_t i = 0; i < n; ++i) {
        F* row = s + i * KB;
        std::size_t lo, hi;
        gpipe::detail::attention_tile_keys(h, t0 + i, u0, nc, lo, hi);
        if (lo >= hi) {
          std::fill_n(row, nc, F(0));
          continue;
        }
        const F max = std::max(m[i], gpipe::detail::row_max(row + lo, hi - lo));
        const F rescale = std::exp(m[i] - max);  // 0 on the row's first tile
        const auto sum =
            static_cast<F>(gpipe::detail::exp_shifted(row + lo, max, hi - lo, row + lo));
        std::fill_n(row, lo, F(0));
        std::fill(row + hi, row + nc, F(0));
        l[i] = l[i] * rescale + sum;
        if (rescale != F(1)) gpipe::detail::attention_scale_row(h.d, rescale, o + (t0 + i) * ld_o);
        m[i] = max;
      }
      // o += e^(S - m) v
      gemm(false, false, n, h.d, nc, F(1), s, h.v + u0 * h.ld_v, F(1), o + t0 * ld_o,
           {KB, h.ld_v, ld_o});
    }
    for (std::size_t i = 0; i < n; ++i) {
      gpipe::detail::attention_scale_row(h.d, F(1) / l[i], o + (t0 + i) * ld_o);
      lse[(t0 + i) * ld_lse] = m[i] + std::log(l[i]);
    }
  }
}

/// One head's backward from the forward's lse and delta[t ld_delta] = rowsum(do .* o) of query
/// t: dq (tokens, d) overwritten, dk and dv (tokens, d) accumulated (+=: the query heads of a
/// group sum into their key/value head), rows ld_dq and ld_dkv apart; dout (tokens, d) rows
/// ld_do apart. scratch: attention_backward_scratch elements, contents undefined after.
template <class F>
void attention_backward_head(const AttentionHead<F>& h, const F* lse, std::size_t ld_lse,
                             const F* delta, std::size_t ld_delta, const F* dout, std::size_t ld_do,
                             F* dq, std::size_t ld_dq, F* dk, F* dv, std::size_t ld_dkv,
                             F* scratch) {
  constexpr std::size_t QB = attention_query_block, KB = attention_key_block;
  const F scale = F(1) / std::sqrt(static_cast<F>(h.d));
  F* p = scratch;       // (QB, KB): P
  F* ds = p + QB * KB;  // (QB, KB): dP, then dS in place
  for (std::size_t t0 = 0; t0 < h.tokens; t0 += QB) {
    const std::size_t n = std::min(QB, h.tokens - t0), end = t0 + n;
    for (std::size_t i = 0; i < n; ++i) std::fill_n(dq + (t0 + i) * ld_dq, h.d, F(0));
    const F* q = h.q + t0 * h.ld_q;
    const F* g = dout + t0 * ld_do;
    for (std::size_t u0 = h.first_key(t0); u0 < end; u0 += KB) {
      const std::size_t nc = std::min(KB, end - u0);
      // P (n, nc) = e^(scale q k^T - L), 0 where masked
      gemm(false, true, n, nc, h.d, scale, q, h.k + u0 * h.ld_k, F(0), p, {h.ld_q, h.ld_k, KB});
      for (std::size_t i = 0; i < n; ++i) {
        F* row = p + i * KB;
        std::size_t lo, hi;
        gpipe::detail::attention_tile_keys(h, t0 + i, u0, nc, lo, hi);
        if (lo >= hi) {
          std::fill_n(row, nc, F(0));
          continue;
        }
        gpipe::detail::exp_shifted(row + lo, lse[(t0 + i) * ld_lse], hi - lo, row + lo);
        std::fill_n(row, lo, F(0));
        std::fill(row + hi, row + nc, F(0));
      }
      // dv += P^T do;  dP = do v^T;  dS = P .* (dP - D)
      gemm(true, false, nc, h.d, n, F(1), p, g, F(1), dv + u0 * ld_dkv, {KB, ld_do, ld_dkv});
      gemm(false, true, n, nc, h.d, F(1), g, h.v + u0 * h.ld_v, F(0), ds, {ld_do, h.ld_v, KB});
      for (std::size_t i = 0; i < n; ++i) {
        const F d_t = delta[(t0 + i) * ld_delta];
        host::simd::transform(
            nc, [d_t](auto pe, auto dpe) { return pe * (dpe - d_t); }, ds + i * KB, p + i * KB,
            ds + i * KB);
      }
      // dq += scale dS k;  dk += scale dS^T q
      gemm(false, false, n, h.d, nc, scale, ds, h.k + u0 * h.ld_k, F(1), dq + t0 * ld_dq,
           {KB, h.ld_k, ld_dq});
      gemm(true, false, nc, h.d, n, scale, ds, q, F(1), dk + u0 * ld_dkv, {KB, h.ld_q, ld_dkv});
    }
  }
}

}  // namespace gpipe::host
