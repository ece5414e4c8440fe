// Every schedule on the host backend gives the GPipe schedule's loss and gradients (the
// backend-conformance suite of tests/support/conformance_schedules.hpp), interleaved stages
// are placed round robin, for training and for inference, and a backend whose transport has
// rendezvous sends runs the schedule ordered for them (schedule/rendezvous.hpp). A step's
// bubble breaks down into the schedule's own, the stages' imbalance and the executor's overhead.

#include <doctest/doctest.h>

#if defined(__linux__)
#include <sched.h>
#endif

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "support/conformance_schedules.hpp"
#include "support/host_factory.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;
using namespace gpipe::test;

// The host backend, declaring what a transport between processes would: a send completes only
// with its recv. The hand-over itself stays the in-process copy.
struct RendezvousInProcess : transport::InProcessHandOver {
  static constexpr Sends sends = Sends::rendezvous;
};
class RendezvousHost : public host::Backend {
 public:
  using host::Backend::Backend;
  using hand_over = RendezvousInProcess;
};

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

TEST_CASE("ZB-V and DualPipeV place stages in a V: device d runs stages d and 2K-1-d") {
  host::Backend backend(2);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, ZeroBubbleV> trainer(
      backend, {.micro_batches = 4, .seed = conformance::schedule_seed});
  CHECK(trainer.num_devices == 2);
  CHECK(trainer.schedule().placement == Placement::v_shape);
  const std::size_t device_of[4] = {0, 1, 1, 0};
  for (std::size_t s = 0; s < 4; ++s) CHECK(trainer.device_of_stage(s) == device_of[s]);
  // Parameters of stages 0 and 3 live on device 0, of stages 1 and 2 on device 1.
  std::size_t on_device[2] = {};
  for (std::size_t s = 0; s < 4; ++s) on_device[device_of[s]] += Model4::stage_num_params[s];
  for (std::size_t d = 0; d < 2; ++d)
    CHECK(backend.memory_stats(d).current == 2 * sizeof(float) * on_device[d]);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend, DualPipeV> dual(
      backend, {.micro_batches = 4, .seed = conformance::schedule_seed});
  for (std::size_t s = 0; s < 4; ++s) CHECK(dual.device_of_stage(s) == device_of[s]);
  // inference follows the V too, and gives GPipe's outputs
  const std::vector<float> x = random_inputs(conformance::schedule_rows, Model4::in_features, 3);
  host::Backend gpipe_backend(4);
  Trainer<Model4, SoftmaxCrossEntropy, host::Backend> gpipe_trainer(
      gpipe_backend, {.micro_batches = 4, .seed = conformance::schedule_seed});
  CHECK(trainer.predict(x) == gpipe_trainer.predict(x));
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

TEST_CASE("a transport with rendezvous sends gets the schedule ordered for them, same results") {
  static_assert(backend<RendezvousHost>);
  const std::vector<float> x = random_inputs(conformance::schedule_rows, Model4::in_features, 3);
  const std::vector<std::int32_t> y =
      random_classes(conformance::schedule_rows, Model4::out_features, 11);
  for (std::size_t m : {3u, 8u}) {
    CAPTURE(m);
    host::Backend buffered_backend(2);
    RendezvousHost rendezvous_backend(2);
    Trainer<Model4, SoftmaxCrossEntropy, host::Backend, Interleaved<2>> buffered(
        buffered_backend, {.micro_batches = m, .seed = conformance::schedule_seed});
    Trainer<Model4, SoftmaxCrossEntropy, RendezvousHost, Interleaved<2>> rendezvous(
        rendezvous_backend, {.micro_batches = m, .seed = conformance::schedule_seed});
    const Schedule generated = Interleaved<2>::make(2, m);
    CHECK(buffered.schedule() == generated);
    CHECK_FALSE(validate(generated, Sends::rendezvous).ok);  // K = 2, V = 2, M >= 3 needs it
    CHECK(rendezvous.schedule() == order_for_rendezvous(generated));
    CHECK(validate(rendezvous.schedule(), Sends::rendezvous).ok);
    // the compute ops run in the same order: bit for bit the same step
    CHECK(rendezvous.forward_backward(x, y) == buffered.forward_backward(x, y));
    CHECK(gradients_of(rendezvous) == gradients_of(buffered));
  }
}

TEST_CASE("bubble_breakdown: the schedule's own bubble from the simulator, the rest overhead") {
  host::Backend backend(2);
  Trainer<Model2, SoftmaxCrossEntropy, host::Backend, GPipe> trainer(backend, {.micro_batches = 4});
  CHECK(trainer.bubble_breakdown().mean_op_us == 0);  // no step yet: nothing to break down
  (void)trainer.forward_backward(random_inputs(16, Model2::in_features, 1),
                                 random_classes(16, Model2::out_features, 2));
  const auto why = trainer.bubble_breakdown();
  CHECK(why.measured == trainer.last_step().bubble_fraction);
  CHECK(why.schedule == doctest::Approx(simulate(trainer.schedule()).bubble_fraction));
  CHECK(why.schedule == doctest::Approx(1.0 / 5));  // (K - 1) / (M + K - 1)
  REQUIRE(why.device_op_us.size() == 2);
  const std::vector<OpCosts> per_device{
      {why.device_op_us[0], why.device_op_us[0], why.device_op_us[0]},
      {why.device_op_us[1], why.device_op_us[1], why.device_op_us[1]}};
  CHECK(why.imbalance ==
        doctest::Approx(simulate(trainer.schedule(), per_device).bubble_fraction - why.schedule));
  CHECK(why.overhead == doctest::Approx(why.measured - why.schedule - why.imbalance));
  CHECK(why.busy_devices == 2);
  CHECK(why.mean_op_us > 0);
  CHECK(why.device_op_us[0] > 0);
  CHECK(why.device_op_us[1] > 0);
  CHECK(why.devices_share_cores == (host::usable_cores() == 1));
}

TEST_CASE("bubble_breakdown: devices share cores when devices x threads_per_device exceed them") {
  const unsigned cores = host::usable_cores();
  for (std::size_t threads : {1u, 2u, 3u}) {
    INFO("threads per device ", threads, ", cores ", cores);
    host::Backend backend(2, {.threads_per_device = threads});
    Trainer<Model2, SoftmaxCrossEntropy, host::Backend, GPipe> trainer(backend,
                                                                       {.micro_batches = 4});
    (void)trainer.forward_backward(random_inputs(16, Model2::in_features, 1),
                                   random_classes(16, Model2::out_features, 2));
    const auto why = trainer.bubble_breakdown();
    REQUIRE(why.busy_devices == 2);
    CHECK(why.devices_share_cores == (cores != 0 && 2 * threads > cores));
  }
}

#if defined(__linux__)
TEST_CASE("usable_cores and devices_share_cores follow the affinity mask, not the machine") {
  // What mpirun does to each rank by default: the process may run on one core only.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof(mine), &mine) == 0);
  const unsigned all = host::usable_cores();
  CHECK(all == static_cast<unsigned>(CPU_COUNT(&mine)));
  host::Backend backend(2);  // its workers keep the whole mask
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mine)) {
      CPU_SET(cpu, &one);
      break;
    }
  REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
  const unsigned pinned = host::usable_cores();
  const bool two_share = backend.devices_share_cores(2),
             one_shares = backend.devices_share_cores(1);
  REQUIRE(sched_setaffinity(0, sizeof(mine), &mine) == 0);  // before any CHECK can stop the test
  CHECK(pinned == 1);
  CHECK(two_share);
  CHECK_FALSE(one_shares);
  CHECK(host::usable_cores() == all);
  CHECK(backend.devices_share_cores(2) == (all < 2));
}
#endif

TEST_CASE("bubble_breakdown: uneven stages show as imbalance, not as executor overhead") {
  // The timings of a GPipe step on K = 2, M = 4 whose stage 1 takes 25 times stage 0's time
  // per op, as the simulator runs it: given, not measured, so that the breakdown, a function of
  // the timings and the schedule, is checked on exact numbers.
  const Schedule schedule = GPipe::make(2, 4);
  const std::vector<OpCosts> per_device{{10, 10, 10}, {250, 250, 250}};
  const SimulationResult ran = simulate(schedule, per_device);
  std::vector<ComputeTiming> devices;
  for (std::size_t d = 0; d < 2; ++d)
    devices.push_back({.busy_us = ran.busy[d],
                       .first_start_us = ran.start[d].front(),
                       .last_end_us = ran.finish[d].back(),
                       .ops = 12});
  const StepStats step = step_stats(devices, 2);
  CHECK(step.makespan_us == ran.makespan);
  CHECK(step.busy_us == 12 * 10 + 12 * 250);
  CHECK(step.bubble_fraction == doctest::Approx(ran.bubble_fraction));
  const BubbleBreakdown why = bubble_breakdown(schedule, step);
  REQUIRE(why.device_op_us.size() == 2);
  CHECK(why.device_op_us[0] == 10);
  CHECK(why.device_op_us[1] == 250);
  CHECK(why.mean_op_us == 130);
  CHECK(why.busy_devices == 2);
  CHECK(why.schedule == doctest::Approx(1.0 / 5));
  // Device 0 idles while device 1 works: nearly half the devices' time, over the schedule's
  // 20 %, all of it imbalance and none the executor's.
  CHECK(why.imbalance == doctest::Approx(ran.bubble_fraction - 0.2));
  CHECK(why.imbalance > 0.25);
  CHECK(why.overhead == doctest::Approx(0).epsilon(1e-12));

  // An untimed step has nothing to break down; a third device's timing is not the pipeline's.
  CHECK(bubble_breakdown(schedule, step_stats({}, 2)).mean_op_us == 0);
  devices.push_back({.busy_us = 5, .first_start_us = 0, .last_end_us = 99999, .ops = 1});
  CHECK(step_stats(devices, 2).makespan_us == ran.makespan);
  CHECK(step_stats(devices, 2).devices.size() == 2);
}
