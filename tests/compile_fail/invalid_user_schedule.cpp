// expect: deadlock, [^,]*device<0>, [^,]*position<4>, [^,]*recv_gradient, [^,]*batch<1>
// A hand-written schedule for 2 devices and 3 micro-batches that deadlocks: device 0 warms up
// with two forwards and then waits for the gradient of micro-batch 1, but device 1 runs all
// three forwards before any backward, so it waits for the third activation, which device 0
// sends only after that gradient. The compile error names the first stuck op: device 0,
// position 4 of its list, recv_gradient of micro-batch 1 (chunk 0), as the template arguments
// of gpipe::invalid_schedule<gpipe::ValidationError::deadlock, gpipe::on_device<0>, ...>.
#include <gpipe/schedule.hpp>

namespace {

using gpipe::OpKind;

constexpr gpipe::Schedule too_short_warm_up() {
  return {.num_devices = 2,
          .num_micro_batches = 3,
          .ops = {{{OpKind::forward, 0},
                   {OpKind::send_activation, 0},
                   {OpKind::forward, 1},
                   {OpKind::send_activation, 1},
                   {OpKind::recv_gradient, 1},  // blocks: device 1 is waiting for activation 2
                   {OpKind::backward_input, 1},
                   {OpKind::backward_weight, 1},
                   {OpKind::recv_gradient, 0},
                   {OpKind::backward_input, 0},
                   {OpKind::backward_weight, 0},
                   {OpKind::forward, 2},
                   {OpKind::send_activation, 2},
                   {OpKind::recv_gradient, 2},
                   {OpKind::backward_input, 2},
                   {OpKind::backward_weight, 2}},
                  {{OpKind::recv_activation, 0},
                   {OpKind::forward, 0},
                   {OpKind::recv_activation, 1},
                   {OpKind::forward, 1},
                   {OpKind::recv_activation, 2},  // blocks: device 0 sends it after gradient 1
                   {OpKind::forward, 2},
                   {OpKind::backward_input, 1},
                   {OpKind::backward_weight, 1},
                   {OpKind::send_gradient, 1},
                   {OpKind::backward_input, 0},
                   {OpKind::backward_weight, 0},
                   {OpKind::send_gradient, 0},
                   {OpKind::backward_input, 2},
                   {OpKind::backward_weight, 2},
                   {OpKind::send_gradient, 2}}}};
}

static_assert(gpipe::require_valid_at_compile_time<too_short_warm_up>());

}  // namespace
