// expect: llama_heads_check<gpipe::detail::width<24>, gpipe::detail::heads<6>, gpipe::detail::kv_heads<4> >.*heads H must be a multiple of its key/value heads KVH
// A LlamaBlock's query heads share key/value heads in equal groups, so H must be a multiple of
// KVH: 6 heads over 4 key/value heads is refused, the error naming D, H and KVH.
#include <gpipe/model.hpp>

using Model = gpipe::Pipeline<
    gpipe::Stage<gpipe::TokenEmbedding<10, 4, 24>, gpipe::LlamaBlock<24, 6, 4, 32>>>;
static_assert(Model::num_stages == 1);
