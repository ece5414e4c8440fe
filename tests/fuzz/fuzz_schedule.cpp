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

namespace {

using namespace gpipe;

Schedule built_in(unsigned which, std::size_t k, std::size_t m) {
  switch (which % 8) {
    case 0:
      return GPipe::make(k, m);
    case 1:
      return OneFOneB::make(k, m);
    case 2:
      return ZeroBubbleH1::make(k, m);
    case 3:
      return ZeroBubbleH2::make(k, m);
    case 4:
      return Interleaved<2>::make(k, m);
    case 5:
      return LoopedBFS<2>::make(k, m);
    case 6:
      return ZeroBubbleV::make(k, m);
    default:
      return DualPipeV::make(k, m);
  }
}

void check(bool rule) {
  if (!rule) __builtin_trap();
}

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
    s = built_in(data[0], 1 + data[1] % 4, 1 + data[2] % 8);
  } catch (const Error&) {  // a kind that needs more micro-batches or devices
    return 0;
  }
  // mutations: 4 bytes each (what, device, position, value)
  for (std::size_t i = 3; i + 4 <= size; i += 4) {
    const std::uint8_t what = data[i], value = data[i + 3];
    auto& ops = s.ops[data[i + 1] % s.num_devices];
    if (ops.empty()) continue;
    const std::size_t at = data[i + 2] % ops.size();
    switch (what % 9) {
      case 0:
        std::swap(ops[at], ops[value % ops.size()]);
        break;
      case 1:
        ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(at));
        break;
      case 2:
        ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(value % ops.size()), ops[at]);
        break;
      case 3:
        ops[at].micro_batch = value % (s.num_micro_batches + 1);
        break;
      case 4:
        ops[at].chunk = value % (s.num_chunks + 1);
        break;
      case 5:
        ops[at].kind = static_cast<OpKind>(value % (num_op_kinds + 1));
        break;
      case 6: {
        const Op op = ops[at];
        ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(at));
        auto& other = s.ops[value % s.num_devices];
        other.insert(other.begin() + static_cast<std::ptrdiff_t>(value % (other.size() + 1)), op);
        break;
      }
      case 7:
        s.placement =
            s.placement == Placement::round_robin ? Placement::v_shape : Placement::round_robin;
        break;
      default:
        std::swap(ops[at], ops[(at + 1) % ops.size()]);
        break;
    }
  }
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
