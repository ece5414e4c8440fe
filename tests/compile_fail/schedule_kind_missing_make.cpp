// expect: a schedule kind needs static Schedule make
// A user's schedule tag without its generator, given to a Trainer: the error names the missing
// piece (gpipe::schedule_kind, schedule/kind.hpp) where the Trainer is named.
#include <cstddef>
#include <gpipe/gpipe.hpp>
#include <string_view>

struct MySchedule {
  static constexpr std::size_t chunks_per_device = 1;
  static constexpr std::string_view name = "mine";
};

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 2>>>;
using Broken = gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend, MySchedule>;
void use(Broken* trainer) { (void)trainer->options(); }
