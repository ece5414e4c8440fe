// expect: satisfaction of .*backend<Backend>.* \[with Backend = NotABackend\]
// A Trainer's backend is checked against gpipe::backend (backend/concepts.hpp) where it is named:
// a type without streams, events and device memory is refused with the concept, not deep inside
// the executor.
#include <gpipe/gpipe.hpp>

struct NotABackend {
  std::size_t num_devices() const { return 1; }
};

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 2>>>;
using Broken = gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, NotABackend>;
Broken* use = nullptr;
