// Proves an installed gpipe is usable: its headers are found through gpipe::gpipe, they compile
// as C++20 in another project, and the host backend with its BLAS and threads links and trains:
// one step of a two-stage pipeline must lower the loss; the installed gradient checker
// (gpipe/testing/gradient_check.hpp) passes a Linear. Exits 0 on success.

#include <cstdio>
#include <exception>
#include <gpipe/gpipe.hpp>
#include <gpipe/testing/gradient_check.hpp>

#include "train_step.hpp"

int main() try {
  gpipe::host::Backend backend(2);
  check_one_step_lowers_the_loss(backend, "gpipe consumer");
  const auto check = gpipe::testing::check_layer<gpipe::Linear<3, 2>>();
  if (!(check.dx_error < 1e-6 && check.params_error < 1e-6)) {
    std::fprintf(stderr, "gpipe consumer: check_layer<Linear<3, 2>> failed: %g, %g\n",
                 check.dx_error, check.params_error);
    return 1;
  }
  std::printf("gpipe consumer: check_layer<Linear<3, 2>> passed\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
