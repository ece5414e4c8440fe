// expect: not a layer: it needs static constexpr std::size_t in_features and out_features
// A Stage accepts only layers (gpipe::layer), width-generic and sequence layers: a type that is
// none of them is rejected where the Stage is named, with what it lacks (in_features and
// out_features), not deep inside the pipeline.
#include <gpipe/model.hpp>

struct NotALayer {};

using Bad = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 4>, NotALayer>>;
static_assert(Bad::num_stages == 1);
