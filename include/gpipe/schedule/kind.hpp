#pragma once
// The schedule_kind concept: what a type must provide to be a Trainer's ScheduleKind argument (the
// tags GPipe, OneFOneB, Interleaved<V>, ZeroBubbleH1, or a user's own), from named parts as
// gpipe::layer is.

#include <concepts>
#include <cstddef>
#include <string_view>

#include "gpipe/error.hpp"
#include "gpipe/schedule/op.hpp"

namespace gpipe {

/// has_chunks_per_device<Kind>: static `chunks_per_device` >= 1, the stages each device runs (a
/// model of S stages runs on S / chunks_per_device devices).
template <class Kind>
concept has_chunks_per_device = requires {
  { Kind::chunks_per_device } -> std::convertible_to<std::size_t>;
}
&&(Kind::chunks_per_device >= 1);

/// has_schedule_generator<Kind>: static `make(num_devices, num_micro_batches)`, the Schedule (per
/// device its ops) for K devices and M micro-batches, which the Trainer validates before use.
template <class Kind>
concept has_schedule_generator = requires(std::size_t n) {
  { Kind::make(n, n) } -> std::convertible_to<Schedule>;
};

/// has_schedule_name<Kind>: static `name`, how benchmark labels and test output call it.
template <class Kind>
concept has_schedule_name = requires {
  { Kind::name } -> std::convertible_to<std::string_view>;
};

/// schedule_kind<Kind>: a schedule tag the Trainer can run.
template <class Kind>
concept schedule_kind =
    has_chunks_per_device<Kind> && has_schedule_generator<Kind> && has_schedule_name<Kind>;

namespace detail {

// explain_schedule_kind<Kind>(): true for a schedule_kind; otherwise a static_assert that names the
// first piece Kind lacks (the Trainer checks its ScheduleKind with it).
template <class Kind>
constexpr bool explain_schedule_kind() {
  if constexpr (schedule_kind<Kind>) {
    return true;
  } else if constexpr (!requires {
                         { Kind::chunks_per_device } -> std::convertible_to<std::size_t>;
                       }) {
    static_assert(lacks<Kind>,
                  "gpipe: a schedule kind needs static constexpr std::size_t chunks_per_device "
                  "(stages per device); see gpipe/schedule/kind.hpp");
  } else if constexpr (!has_chunks_per_device<Kind>) {
    static_assert(lacks<Kind>, "gpipe: a schedule kind's chunks_per_device must be >= 1");
  } else if constexpr (!has_schedule_generator<Kind>) {
    static_assert(lacks<Kind>,
                  "gpipe: a schedule kind needs static Schedule make(std::size_t num_devices, "
                  "std::size_t num_micro_batches)");
  } else {
    static_assert(lacks<Kind>,
                  "gpipe: a schedule kind needs static constexpr std::string_view name");
  }
  return false;
}

}  // namespace detail
}  // namespace gpipe
