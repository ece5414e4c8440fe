// Proves an installed gpipe is usable: its headers are found through gpipe::gpipe, they compile
// as C++20 in another project, and the host backend with its BLAS and threads links and trains:
// one step of a two-stage pipeline must lower the loss. Exits 0 on success.

#include <cstdio>
#include <exception>
#include <gpipe/gpipe.hpp>

#include "train_step.hpp"

int main() try {
  gpipe::host::Backend backend(2);
  check_one_step_lowers_the_loss(backend, "gpipe consumer");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
