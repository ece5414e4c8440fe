// expect: out_features<4>, gpipe::detail::in_features<8>
// y = x + f(x) needs f to keep the width: the body Linear<8, 4> turns 8 features into 4. The
// error names both sizes.
#include <gpipe/model.hpp>

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Residual<gpipe::Linear<8, 4>>>>;
static_assert(Model::num_stages == 1);
