// expect: llama_heads_check<.*width<20>.*heads<8>.*width D must be a multiple of its heads H
// A LlamaBlock's head size is D / H: D = 20 over H = 8 heads is refused, the error naming them.
#include <gpipe/model.hpp>

using Model = gpipe::Pipeline<
    gpipe::Stage<gpipe::TokenEmbedding<10, 4, 20>, gpipe::LlamaBlock<20, 8, 2, 32>>>;
static_assert(Model::num_stages == 1);
