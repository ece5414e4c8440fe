// expect: needs token samples.*sequence_layer_needs_tokens<gpipe::TransformerBlock<8, 2>, 0>
// A Transformer block acts on whole samples of T tokens, which only a pipeline that starts with
// Embedding<V, T, D> has; in an MLP the error says so and names the block.
#include <gpipe/model.hpp>

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 8>, gpipe::TransformerBlock<8, 2>>>;
static_assert(Model::num_stages == 1);
