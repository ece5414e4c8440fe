#pragma once
// A Linear layer's forward as one oneDNN matmul primitive with the bias fused into it:
//   y (rows, out) = x (rows, in) W^T + b,   W (out, in) row-major, read in place (no copy).
// Against dnnl_sgemm followed by a bias pass it is a few to ten percent faster, most for
// micro-batches of few rows (bench_host_kernels, BM_LinearForward; BENCHMARKS.md).
//
// A primitive is created once per (rows, in, out) and kept (JIT code: creating one costs far
// more than running it); a micro-batch split gives each Linear at most two row counts. Every
// primitive computes in fp32 (fpmath mode strict, never a silent bf16) on the calling thread
// alone. One LinearForward per kernel context, so per device: no locking.

#ifndef GPIPE_HOST_GEMM_REFERENCE

#include <cstddef>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "gpipe/backend/host/kernels/gemm.hpp"

namespace gpipe::host {

class LinearForward {
 public:
  // Past this many shapes the cache starts over, so that a caller cycling through many batch
  // sizes does not keep a primitive for each.
  static constexpr std::size_t max_cached = 64;

  void operator()(std::size_t rows, std::size_t in, std::size_t out, const float* x, const float* w,
                  const float* b, float* y) {
    const Shape& shape = shape_for(rows, in, out);
    detail::SingleComputeThread one_thread;
    shape.matmul.execute(stream_, {{DNNL_ARG_SRC, memory(shape.x, x)},
                                   {DNNL_ARG_WEIGHTS, memory(shape.w, w)},
                                   {DNNL_ARG_BIAS, memory(shape.b, b)},
                                   {DNNL_ARG_DST, memory(shape.y, y)}});
  }

 private:
  using tag = dnnl::memory::format_tag;

  struct Shape {
    dnnl::memory::desc x, w, b, y;
    dnnl::matmul matmul;
  };

  static dnnl::memory::desc desc(std::size_t rows, std::size_t cols, tag layout) {
    return {{static_cast<dnnl::memory::dim>(rows), static_cast<dnnl::memory::dim>(cols)},
            dnnl::memory::data_type::f32,
            layout};
  }
  dnnl::memory memory(const dnnl::memory::desc& d, const float* p) {
    return {d, engine_, const_cast<float*>(p)};  // oneDNN's handles are not const-aware
  }

  const Shape& shape_for(std::size_t rows, std::size_t in, std::size_t out) {
    const auto key = std::make_tuple(rows, in, out);
    if (auto it = shapes_.find(key); it != shapes_.end()) return it->second;
    if (shapes_.size() >= max_cached) shapes_.clear();
    Shape s;
    s.x = desc(rows, in, tag::ab);
    s.w = desc(in, out, tag::ba);  // W^T (in, out), read from W (out, in) as its transpose
    s.b = desc(1, out, tag::ab);
    s.y = desc(rows, out, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
    s.matmul = dnnl::matmul(
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(s.x, s.w, s.b, s.y), attr, engine_));
    return shapes_.emplace(key, std::move(s)).first->second;
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<std::tuple<std::size_t, std::size_t, std::size_t>, Shape> shapes_;
};

}  // namespace gpipe::host

#endif  // GPIPE_HOST_GEMM_REFERENCE
