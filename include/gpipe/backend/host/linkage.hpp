#pragma once
// Where the host backend's code is compiled: in every program (header-only, the default) or once,
// in the optional library that the CMake target gpipe::compiled builds (src/host.cpp). A program
// compiled with GPIPE_COMPILED_HOST defined (gpipe::compiled defines it for its users) sees the
// host backend's non-template functions as declarations and its runtime's instantiations for
// host::Backend as extern templates (backend/host/compiled.hpp), and links them from the library.
// Both ways give the same code: only where it is compiled differs.
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
