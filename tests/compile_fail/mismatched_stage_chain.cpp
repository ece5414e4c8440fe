// expect: out_features<16>, gpipe::detail::in_features<12>, gpipe::detail::at_stage_layer<1, 0>
// A stage's output width must be the next stage's input width: stage 0 produces 16 features but
// stage 1 takes 12. The error names both sizes and where, stage 1's first layer, as
// feature_chain_check<out_features<16>, in_features<12>, at_stage_layer<1, 0>>.
#include <gpipe/model.hpp>

using Model =
    gpipe::Pipeline<gpipe::Stage<gpipe::Linear<8, 16>>, gpipe::Stage<gpipe::Linear<12, 4>>>;
static_assert(Model::num_stages == 2);
