#pragma once
// Where the host backend's code is compiled: in every program (header-only, the default) or once,
// in the optional library that the CMake target gpipe::compiled builds (src/host.cpp). A program
// compiled with GPIPE_COMPILED_HOST defined (gpipe::compiled defines it for its users) sees the
// host backend's non-template functions as declarations and, as extern templates, the float
// instantiations of its kernel context and of its layers' kernels (each declared at the end of
// the header that defines it) and its runtime's instantiations for host::Backend
// (backend/host/compiled.hpp), and links them from the library. Both ways give the same code:
// only where it is compiled differs.
//
// GPIPE_HOST_INLINE marks a non-template function that the headers define out of its class:
// `inline` in header-only programs, nothing in the library (one strong definition there).
// GPIPE_HOST_DEFINITIONS is 1 where those definitions are compiled: header-only programs and the
// library's own source, which defines GPIPE_COMPILED_HOST_SOURCE.

#if defined(GPIPE_COMPILED_HOST) && !defined(GPIPE_COMPILED_HOST_SOURCE)
#define GPIPE_HOST_DEFINITIONS 0
#else
#define GPIPE_HOST_DEFINITIONS 1
#endif

#if defined(GPIPE_COMPILED_HOST)
#define GPIPE_HOST_INLINE
#else
#define GPIPE_HOST_INLINE inline
#endif

// GPIPE_HOST_INSTANTIATION(declaration): an explicit instantiation that the library compiles once
// (`struct LayerKernels<MyOp, host::KernelContext<float>>`, or a member function's declaration):
// `extern template` in a program on the library, `template` in the library's source, nothing in
// a header-only program. Written at namespace scope, followed by a semicolon, after the
// definitions of the template's out-of-class members: an explicit instantiation definition
// instantiates only the members defined by then.
#if !defined(GPIPE_COMPILED_HOST)
#define GPIPE_HOST_INSTANTIATION(...) static_assert(true)
#elif defined(GPIPE_COMPILED_HOST_SOURCE)
#define GPIPE_HOST_INSTANTIATION(...) template __VA_ARGS__
#else
#define GPIPE_HOST_INSTANTIATION(...) extern template __VA_ARGS__
#endif
