// expect: out_features<16>, gpipe::detail::in_features<15>, gpipe::detail::at_stage_layer<0, 1>
// Within a stage, a layer's output width must be the next layer's input width: Linear<8, 16>
// produces 16 features but Linear<15, 4> takes 15. The error names both sizes and where: stage 0,
// layer 1.
#include <gpipe/model.hpp>

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<8, 16>, gpipe::Linear<15, 4>>>;
static_assert(Model::num_stages == 1);
