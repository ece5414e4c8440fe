# Defines the imported target gpipe::host_gemm: what the host backend's float GEMM links.
#
# Shared by the build (CMakeLists.txt) and the installed package (gpipeConfig.cmake), so a
# consumer finds oneDNN exactly the way the project's own build did. With GPIPE_HOST_ONEDNN ON
# (the default): oneDNN's C API (header oneapi/dnnl/dnnl.h, library dnnl; Debian/Ubuntu:
# libdnnl-dev) and the OpenMP runtime it was built with (libgomp), whose per-thread thread count
# gpipe sets to one on each device worker. The library is found directly, not through oneDNN's
# own CMake package, which also demands OpenCL headers for its GPU runtime.
# With GPIPE_HOST_ONEDNN OFF: no dependency; the target defines GPIPE_HOST_GEMM_REFERENCE and the
# host backend's GEMM is plain loops (for machines that only need a host reference, e.g. a GPU
# machine without oneDNN).
# Sets gpipe_ONEDNN_FOUND (TRUE also when OFF: nothing is needed) and gpipe_ONEDNN_INCLUDE_DIRS
# (for tools that invoke the compiler by hand). With gpipe_ONEDNN_REQUIRED set, a miss is fatal.

if(TARGET gpipe::host_gemm)
  set(gpipe_ONEDNN_FOUND TRUE)
  return()
endif()

if(NOT DEFINED GPIPE_HOST_ONEDNN)
  set(GPIPE_HOST_ONEDNN ON)
endif()
set(gpipe_ONEDNN_INCLUDE_DIRS "")

if(NOT GPIPE_HOST_ONEDNN)
  add_library(gpipe::host_gemm INTERFACE IMPORTED)
  target_compile_definitions(gpipe::host_gemm INTERFACE GPIPE_HOST_GEMM_REFERENCE)
  set(gpipe_ONEDNN_FOUND TRUE)
  return()
endif()

set(gpipe_ONEDNN_FOUND FALSE)
find_path(gpipe_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.h)
find_library(gpipe_ONEDNN_LIBRARY NAMES dnnl)
# libgomp: by its development name where the compiler installs one, else the runtime's soname.
find_library(gpipe_GOMP_LIBRARY NAMES gomp libgomp.so.1)
if(gpipe_ONEDNN_INCLUDE_DIR AND gpipe_ONEDNN_LIBRARY AND gpipe_GOMP_LIBRARY)
  add_library(gpipe::host_gemm INTERFACE IMPORTED)
  target_include_directories(gpipe::host_gemm INTERFACE "${gpipe_ONEDNN_INCLUDE_DIR}")
  # dlopen (OpenBLAS, loaded at run time: gemm_library.hpp) is in libdl before glibc 2.34
  target_link_libraries(gpipe::host_gemm INTERFACE
    "${gpipe_ONEDNN_LIBRARY}" "${gpipe_GOMP_LIBRARY}" ${CMAKE_DL_LIBS})
  set(gpipe_ONEDNN_INCLUDE_DIRS "${gpipe_ONEDNN_INCLUDE_DIR}")
  set(gpipe_ONEDNN_FOUND TRUE)
elseif(gpipe_ONEDNN_REQUIRED)
  message(FATAL_ERROR
    "gpipe: oneDNN not found (need oneapi/dnnl/dnnl.h, libdnnl and libgomp). "
    "On Debian/Ubuntu: apt-get install libdnnl-dev. Elsewhere, add its prefix to "
    "CMAKE_PREFIX_PATH, or configure with -DGPIPE_HOST_ONEDNN=OFF for plain-loop host GEMMs.")
endif()
