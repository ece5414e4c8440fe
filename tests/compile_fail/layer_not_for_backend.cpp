// expect: a layer needs static backward_weight\(Ctx&, const BackwardWeightArgs<T>&\) callable
// A layer with every compile-time member but no backward_weight (and not derived from
// gpipe::ParameterFree): the Trainer names the missing operation when it is declared, not deep
// inside the first forward_backward.
#include <gpipe/gpipe.hpp>

struct NoWeightGradient {
  static constexpr std::size_t in_features = 4, out_features = 4, num_params = 0;
  static constexpr std::size_t stash_per_row = 0, grad_stash_per_row = 0;
  static constexpr std::array<gpipe::ParamSpec, 0> param_specs() { return {}; }
  static void init(std::span<float>, gpipe::Rng&) {}
  template <class Ctx>
  static void forward(Ctx& ctx, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 4, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx,
                             const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 4, a.dy, a.dx);
  }
};

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 4>>, gpipe::Stage<NoWeightGradient>>;
using Bad = gpipe::Trainer<Model, gpipe::MSELoss, gpipe::host::Backend>;
static_assert(sizeof(Bad) > 0);
