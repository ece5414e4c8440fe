#pragma once
// The attention core's definition, evaluated directly in double (sums in long double), for the
// kernel tests of both backends: every query row's whole score row, softmax, output and
// log-sum-exp, and the backward by the chain rule through P (the (T, T) way the kernels avoid),
// for any AttentionGeometry (grouped-query heads, q, k, v anywhere in a row) and document ids.
// Also the problems the tests run: a geometry, qkv, dout and document ids.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpipe/model/attention.hpp"
#include "gpipe/model/layer.hpp"

namespace gpipe::test {

/// What the reference computes: o (rows, H d), lse (rows, H), dqkv (rows, ld) (columns outside
/// the heads 0).
struct AttentionResult {
  std::vector<double> o, lse, dqkv;
};

/// Whether query t of a sample attends to key u: u <= t and, with document ids (the sample's
/// tokens), no change of id between them (one run of equal ids).
inline bool attends(const std::int32_t* document, std::size_t t, std::size_t u) {
  if (u > t) return false;
  if (document == nullptr) return true;
  for (std::size_t w = u; w < t; ++w)
    if (document[w] != document[w + 1]) return false;
  return true;
}

/// The definition (see the top of this file); document (rows) or null.
inline AttentionResult attention_reference(const AttentionGeometry& g,
                                           const std::vector<double>& qkv,
                                           const std::vector<double>& dout,
                                           const std::int32_t* document = nullptr) {
  const std::size_t T = g.tokens, H = g.heads, d = g.head_size, hd = H * d;
  AttentionResult r{std::vector<double>(g.rows() * hd), std::vector<double>(g.rows() * H),
                    std::vector<double>(g.rows() * g.ld, 0.0)};
  const long double scale = 1.0L / std::sqrt(static_cast<long double>(d));
  std::vector<long double> p(T), dp(T);
  for (std::size_t b = 0; b < g.samples; ++b) {
    const std::int32_t* doc = document == nullptr ? nullptr : document + b * T;
    auto at = [&](std::size_t t, std::size_t column) {
      return static_cast<long double>(qkv[(b * T + t) * g.ld + column]);
    };
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t qc = g.q + h * d, kc = g.k + g.kv_head(h) * d, vc = g.v + g.kv_head(h) * d;
      for (std::size_t t = 0; t < T; ++t) {
        const std::size_t row = b * T + t;
        long double max = -INFINITY;
        for (std::size_t u = 0; u < T; ++u) {
          if (!attends(doc, t, u)) continue;
          long double s = 0;
          for (std::size_t i = 0; i < d; ++i) s += at(t, qc + i) * at(u, kc + i);
          p[u] = s * scale;
          max = std::max(max, p[u]);
        }
        long double sum = 0;
        for (std::size_t u = 0; u < T; ++u)
          if (attends(doc, t, u)) sum += std::exp(p[u] - max);
        for (std::size_t u = 0; u < T; ++u)
          p[u] = attends(doc, t, u) ? std::exp(p[u] - max) / sum : 0.0L;
        r.lse[row * H + h] = static_cast<double>(max + std::log(sum));
        for (std::size_t i = 0; i < d; ++i) {
          long double o = 0;
          for (std::size_t u = 0; u <= t; ++u) o += p[u] * at(u, vc + i);
          r.o[row * hd + h * d + i] = static_cast<double>(o);
        }
        if (dout.empty()) continue;
        // dP_u = do_t . v_u, dS = P .* (dP - rowsum(dP .* P))
        long double dot = 0;
        for (std::size_t u = 0; u <= t; ++u) {
          dp[u] = 0;
          for (std::size_t i = 0; i < d; ++i)
            dp[u] += static_cast<long double>(dout[row * hd + h * d + i]) * at(u, vc + i);
          dot += dp[u] * p[u];
        }
        for (std::size_t u = 0; u <= t; ++u) {
          const long double ds = p[u] * (dp[u] - dot) * scale;
          for (std::size_t i = 0; i < d; ++i) {
            r.dqkv[row * g.ld + qc + i] += static_cast<double>(ds * at(u, kc + i));
            r.dqkv[(b * T + u) * g.ld + kc + i] += static_cast<double>(ds * at(t, qc + i));
            r.dqkv[(b * T + u) * g.ld + vc + i] +=
                static_cast<double>(p[u] * static_cast<long double>(dout[row * hd + h * d + i]));
          }
        }
      }
    }
  }
  return r;
}

/// An attention problem: uniform qkv in [-spread, spread) (columns outside the heads too),
/// dout in [-1, 1), and document ids in runs of random length (ids reused across runs) when
/// `documents`.
struct AttentionProblem {
  AttentionGeometry g;
  std::vector<double> qkv, dout;
  std::vector<std::int32_t> document;

  AttentionProblem(const AttentionGeometry& geometry, std::uint64_t seed, bool documents = false,
                   float spread = 2.0f)
      : g(geometry) {
    Rng rng(seed);
    for (std::size_t i = 0; i < g.rows() * g.ld; ++i) qkv.push_back(rng.uniform(-spread, spread));
    for (std::size_t i = 0; i < g.rows() * g.heads * g.head_size; ++i)
      dout.push_back(rng.uniform(-1, 1));
    if (documents) {
      std::int32_t id = 0;
      for (std::size_t r = 0; r < g.rows(); ++r) {
        if (rng.next_u64() % 11 == 0) id = static_cast<std::int32_t>(rng.next_u64() % 3);
        document.push_back(id);
      }
    }
  }
  const std::int32_t* documents() const { return document.empty() ? nullptr : document.data(); }
  AttentionResult reference() const { return attention_reference(g, qkv, dout, documents()); }
};

}  // namespace gpipe::test
