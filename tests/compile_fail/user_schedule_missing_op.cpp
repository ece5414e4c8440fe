// expect: missing_op, [^,]*device<1>, [^,]*position<9>, [^,]*backward_weight, [^,]*batch<1>
// A hand-written GPipe schedule for 2 devices and 2 micro-batches that forgets device 1's
// weight gradient of micro-batch 1. A missing op is reported at the end of its device's list
// (position 9, after the 9 ops device 1 has).
#include <gpipe/schedule.hpp>

namespace {

using gpipe::OpKind;

constexpr gpipe::Schedule forgot_a_weight_gradient() {
  return {.num_devices = 2,
          .num_micro_batches = 2,
          .ops = {{{OpKind::forward, 0},
                   {OpKind::send_activation, 0},
                   {OpKind::forward, 1},
                   {OpKind::send_activation, 1},
                   {OpKind::recv_gradient, 1},
                   {OpKind::backward_input, 1},
                   {OpKind::backward_weight, 1},
                   {OpKind::recv_gradient, 0},
                   {OpKind::backward_input, 0},
                   {OpKind::backward_weight, 0}},
                  {{OpKind::recv_activation, 0},
                   {OpKind::forward, 0},
                   {OpKind::recv_activation, 1},
                   {OpKind::forward, 1},
                   {OpKind::backward_input, 1},
                   {OpKind::send_gradient, 1},
                   {OpKind::backward_input, 0},
                   {OpKind::backward_weight, 0},
                   {OpKind::send_gradient, 0}}}};
}

static_assert(gpipe::valid_at_compile_time<forgot_a_weight_gradient>);

}  // namespace
