// expect: token_count_check<gpipe::detail::model_tokens<4>, gpipe::detail::layer_tokens<8>
// A layer that fixes its tokens per sample must agree with the model's Embedding: the model has
// T = 4, the layer 8. The error names both as token_count_check<model_tokens<4>,
// layer_tokens<8>>.
#include <gpipe/model.hpp>

// An identity layer of width 16 for samples of 8 tokens.
struct EightTokens : gpipe::ParameterFree {
  static constexpr std::size_t in_features = 16, out_features = 16;
  static constexpr std::size_t stash_per_row = 0, grad_stash_per_row = 0;
  static constexpr std::size_t tokens_per_sample = 8;
  template <class Ctx>
  static void forward(Ctx& ctx, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 16, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx,
                             const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 16, a.dy, a.dx);
  }
};

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Embedding<10, 4, 16>>, gpipe::Stage<EightTokens>>;
static_assert(Model::num_stages == 2);
