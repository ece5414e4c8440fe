// The optional compiled part of gpipe (CMake target gpipe::compiled): the host backend's
// non-template functions and its runtime's instantiations for host::Backend
// (backend/host/compiled.hpp), compiled once here instead of in every translation unit of a
// program. Built with the same definitions as its users (GPIPE_COMPILED_HOST, the GEMM library's).

#define GPIPE_COMPILED_HOST_SOURCE
#include <gpipe/gpipe.hpp>
