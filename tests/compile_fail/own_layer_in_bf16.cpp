// expect: Scale<N>::forward.*Ctx = gpipe::host::KernelContext<gpipe::bf16>
// A user's own layer (examples/own_layer: kernels written for host::Kernels<T>, reading weights
// of the activations' type T) in a MixedBf16 model: refused at compile time, the error naming
// the layer's op and the bf16 context (its weights are float there, its activations bf16). It
// is not run in fp32 behind the user's back; kernels for host::Kernels<bf16> (bf16 x and y,
// float weights) make it run.
#include <gpipe/gpipe.hpp>

struct ScaleOp {};

template <class T>
struct gpipe::LayerKernels<ScaleOp, gpipe::host::Kernels<T>> {
  static void forward(gpipe::host::Kernels<T>&, std::size_t rows, std::size_t n, const T* x,
                      const T* w, T* y) {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < n; ++j) y[r * n + j] = x[r * n + j] * w[j];
  }
  static void backward_weight(gpipe::host::Kernels<T>&, std::size_t, std::size_t, const T*,
                              const T*, T*) {}
};

template <std::size_t N>
struct Scale {
  static constexpr std::size_t in_features = N, out_features = N, num_params = N;
  static constexpr std::size_t stash_per_row = 0, grad_stash_per_row = 0;
  static constexpr std::array<gpipe::ParamSpec, 1> param_specs() {
    return {gpipe::ParamSpec{.name = "weight", .shape = {N, 0}, .rank = 1}};
  }
  static void init(std::span<float> p, gpipe::Rng&) { std::ranges::fill(p, 1.0f); }
  template <class Ctx>
  static void forward(Ctx& k, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    gpipe::LayerKernels<ScaleOp, Ctx>::forward(k, a.rows, N, a.x, a.params, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& k, const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    gpipe::LayerKernels<ScaleOp, Ctx>::forward(k, a.rows, N, a.dy, a.params, a.dx);
  }
  template <class Ctx>
  static void backward_weight(Ctx& k,
                              const gpipe::BackwardWeightArgs<typename Ctx::value_type>& a) {
    gpipe::LayerKernels<ScaleOp, Ctx>::backward_weight(k, a.rows, N, a.x, a.dy, a.grads);
  }
};

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 4>, Scale<4>>>;
void train(gpipe::host::Backend& backend, std::span<const float> x, std::span<const float> y) {
  gpipe::Trainer<Model, gpipe::MSELoss, gpipe::host::Backend, gpipe::GPipe, gpipe::MixedBf16>
      trainer(backend, {});
  trainer.forward_backward(x, y);
}
