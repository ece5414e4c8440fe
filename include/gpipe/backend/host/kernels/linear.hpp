#pragma once
// A Linear layer's forward as one oneDNN matmul primitive with the bias fused into it:
//   y (rows, out) = x (rows, in) W^T + b,   W (out, in) row-major, read in place (no copy).
// It is faster than dnnl_sgemm followed by a bias pass, most for micro-batches of few rows
// (bench_host_kernels, BM_LinearForward; BENCHMARKS.md has the times).
//
// A primitive is created once per (rows, in, out) and kept (JIT code: creating one costs far
// more than running it); a micro-batch split gives each Linear at most two row counts. Every
// primitive computes in fp32 (fpmath mode strict, never a silent bf16) on the calling thread
// alone. One LinearForward per kernel context, so per device: no locking.
// Written against oneDNN's C API: its C++ header stops nvcc's front end (CUDA 13, C++20), and
// this header is part of every translation unit that uses the host backend, .cu files included.

#ifndef GPIPE_HOST_GEMM_REFERENCE

#include <oneapi/dnnl/dnnl.h>

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>

#include "gpipe/backend/host/kernels/gemm.hpp"
#include "gpipe/error.hpp"

namespace gpipe::detail {

inline void check_dnnl(dnnl_status_t status, const char* what) {
  if (status != dnnl_success)
    throw Error(std::string("gpipe: oneDNN ") + what + " failed (status " +
                std::to_string(static_cast<int>(status)) + ")");
}

// Owning handles of oneDNN's C objects.
struct DnnlDeleter {
  void operator()(dnnl_engine_t p) const { dnnl_engine_destroy(p); }
  void operator()(dnnl_stream_t p) const { dnnl_stream_destroy(p); }
  void operator()(dnnl_primitive_t p) const { dnnl_primitive_destroy(p); }
  void operator()(dnnl_memory_t p) const { dnnl_memory_destroy(p); }
};
template <class Handle>
using DnnlPtr = std::unique_ptr<std::remove_pointer_t<Handle>, DnnlDeleter>;

// A oneDNN CPU engine and an in-order stream on it, each made on first use: what a primitive
// cache of one thread (one kernel context) runs its primitives on.
class DnnlEngine {
 public:
  dnnl_engine_t engine() {
    if (!engine_) {
      dnnl_engine_t e = nullptr;
      check_dnnl(dnnl_engine_create(&e, dnnl_cpu, 0), "engine_create");
      engine_.reset(e);
    }
    return engine_.get();
  }
  dnnl_stream_t stream() {
    if (!stream_) {
      dnnl_stream_t s = nullptr;
      check_dnnl(dnnl_stream_create(&s, engine(), dnnl_stream_default_flags), "stream_create");
      stream_.reset(s);
    }
    return stream_.get();
  }

 private:
  DnnlPtr<dnnl_engine_t> engine_;
  DnnlPtr<dnnl_stream_t> stream_;
};

}  // namespace gpipe::detail

namespace gpipe::host {

/// A Linear layer's forward in one oneDNN matmul with the bias fused, a primitive kept per
/// shape (see the top of this file). One per float kernel context, so per device: not
/// thread-safe.
class LinearForward {
 public:
  /// Past this many shapes the cache starts over, so that a caller cycling through many batch
  /// sizes does not keep a primitive for each.
  static constexpr std::size_t max_cached = 64;

  /// y (rows, out) = x (rows, in) W^T + b (out), W (out, in) row-major; y overwritten, in fp32.
  /// The first call with a shape creates its primitive; throws `gpipe::Error` if oneDNN fails.
  void operator()(std::size_t rows, std::size_t in, std::size_t out, const float* x, const float* w,
                  const float* b, float* y) {
    Shape& shape = shape_for(rows, in, out);
    const std::array<const float*, 4> data{x, w, b, y};
    std::array<dnnl_exec_arg_t, 4> args{};
    for (std::size_t i = 0; i < 4; ++i) {
      detail::check_dnnl(
          dnnl_memory_set_data_handle(shape.memory[i].get(), const_cast<float*>(data[i])),
          "memory_set_data_handle");
      args[i] = {arg_ids[i], shape.memory[i].get()};
    }
    detail::SingleComputeThread one_thread;
    detail::check_dnnl(dnnl_primitive_execute(shape.matmul.get(), stream(), 4, args.data()),
                       "matmul");
    detail::check_dnnl(dnnl_stream_wait(stream()), "stream_wait");
  }

 private:
  static constexpr std::array<int, 4> arg_ids{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS,
                                              DNNL_ARG_DST};

  struct Shape {
    detail::DnnlPtr<dnnl_primitive_t> matmul;
    std::array<detail::DnnlPtr<dnnl_memory_t>, 4> memory;  ///< x, W^T, b, y; data set per call
  };

  static dnnl_memory_desc_t desc(std::size_t rows, std::size_t cols, dnnl_format_tag_t layout) {
    dnnl_memory_desc_t d;
    const dnnl_dims_t dims{static_cast<dnnl_dim_t>(rows), static_cast<dnnl_dim_t>(cols)};
    detail::check_dnnl(dnnl_memory_desc_init_by_tag(&d, 2, dims, dnnl_f32, layout),
                       "memory_desc_init");
    return d;
  }

  dnnl_engine_t engine() { return dnnl_.engine(); }
  dnnl_stream_t stream() { return dnnl_.stream(); }

  Shape& shape_for(std::size_t rows, std::size_t in, std::size_t out) {
    const auto key = std::make_tuple(rows, in, out);
    if (auto it = shapes_.find(key); it != shapes_.end()) return it->second;
    if (shapes_.size() >= max_cached) shapes_.clear();
    // W^T (in, out) is read from W (out, in) as its transpose: format ba.
    const std::array<dnnl_memory_desc_t, 4> descs{desc(rows, in, dnnl_ab), desc(in, out, dnnl_ba),
                                                  desc(1, out, dnnl_ab), desc(rows, out, dnnl_ab)};
    dnnl_matmul_desc_t op;
    detail::check_dnnl(dnnl_matmul_desc_init(&op, &descs[0], &descs[1], &descs[2], &descs[3]),
                       "matmul_desc_init");
    dnnl_primitive_attr_t attr = nullptr;
    detail::check_dnnl(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
    dnnl_primitive_desc_t pd = nullptr;
    dnnl_status_t status = dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_strict);
    if (status == dnnl_success)
      status = dnnl_primitive_desc_create(&pd, &op, attr, engine(), nullptr);
    dnnl_primitive_attr_destroy(attr);
    detail::check_dnnl(status, "matmul primitive_desc_create");
    dnnl_primitive_t matmul = nullptr;
    status = dnnl_primitive_create(&matmul, pd);
    dnnl_primitive_desc_destroy(pd);
    detail::check_dnnl(status, "matmul primitive_create");
    Shape shape;
    shape.matmul.reset(matmul);
    for (std::size_t i = 0; i < 4; ++i) {
      dnnl_memory_t m = nullptr;
      detail::check_dnnl(dnnl_memory_create(&m, &descs[i], engine(), DNNL_MEMORY_NONE),
                         "memory_create");
      shape.memory[i].reset(m);
    }
    return shapes_.emplace(key, std::move(shape)).first->second;
  }

  detail::DnnlEngine dnnl_;
  std::map<std::tuple<std::size_t, std::size_t, std::size_t>, Shape> shapes_;
};

}  // namespace gpipe::host

#endif  // GPIPE_HOST_GEMM_REFERENCE
