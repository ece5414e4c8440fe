// expect-compiles
// Control for the compile-fail harness: a file that must compile, so a harness that fails
// everything (wrong include path, bad flags) cannot pass the real expected-failure tests.
#include <gpipe/error.hpp>

int main() {}
