// expect-compiles
// Control for the schedule compile-fail tests: a valid hand-written schedule and the library's
// generators pass require_valid_at_compile_time, so the failures next to this file come from
// the schedules they break, not from the check itself.
#include <gpipe/schedule.hpp>

namespace {

using gpipe::OpKind;

// One device, one micro-batch, two chunks: stage 0 hands its activation to stage 1 on the same
// device, and stage 1 hands the gradient back.
constexpr gpipe::Schedule two_chunks_on_one_device() {
  return {.num_devices = 1,
          .num_micro_batches = 1,
          .num_chunks = 2,
          .ops = {{{OpKind::forward, 0, 0},
                   {OpKind::send_activation, 0, 0},
                   {OpKind::recv_activation, 0, 1},
                   {OpKind::forward, 0, 1},
                   {OpKind::backward_input, 0, 1},
                   {OpKind::send_gradient, 0, 1},
                   {OpKind::recv_gradient, 0, 0},
                   {OpKind::backward_input, 0, 0},
                   {OpKind::backward_weight, 0, 0},
                   {OpKind::backward_weight, 0, 1}}}};
}

static_assert(gpipe::require_valid_at_compile_time<two_chunks_on_one_device>());
static_assert(gpipe::valid_at_compile_time<[] { return gpipe::make_zb_h1_schedule(4, 2); }>);
static_assert(
    gpipe::valid_at_compile_time<[] { return gpipe::make_interleaved_schedule(3, 2, 7); }>);

}  // namespace
