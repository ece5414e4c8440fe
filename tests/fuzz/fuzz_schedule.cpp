// libFuzzer target: the schedule validator against the simulator. A built-in schedule (the first
// bytes pick the kind, K and M) is mutated by the rest (ops swapped, moved to another device,
// dropped, repeated, given another kind, micro-batch or chunk; the placement flipped). Then:
// validate() and describe() never crash, with buffered and with rendezvous sends (neither implies
// the other: a rendezvous group completes its transfers together, so a device may post a recv
// ahead of the send it waits on); a schedule valid with buffered sends is simulated (on its own
// cores and on one shared core) and issued (issue_order: every op exactly once); an invalid one
// makes simulate() and issue_order() throw gpipe::Error. A crash, a sanitizer report, a hang or a
// broken rule (a trap) is a finding. Built and run by scripts/fuzz.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <set>
#include <utility>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "schedule_mutations.hpp"

namespace {

using namespace gpipe;
using fuzz::check;

template <class F>
bool throws_error(F&& f) {
  try {
    f();
  } catch (const Error&) {
    return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  Schedule s;
  try {
    s = fuzz::built_in_schedule(data[0], 1 + data[1] % 4, 1 + data[2] % 8);
  } catch (const Error&) {  // a kind that needs more micro-batches or devices
    return 0;
  }
  fuzz::mutate_schedule(s, data + 3, size - 3, /*wild=*/true);
  const ValidationResult buffered = validate(s);
  const ValidationResult rendezvous = validate(s, Sends::rendezvous);
  check(!describe(buffered).empty() && !describe(rendezvous).empty());
  if (!buffered.ok) {
    check(throws_error([&] { simulate(s); }));
    check(throws_error([&] { issue_order(s); }));
    return 0;
  }
  const SimulationResult timed = simulate(s, OpCosts{.forward = 1, .backward_input = 2});
  check(timed.makespan >= 0);
  (void)simulate_on_cores(s, std::vector<OpCosts>(s.num_devices, OpCosts{}), 1);
  const std::vector<OpPlace> order = issue_order(s);
  std::size_t total = 0;
  for (const auto& ops : s.ops) total += ops.size();
  check(order.size() == total);
  std::set<std::pair<std::size_t, std::size_t>> seen;
  for (const OpPlace& place : order) check(seen.insert({place.device, place.position}).second);
  return 0;
}
