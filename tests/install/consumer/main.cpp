// Proves an installed gpipe is usable: its headers are found through gpipe::gpipe, they compile
// as C++20, and OpenBLAS links. Exits 0 on success.
#include <cblas.h>

#include <cstdio>
#include <exception>
#include <gpipe/error.hpp>  // the one line to change to <gpipe/gpipe.hpp>

int main() try {
  // (2, 2) x (2, 2), row-major: [[1, 2], [3, 4]] x [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
  const float a[4] = {1, 2, 3, 4};
  const float b[4] = {5, 6, 7, 8};
  const float expected[4] = {19, 22, 43, 50};
  float c[4] = {};
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
  for (int i = 0; i < 4; ++i) {
    if (c[i] != expected[i]) throw gpipe::Error("gpipe consumer: cblas_sgemm gave a wrong product");
  }
  std::printf("gpipe consumer: ok\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
