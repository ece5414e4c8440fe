#pragma once
// A layer written outside the library, as a user writes one: Scale<N>, y = x * w with one learned
// weight per feature (CaiT's LayerScale; LayerNorm's gain without the normalization). Its three
// ops call the kernels of the tag ScaleOp, which each backend gets from a LayerKernels
// specialization: scale_host.hpp (plain loops) and scale_cuda.cuh (CUDA kernels). The README's
// "Your own layer" quotes this file.

#include <algorithm>
#include <array>
#include <cstddef>
#include <gpipe/core.hpp>
#include <span>

// The tag that names Scale's kernels: LayerKernels<ScaleOp, Ctx> on each backend.
struct ScaleOp {};

template <std::size_t N>
struct Scale {
  static constexpr std::size_t in_features = N, out_features = N, num_params = N;
  static constexpr std::size_t stash_per_row = 0, grad_stash_per_row = 0;  // backward reads x

  static constexpr std::array<gpipe::ParamSpec, 1> param_specs() {
    return {gpipe::ParamSpec{.name = "weight", .shape = {N, 0}, .rank = 1}};
  }
  static void init(std::span<float> p, gpipe::Rng&) { std::ranges::fill(p, 1.0f); }

  template <class Ctx>  // y(rows, N) = x * w
  static void forward(Ctx& k, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    gpipe::LayerKernels<ScaleOp, Ctx>::forward(k, a.rows, N, a.x, a.params, a.y);
  }
  template <class Ctx>  // dx(rows, N) = dy * w
  static void backward_input(Ctx& k, const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    gpipe::LayerKernels<ScaleOp, Ctx>::forward(k, a.rows, N, a.dy, a.params, a.dx);
  }
  template <class Ctx>  // dw(N) += sum over rows of dy * x: W accumulates
  static void backward_weight(Ctx& k,
                              const gpipe::BackwardWeightArgs<typename Ctx::value_type>& a) {
    gpipe::LayerKernels<ScaleOp, Ctx>::backward_weight(k, a.rows, N, a.x, a.dy, a.grads);
  }
};
