// expect: a layer needs static constexpr std::size_t grad_stash_per_row
// A user's layer that lacks one member (here grad_stash_per_row), used in a Stage: the error
// names the missing member where the Stage is named, not only "layer_spec evaluated to false".
#include <gpipe/model.hpp>

struct AlmostALayer : gpipe::ParameterFree {
  static constexpr std::size_t in_features = 4, out_features = 4;
  static constexpr std::size_t stash_per_row = 0;
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

using Bad = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 4>, AlmostALayer>>;
static_assert(Bad::num_stages == 1);
