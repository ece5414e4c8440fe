// Trains a 4-stage pipeline on the host backend to tell apart the arms of a noisy three-armed
// spiral (examples/spiral.hpp), then draws one traced step into spiral_timeline.svg.
// Usage: example_spiral [steps] [micro_batches]; exit status 0 when the test accuracy exceeds 90%.

#include "spiral.hpp"

#include <cstdio>
#include <gpipe/gpipe.hpp>

int main(int argc, char** argv) {
  spiral::Options options;
  if (!spiral::parse(argc, argv, options)) return 2;
  try {
    gpipe::host::Backend backend(spiral::Model::num_stages);
    return spiral::train(backend, "host devices", options, "spiral_timeline.svg");
  } catch (const gpipe::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
