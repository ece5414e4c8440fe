// expect: layer_spec<Layers>.*NotALayer|NotALayer' does not satisfy 'layer_spec'
// A Stage accepts only layers (gpipe::layer) and width-generic layers: a type that is neither is
// rejected by the gpipe::layer_spec constraint where the Stage is named, not deep inside it.
#include <gpipe/model.hpp>

struct NotALayer {};

using Bad = gpipe::Stage<gpipe::Linear<4, 4>, NotALayer>;
