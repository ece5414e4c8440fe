#pragma once
// Schedules proven valid while the program compiles. A schedule is made by a constant callable
// (a constexpr function or a capture-less lambda, () -> Schedule); the validator runs on it in a
// constant expression, and an invalid schedule fails to compile with an error that names the
// broken rule and the first offending op:
//
//   constexpr gpipe::Schedule my_schedule() { ... }
//   static_assert(gpipe::require_valid_at_compile_time<my_schedule>());
//   static_assert(gpipe::valid_at_compile_time<[] { return gpipe::make_1f1b_schedule(4, 8); }>);
//
// C++20 static_assert messages are fixed strings, so the values travel as template arguments of
// a class that refuses to be instantiated; compilers print them where they report the failed
// static_assert inside it ("In instantiation of ..."):
//
//   gpipe::invalid_schedule<gpipe::ValidationError::deadlock, gpipe::on_device<1>,
//       gpipe::at_position<3>, gpipe::OpKind::recv_activation, gpipe::for_micro_batch<0>,
//       gpipe::in_chunk<0>>
//
// reads: deadlock, on device 1 at position 3 of its list, the recv_activation for micro-batch 0
// in chunk 0; the meaning of each error and of the position is that of validate()
// (schedule/validator.hpp). describe(validate(s)) gives the same as one line of text at run time.

#include <cstddef>
#include <cstdint>

#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/validator.hpp"

namespace gpipe {

/// The offending op's device, as a type so that it appears in the diagnostic.
template <std::size_t Device>
struct on_device {};
/// The offending op's position in its device's list, as a type for the diagnostic.
template <std::size_t Position>
struct at_position {};
/// The offending op's micro-batch, as a type for the diagnostic.
template <std::uint32_t MicroBatch>
struct for_micro_batch {};
/// The offending op's chunk, as a type for the diagnostic.
template <std::uint32_t Chunk>
struct in_chunk {};

/// Instantiated only for an invalid schedule, to fail with the error and op in its arguments.
template <ValidationError Error, class Device, class Position, OpKind Kind, class MicroBatch,
          class Chunk>
struct invalid_schedule {
  static_assert(Error == ValidationError::none,
                "gpipe: invalid schedule; the template arguments of gpipe::invalid_schedule<...> "
                "name the broken rule and the first offending op (device, position in its list, "
                "kind, micro-batch, chunk)");
  /// Read by require_valid_at_compile_time so that the class is instantiated and its
  /// static_assert fails; the compilation never gets to use it.
  static constexpr bool value = false;
};

/// validate(MakeSchedule()), evaluated once per schedule as a constant expression of its own, so
/// that a grid of schedules checked together does not add up against the compiler's limit on
/// the steps of one constant evaluation.
template <auto MakeSchedule>
inline constexpr ValidationResult compile_time_validation = validate(MakeSchedule());

/// MakeSchedule: () -> Schedule, usable in constant expressions. True when validate() accepts the
/// schedule; a compile error naming the first offending op otherwise.
template <auto MakeSchedule>
consteval bool require_valid_at_compile_time() {
  constexpr const ValidationResult& result = compile_time_validation<MakeSchedule>;
  if constexpr (!result.ok) {
    return invalid_schedule<result.error, on_device<result.device>, at_position<result.position>,
                            result.op.kind, for_micro_batch<result.op.micro_batch>,
                            in_chunk<result.op.chunk>>::value;
  } else {
    return true;
  }
}

/// require_valid_at_compile_time<MakeSchedule>() as a variable: usable in a static_assert or as
/// a template argument, evaluated once per schedule.
template <auto MakeSchedule>
inline constexpr bool valid_at_compile_time = require_valid_at_compile_time<MakeSchedule>();

}  // namespace gpipe
