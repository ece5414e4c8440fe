#pragma once
// What the generators share: the checks of their arguments and the per-device op emitter that
// wraps each compute op in the transfers the contract of schedule/op.hpp gives its stage.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe::detail {

// (K, M, V[, placement]) => a Schedule with K empty lists; throws Error naming `generator` when K,
// M or V is 0 or an index does not fit an Op's 32-bit fields.
constexpr Schedule empty_schedule(const char* generator, std::size_t num_devices,
                                  std::size_t num_micro_batches, std::size_t num_chunks,
                                  Placement placement = Placement::round_robin) {
  if (num_devices == 0) {
    throw Error(std::string("gpipe: ") + generator + " needs at least one device, got 0");
  }
  if (num_micro_batches == 0) {
    throw Error(std::string("gpipe: ") + generator + " needs at least one micro-batch, got 0");
  }
  if (num_chunks == 0) {
    throw Error(std::string("gpipe: ") + generator + " needs at least one chunk per device, got 0");
  }
  if (num_micro_batches > std::numeric_limits<std::uint32_t>::max() ||
      num_chunks > std::numeric_limits<std::uint32_t>::max()) {
    throw Error(std::string("gpipe: ") + generator +
                ": too many micro-batches or chunks for a schedule (more than 2^32 - 1)");
  }
  return {.num_devices = num_devices,
          .num_micro_batches = num_micro_batches,
          .num_chunks = num_chunks,
          .ops = std::vector<std::vector<Op>>(num_devices),
          .placement = placement};
}

// prefix followed by V's decimal digits, as characters: the name of a schedule tag with V chunks
// per device ("interleaved-2", "looped-bfs-12").
template <std::size_t V, std::size_t N>
constexpr auto numbered_name(const char (&prefix)[N]) {
  constexpr std::size_t digits = [] {
    std::size_t n = 1;
    for (std::size_t v = V; v >= 10; v /= 10) ++n;
    return n;
  }();
  std::array<char, N - 1 + digits> text{};
  for (std::size_t i = 0; i + 1 < N; ++i) text[i] = prefix[i];
  std::size_t v = V;
  for (std::size_t i = text.size(); i-- > N - 1; v /= 10) text[i] = static_cast<char>('0' + v % 10);
  return text;
}

// The members shared by the schedule tags that put V stages on each device round robin
// (Interleaved<V>, LoopedBFS<V>): `prefix` is a named char array ("interleaved-"), make_schedule
// the generator (K, V, M) => Schedule.
template <std::size_t V, const auto& prefix, auto make_schedule>
struct RoundRobinScheduleKind {
 private:
  static constexpr auto name_text_ = numbered_name<V>(prefix);

 public:
  /// Stages per device: a model of S stages runs on S / V devices (S must be a multiple of V).
  static constexpr std::size_t chunks_per_device = V;
  /// The prefix, then V's digits (`"interleaved-2"`), in benchmark labels and test output.
  static constexpr std::string_view name{name_text_.data(), name_text_.size()};

  /// The schedule for K devices and M micro-batches: make_schedule(K, V, M).
  static constexpr Schedule make(std::size_t num_devices, std::size_t num_micro_batches) {
    return make_schedule(num_devices, V, num_micro_batches);
  }
};

// Appends to one device's list. Each compute op comes with its transfers, placed as late
// (recvs) and as early (sends) as its dependencies allow: a recv right before the op that needs
// the data, a send right after the op that makes it.
class Program {
 public:
  constexpr Program(Schedule& schedule, std::size_t device)
      : ops_(schedule.ops[device]),
        schedule_(schedule),
        device_(device),
        num_stages_(schedule.num_stages()) {}

  // [recv_activation] forward [send_activation]
  constexpr void forward(std::size_t micro_batch, std::size_t chunk = 0) {
    const Op op = make(OpKind::forward, micro_batch, chunk);
    if (!first(chunk)) ops_.push_back({OpKind::recv_activation, op.micro_batch, op.chunk});
    ops_.push_back(op);
    if (!last(chunk)) ops_.push_back({OpKind::send_activation, op.micro_batch, op.chunk});
  }
  // [recv_gradient] backward_input [send_gradient]
  constexpr void backward_input(std::size_t micro_batch, std::size_t chunk = 0) {
    const Op op = make(OpKind::backward_input, micro_batch, chunk);
    if (!last(chunk)) ops_.push_back({OpKind::recv_gradient, op.micro_batch, op.chunk});
    ops_.push_back(op);
    if (!first(chunk)) ops_.push_back({OpKind::send_gradient, op.micro_batch, op.chunk});
  }
  constexpr void backward_weight(std::size_t micro_batch, std::size_t chunk = 0) {
    ops_.push_back(make(OpKind::backward_weight, micro_batch, chunk));
  }
  // [recv_gradient] backward_input backward_weight [send_gradient]: the fused backward of
  // GPipe and 1F1B, whose gradient leaves after W.
  constexpr void backward(std::size_t micro_batch, std::size_t chunk = 0) {
    const Op op = make(OpKind::backward_input, micro_batch, chunk);
    if (!last(chunk)) ops_.push_back({OpKind::recv_gradient, op.micro_batch, op.chunk});
    ops_.push_back(op);
    ops_.push_back({OpKind::backward_weight, op.micro_batch, op.chunk});
    if (!first(chunk)) ops_.push_back({OpKind::send_gradient, op.micro_batch, op.chunk});
  }

 private:
  static constexpr Op make(OpKind kind, std::size_t micro_batch, std::size_t chunk) {
    return {kind, static_cast<std::uint32_t>(micro_batch), static_cast<std::uint32_t>(chunk)};
  }
  constexpr bool first(std::size_t chunk) const { return schedule_.stage_of(device_, chunk) == 0; }
  constexpr bool last(std::size_t chunk) const {
    return schedule_.stage_of(device_, chunk) + 1 == num_stages_;
  }

  std::vector<Op>& ops_;
  const Schedule& schedule_;
  std::size_t device_;
  std::size_t num_stages_;
};

}  // namespace gpipe::detail
