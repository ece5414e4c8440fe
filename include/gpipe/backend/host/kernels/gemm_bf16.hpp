#pragma once
// GEMMs with bf16 inputs and fp32 accumulation on the host, for gpipe::MixedBf16:
//   C (m, n) = alpha op(A) op(B) + beta C,  A and B bf16,  C float or bf16 (rounded once, at the
//   end),  optionally + bias (n) in float before that rounding.
// Strided views (lda, ldb, ldc as host::gemm takes them) are read in place.
//
// Each shape gets a oneDNN matmul primitive, created once and kept: on CPUs with AVX512-BF16 (AMD
// Zen 4, Intel Cooper Lake on) or AMX (Intel Sapphire Rapids on) oneDNN runs it on those
// instructions ("brg:avx512_core_bf16", "brg:avx512_core_amx"), with more multiply-adds per
// cycle than its fp32 kernels (BENCHMARKS.md has the ratio). Where oneDNN has only its reference
// implementation for bf16 (a CPU without AVX-512, where it is many times slower than fp32), and
// in builds without oneDNN (GPIPE_HOST_GEMM_REFERENCE), the same product is computed as an fp32
// GEMM of the bf16 values widened exactly to float: the same products, accumulated in float.
// Either way the result is not bit-for-bit the other's (the accumulation order differs).

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gpipe/backend/host/kernels/bf16.hpp"
#include "gpipe/backend/host/kernels/gemm.hpp"
#include "gpipe/backend/host/kernels/linear.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/precision.hpp"

namespace gpipe::host {

/// A bf16 GEMM's shape: what op(A), op(B) and C are, and what is fused into it.
struct Bf16GemmShape {
  bool trans_a = false;    ///< op(A) is the transpose of the stored A
  bool trans_b = false;    ///< op(B) is the transpose of the stored B
  std::size_t m = 0;       ///< rows of op(A) and C
  std::size_t n = 0;       ///< columns of op(B) and C
  std::size_t k = 0;       ///< columns of op(A), rows of op(B)
  GemmStrides ld{};        ///< the stored rows' lengths of A, B and C
  bool c_is_float = true;  ///< C float (else bf16)
  float alpha = 1;         ///< the product's factor
  float beta = 0;          ///< C's factor: 0 overwrites C
  bool bias = false;       ///< + bias (n), float
  /// C (m, n) = alpha op(A) op(B) + beta C on dense operands (dense_strides()), no bias.
  static constexpr Bf16GemmShape dense(bool trans_a, bool trans_b, std::size_t m, std::size_t n,
                                       std::size_t k, float alpha, float beta, bool c_is_float) {
    return {.trans_a = trans_a,
            .trans_b = trans_b,
            .m = m,
            .n = n,
            .k = k,
            .ld = dense_strides(trans_a, trans_b, m, n, k),
            .c_is_float = c_is_float,
            .alpha = alpha,
            .beta = beta};
  }
  /// The fields as a tuple: a primitive is kept per distinct key.
  auto key() const {
    return std::make_tuple(trans_a, trans_b, m, n, k, ld.lda, ld.ldb, ld.ldc, c_is_float, alpha,
                           beta, bias);
  }
};

/// Runs bf16 GEMMs (see the top of this file), a primitive kept per shape. One per kernel
/// context, so per device: not thread-safe.
class Bf16Gemm {
 public:
  /// Past this many shapes the cache starts over (a caller cycling through batch sizes).
  static constexpr std::size_t max_cached = 128;

  /// C = alpha op(A) op(B) + beta C (+ bias), C float or bf16 as `shape` says.
  void operator()(const Bf16GemmShape& shape, const bf16* a, const bf16* b, const float* bias,
                  void* c) {
    if (shape.m == 0 || shape.n == 0) return;
#ifndef GPIPE_HOST_GEMM_REFERENCE
    Primitive& p = primitive_for(shape);
    if (p.matmul) return run(p, a, b, bias, c);
#endif
    widened(shape, a, b, bias, c);
  }

  /// What oneDNN chose for `shape` ("brg:avx512_core_bf16", ...), or "fp32 of the widened bf16"
  /// where it has no fast bf16 kernel (or this build has no oneDNN).
  std::string implementation(const Bf16GemmShape& shape) {
#ifndef GPIPE_HOST_GEMM_REFERENCE
    Primitive& p = primitive_for(shape);
    if (p.matmul) return p.name;
#endif
    (void)shape;
    return "fp32 of the widened bf16";
  }

 private:
  // The fp32 path: A and B widened to float (exact), an fp32 GEMM into a dense float C, which
  // starts as beta C, gets the bias and is stored (rounded once, for a bf16 C).
  void widened(const Bf16GemmShape& s, const bf16* a, const bf16* b, const float* bias, void* c) {
    const std::size_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
    const std::size_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
    a_.resize(a_rows * a_cols);
    b_.resize(b_rows * b_cols);
    c_.resize(s.m * s.n);
    for (std::size_t r = 0; r < a_rows; ++r)
      from_bf16(a_cols, a + r * s.ld.lda, a_.data() + r * a_cols);
    for (std::size_t r = 0; r < b_rows; ++r)
      from_bf16(b_cols, b + r * s.ld.ldb, b_.data() + r * b_cols);
    if (s.beta != 0) {
      for (std::size_t r = 0; r < s.m; ++r) {
        if (s.c_is_float)
          std::copy_n(static_cast<const float*>(c) + r * s.ld.ldc, s.n, c_.data() + r * s.n);
        else
          from_bf16(s.n, static_cast<const bf16*>(c) + r * s.ld.ldc, c_.data() + r * s.n);
      }
    }
    host::gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, s.alpha, a_.data(), b_.data(), s.beta,
               c_.data(), {a_cols, b_cols, s.n});
    if (s.bias)
      for (std::size_t r = 0; r < s.m; ++r)
        for (std::size_t j = 0; j < s.n; ++j) c_[r * s.n + j] += bias[j];
    for (std::size_t r = 0; r < s.m; ++r) {
      if (s.c_is_float)
        std::copy_n(c_.data() + r * s.n, s.n, static_cast<float*>(c) + r * s.ld.ldc);
      else
        to_bf16(s.n, c_.data() + r * s.n, static_cast<bf16*>(c) + r * s.ld.ldc);
    }
  }

  std::vector<float> a_, b_, c_;  ///< the fp32 path's widened operands and result

#ifndef GPIPE_HOST_GEMM_REFERENCE
  struct Primitive {
    detail::DnnlPtr<dnnl_primitive_t> matmul;  ///< null: oneDNN has no fast kernel; widen
    std::array<detail::DnnlPtr<dnnl_memory_t>, 4> memory;  ///< A, B, bias, C
    std::string name;
  };

  static constexpr std::array<int, 4> arg_ids{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS,
                                              DNNL_ARG_DST};

  void run(Primitive& p, const bf16* a, const bf16* b, const float* bias, void* c) {
    const std::array<const void*, 4> data{a, b, bias, c};
    std::array<dnnl_exec_arg_t, 4> args{};
    int count = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      if (!p.memory[i]) continue;
      detail::check_dnnl(dnnl_memory_set_data_handle(p.memory[i].get(), const_cast<void*>(data[i])),
                         "memory_set_data_handle");
      args[count++] = {arg_ids[i], p.memory[i].get()};
    }
    detail::SingleComputeThread one_thread;
    detail::check_dnnl(dnnl_primitive_execute(p.matmul.get(), stream(), count, args.data()),
                       "bf16 matmul");
    detail::check_dnnl(dnnl_stream_wait(stream()), "stream_wait");
  }

  // (rows, cols) of `type`, row-major with rows `ld` apart, or its transpose's view when
  // `transposed` (the stored array is (cols, rows) with rows ld apart).
  static dnnl_memory_desc_t desc(std::size_t rows, std::size_t cols, std::size_t ld,
                                 bool transposed, dnnl_data_type_t type) {
    dnnl_memory_desc_t d;
    const dnnl_dims_t dims{static_cast<dnnl_dim_t>(rows), static_cast<dnnl_dim_t>(cols)};
    const dnnl_dims_t strides{transposed ? 1 : static_cast<dnnl_dim_t>(ld),
                              transposed ? static_cast<dnnl_dim_t>(ld) : 1};
    detail::check_dnnl(dnnl_memory_desc_init_by_strides(&d, 2, dims, type, strides),
                       "memory_desc_init_by_strides");
    return d;
  }

  Primitive& primitive_for(const Bf16GemmShape& s) {
    const auto key = s.key();
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    if (cache_.size() >= max_cached) cache_.clear();
    const std::array<dnnl_memory_desc_t, 4> descs{
        desc(s.m, s.k, s.ld.lda, s.trans_a, dnnl_bf16),
        desc(s.k, s.n, s.ld.ldb, s.trans_b, dnnl_bf16), desc(1, s.n, s.n, false, dnnl_f32),
        desc(s.m, s.n, s.ld.ldc, false, s.c_is_float ? dnnl_f32 : dnnl_bf16)};
    dnnl_matmul_desc_t op;
    detail::check_dnnl(
        dnnl_matmul_desc_init(&op, &descs[0], &descs[1], s.bias ? &descs[2] : nullptr, &descs[3]),
        "matmul_desc_init");
    dnnl_primitive_attr_t attr = nullptr;
    detail::check_dnnl(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
    dnnl_post_ops_t post_ops = nullptr;
    dnnl_status_t status = dnnl_success;
    if (s.alpha != 1) status = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s.alpha);
    if (status == dnnl_success && s.beta != 0) {
      status = dnnl_post_ops_create(&post_ops);
      if (status == dnnl_success) status = dnnl_post_ops_append_sum(post_ops, s.beta);
      if (status == dnnl_success) status = dnnl_primitive_attr_set_post_ops(attr, post_ops);
    }
    dnnl_primitive_desc_t pd = nullptr;
    if (status == dnnl_success)
      status = dnnl_primitive_desc_create(&pd, &op, attr, engine(), nullptr);
    if (post_ops != nullptr) dnnl_post_ops_destroy(post_ops);
    dnnl_primitive_attr_destroy(attr);
    Primitive p;
    if (status == dnnl_success) {
      const char* impl = nullptr;
      dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
      p.name = impl != nullptr ? impl : "";
      // oneDNN's reference kernels are many times slower than widening to an fp32 GEMM
      if (!p.name.starts_with("ref")) {
        dnnl_primitive_t matmul = nullptr;
        status = dnnl_primitive_create(&matmul, pd);
        if (status == dnnl_success) p.matmul.reset(matmul);
      }
      dnnl_primitive_desc_destroy(pd);
    }
    if (p.matmul) {
      for (std::size_t i = 0; i < 4; ++i) {
        if (i == 2 && !s.bias) continue;
        dnnl_memory_t mem = nullptr;
        detail::check_dnnl(dnnl_memory_create(&mem, &descs[i], engine(), DNNL_MEMORY_NONE),
                           "memory_create");
        p.memory[i].reset(mem);
      }
    }
    return cache_.emplace(key, std::move(p)).first->second;
  }

  dnnl_engine_t engine() { return dnnl_.engine(); }
  dnnl_stream_t stream() { return dnnl_.stream(); }

  detail::DnnlEngine dnnl_;
  std::map<decltype(Bf16GemmShape{}.key()), Primitive> cache_;
#endif  // GPIPE_HOST_GEMM_REFERENCE
};

/// A bf16 GEMM split over a team as float GEMMs are (host::gemm_split: blocks of C's columns or
/// rows), each block on its own Bf16Gemm (a primitive cache is one thread's).
class SplitBf16Gemm {
 public:
  /// C = alpha op(A) op(B) + beta C (+ bias) of shape `s` over `threads` threads:
  /// run_blocks(units, split, f) calls f(first, count) over the blocks of the split, at once.
  template <class RunBlocks>
  void operator()(const Bf16GemmShape& s, const bf16* a, const bf16* b, const float* bias, void* c,
                  std::size_t threads, const RunBlocks& run_blocks) {
    const GemmSplit split = gemm_split(s.m, s.n, s.k, threads);
    if (gemms_.size() < split.parts) gemms_.resize(split.parts);
    if (split.parts <= 1) return gemms_[0](s, a, b, bias, c);
    const std::size_t c_size = s.c_is_float ? sizeof(float) : sizeof(bf16);
    run_blocks(split.by_columns ? s.n : s.m, split, [&](std::size_t first, std::size_t count) {
      Bf16GemmShape part = s;
      auto* c_bytes = static_cast<char*>(c);
      if (split.by_columns) {  // C(:, first..) = op(A) op(B)(:, first..) (+ bias(first..))
        part.n = count;
        gemms_[first / split.block](part, a, s.trans_b ? b + first * s.ld.ldb : b + first,
                                    s.bias ? bias + first : nullptr, c_bytes + first * c_size);
      } else {  // C(first.., :) = op(A)(first.., :) op(B)
        part.m = count;
        gemms_[first / split.block](part, s.trans_a ? a + first : a + first * s.ld.lda, b, bias,
                                    c_bytes + first * s.ld.ldc * c_size);
      }
    });
  }
  /// What runs a GEMM of shape `s` unsplit (Bf16Gemm::implementation).
  std::string implementation(const Bf16GemmShape& s) { return gemms_[0].implementation(s); }

 private:
  std::vector<Bf16Gemm> gemms_ = std::vector<Bf16Gemm>(1);  // one per block of a split GEMM
};

}  // namespace gpipe::host
