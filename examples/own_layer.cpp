// Your own layer (examples/own_layer/scale.hpp, its host kernels in scale_host.hpp) on the host
// backend: its gradients checked against finite differences in double precision, then trained in
// a 2-stage pipeline. The README's "Your own layer" walks through it.
// Usage: example_own_layer [steps]; exit status 0 when the check passes and the held-out accuracy
// exceeds 90%.

#include <cstdio>
#include <cstdlib>
#include <gpipe/gpipe.hpp>
#include <gpipe/testing/gradient_check.hpp>

#include "own_layer/scale.hpp"
#include "own_layer/scale_host.hpp"
#include "own_layer/train.hpp"

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  if (steps <= 0) {
    std::fprintf(stderr, "usage: %s [steps > 0]\n", argv[0]);
    return 2;
  }
  try {
    // B (dx) and W (the weight's gradient, run twice: it must accumulate) against central
    // differences of forward, in double, relative to the largest entry.
    const gpipe::testing::GradientCheck check = gpipe::testing::check_layer<Scale<8>>(/*rows*/ 5);
    std::printf("Scale<8> against finite differences: dx error %.1e, weight error %.1e\n",
                check.dx_error, check.params_error);
    if (!(check.dx_error < 1e-6 && check.params_error < 1e-6)) return 1;

    gpipe::host::Backend backend(own_layer::Model::num_stages);
    return own_layer::train_and_report(backend, "2 host devices", steps);
  } catch (const gpipe::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
