// Every schedule on the host backend gives the GPipe schedule's loss and gradients (the
// backend-conformance suite of tests/support/conformance_schedules.hpp), and interleaved stages
// are placed round robin, for training and for inference.

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/conformance_schedules.hpp"
#include "support/host_factory.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

}  // namespace

TEST_CASE_TEMPLATE_APPLY(conformance_schedules, conformance::ScheduleCases<HostFactory>);

TEST_CASE("a trainer places interleaved stages on devices round robin") {
  host::Backend backend(2);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, Interleaved<2>> trainer(
      backend, {.micro_batches = 3, .seed = conformance::schedule_seed});
  CHECK(trainer.num_devices == 2);
  CHECK(trainer.schedule().num_chunks == 2);
  for (std::size_t s = 0; s < 4; ++s) CHECK(trainer.device_of_stage(s) == s % 2);
  // Parameters of stages 0 and 2 live on device 0, of stages 1 and 3 on device 1.
  std::size_t on_device[2] = {};
  for (std::size_t s = 0; s < 4; ++s) on_device[s % 2] += Model4::stage_num_params[s];
  for (std::size_t d = 0; d < 2; ++d)
    CHECK(backend.memory_stats(d).current == 2 * sizeof(float) * on_device[d]);
}

TEST_CASE("inference follows the interleaved placement and matches GPipe's") {
  const std::vector<float> x = random_inputs(conformance::schedule_rows, Model4::in_features, 3);
  host::Backend gpipe_backend(4);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend> gpipe_trainer(
      gpipe_backend, {.micro_batches = 4, .seed = conformance::schedule_seed});
  host::Backend backend(2);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, Interleaved<2>> trainer(
      backend, {.micro_batches = 4, .seed = conformance::schedule_seed});
  CHECK(trainer.predict(x) == gpipe_trainer.predict(x));
}
