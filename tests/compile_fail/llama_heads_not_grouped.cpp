// expect: llama_heads_check<.*width<24>.*heads<6>.*kv_heads<4> >.*multiple of its key/value heads
// A LlamaBlock's query heads share key/value heads in equal groups, so H must be a multiple of
// KVH: 6 heads over 4 key/value heads is refused, the error naming D, H and KVH.
#include <gpipe/model.hpp>

using Model = gpipe::Pipeline<
    gpipe::Stage<gpipe::TokenEmbedding<10, 4, 24>, gpipe::LlamaBlock<24, 6, 4, 32>>>;
static_assert(Model::num_stages == 1);
