// libFuzzer target: the host executor on schedules the validator accepts. A built-in schedule
// (the first bytes pick the kind, K 2 or 3 and M 1-4) is mutated by the rest
// (schedule_mutations.hpp, without the mutations no runnable schedule has), then given to a Trainer
// (Options::schedule). A schedule the validator rejects must make the Trainer throw gpipe::Error;
// one it accepts must run a forward_backward to the end (no hang, no crash) with the loss and every
// gradient of the unmutated schedule, within float rounding of a different summation order. A
// crash, a sanitizer report, a hang or a difference (a trap) is a finding. Built and run by
// scripts/fuzz.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/plan.hpp"
#include "schedule_mutations.hpp"
#include "support/models.hpp"
#include "support/reference_model.hpp"

namespace {

using namespace gpipe;

using Hidden = Stage<Linear<8, 8>, GELU>;
using Last = Stage<Linear<8, 8>, GELU, Linear<8, 5>>;
template <std::size_t... I>
Pipeline<std::conditional_t<true, Hidden, std::integral_constant<std::size_t, I>>..., Last> chain(
    std::index_sequence<I...>);
// S stages: S - 1 hidden ones and the classifier.
template <std::size_t S>
using Chain = decltype(chain(std::make_index_sequence<S - 1>{}));

using fuzz::check;

// Whether building trainer type T with `schedule` throws gpipe::Error.
template <class T>
bool trainer_refuses(host::Backend& backend, const Schedule& schedule, std::size_t m) {
  try {
    T trainer(backend, {.micro_batches = m, .seed = 1, .schedule = schedule});
  } catch (const Error&) {
    return true;
  }
  return false;
}

template <std::size_t K, std::size_t V>
void run(host::Backend& backend, const Schedule& original, const Schedule& mutated) {
  using T = Trainer<Chain<K * V>, SoftmaxCrossEntropy, host::Backend, PlannedSchedule<V>>;
  constexpr std::size_t rows = 12;
  const std::vector<float> x = test::random_inputs(rows, 8, 3);
  const std::vector<std::int32_t> y = test::random_classes(rows, 5, 4);
  const std::size_t m = original.num_micro_batches;
  if (!validate(mutated).ok) {
    check(trainer_refuses<T>(backend, mutated, m));
    return;
  }
  T reference(backend, {.micro_batches = m, .seed = 1, .schedule = original});
  T trainer(backend, {.micro_batches = m, .seed = 1, .schedule = mutated});
  const float loss = trainer.forward_backward(x, y);
  check(std::abs(loss - reference.forward_backward(x, y)) <= 1e-6f * std::max(1.0f, loss));
  const test::NamedTensors want = test::gradients_of(reference), got = test::gradients_of(trainer);
  for (const auto& [name, g] : want) {
    const std::vector<double>& h = got.at(name);
    check(h.size() == g.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      check(std::abs(h[i] - g[i]) <= 1e-5 * std::max(1.0, std::abs(g[i])));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static host::Backend two(2), three(3);
  if (size < 3) return 0;
  const std::size_t chunks = 1 + (data[0] >> 2) % 2, k = 2 + data[1] % 2, m = 1 + data[2] % 4;
  Schedule original;
  try {
    original = fuzz::built_in_schedule(data[0] % 4 + (chunks == 2 ? 4 : 0), k, m);
  } catch (const Error&) {  // a kind that needs more micro-batches
    return 0;
  }
  Schedule mutated = original;
  fuzz::mutate_schedule(mutated, data + 3, size - 3, /*wild=*/false);
  if (k == 2 && chunks == 1) run<2, 1>(two, original, mutated);
  if (k == 2 && chunks == 2) run<2, 2>(two, original, mutated);
  if (k == 3 && chunks == 1) run<3, 1>(three, original, mutated);
  if (k == 3 && chunks == 2) run<3, 2>(three, original, mutated);
  return 0;
}
