# Defines the imported target gpipe::openblas (OpenBLAS with its CBLAS header).
#
# Shared by the build (CMakeLists.txt) and the installed package (gpipeConfig.cmake), so a
# consumer finds OpenBLAS exactly the way the project's own build did:
#   1. pkg-config module `openblas` (Debian/Ubuntu: libopenblas-dev), as an IMPORTED_TARGET;
#   2. otherwise find_library(openblas) + find_path(cblas.h), including the Debian
#      openblas-{pthread,openmp,serial} sub-directories.
# Sets gpipe_OPENBLAS_INCLUDE_DIRS (for tools that invoke the compiler by hand) and
# gpipe_OPENBLAS_FOUND. With gpipe_OPENBLAS_REQUIRED set, a miss is a fatal error.

if(TARGET gpipe::openblas)
  set(gpipe_OPENBLAS_FOUND TRUE)
  return()
endif()

set(gpipe_OPENBLAS_FOUND FALSE)
set(gpipe_OPENBLAS_INCLUDE_DIRS "")

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(gpipe_PC_OPENBLAS QUIET IMPORTED_TARGET openblas)
endif()

if(gpipe_PC_OPENBLAS_FOUND)
  # A build without CBLAS (NO_CBLAS=1) has a .pc file but no cblas.h: fall through then.
  find_path(gpipe_CBLAS_INCLUDE_DIR cblas.h
    HINTS ${gpipe_PC_OPENBLAS_INCLUDE_DIRS}
    PATH_SUFFIXES openblas openblas-pthread openblas-openmp openblas-serial)
  if(gpipe_CBLAS_INCLUDE_DIR)
    add_library(gpipe::openblas INTERFACE IMPORTED)
    target_link_libraries(gpipe::openblas INTERFACE PkgConfig::gpipe_PC_OPENBLAS)
    set(gpipe_OPENBLAS_INCLUDE_DIRS ${gpipe_PC_OPENBLAS_INCLUDE_DIRS})
    set(gpipe_OPENBLAS_FOUND TRUE)
  endif()
endif()

if(NOT gpipe_OPENBLAS_FOUND)
  find_library(gpipe_OPENBLAS_LIBRARY NAMES openblas
    PATH_SUFFIXES openblas-pthread openblas-openmp openblas-serial openblas)
  find_path(gpipe_CBLAS_INCLUDE_DIR cblas.h
    PATH_SUFFIXES openblas openblas-pthread openblas-openmp openblas-serial)
  if(gpipe_OPENBLAS_LIBRARY AND gpipe_CBLAS_INCLUDE_DIR)
    add_library(gpipe::openblas INTERFACE IMPORTED)
    target_link_libraries(gpipe::openblas INTERFACE "${gpipe_OPENBLAS_LIBRARY}")
    target_include_directories(gpipe::openblas INTERFACE "${gpipe_CBLAS_INCLUDE_DIR}")
    set(gpipe_OPENBLAS_INCLUDE_DIRS "${gpipe_CBLAS_INCLUDE_DIR}")
    set(gpipe_OPENBLAS_FOUND TRUE)
  endif()
endif()

if(NOT gpipe_OPENBLAS_FOUND AND gpipe_OPENBLAS_REQUIRED)
  message(FATAL_ERROR
    "gpipe: OpenBLAS not found (need libopenblas and cblas.h). "
    "On Debian/Ubuntu: apt-get install libopenblas-dev pkg-config. "
    "Elsewhere, add its prefix to CMAKE_PREFIX_PATH.")
endif()
