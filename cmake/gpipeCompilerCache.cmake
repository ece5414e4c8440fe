# The compiler cache of gpipe's own build (tests, benchmarks, examples): ccache where it is found
# (scripts/test installs Debian's when it may), for C++ and for nvcc. Keyed so that a clone of
# the same code in another folder hits what an earlier build stored: paths under the source tree
# are hashed relative to it (CCACHE_BASEDIR), the working directory is not hashed
# (CCACHE_NOHASHDIR), and the project's targets map the source tree to "." in their debug info
# (gpipe_configure_target), so an object file does not depend on where the tree lies. A changed
# source, header, flag or compiler is a miss and a full compile: the cache never decides what
# is correct.
#
# GPIPE_CCACHE=OFF, or a CMAKE_<LANG>_COMPILER_LAUNCHER of the caller's, turns it off. Sets
# GPIPE_COMPILER_LAUNCHER (the launcher command, empty without one) for the checks that compile
# at test time (compile_fail/, readme/, install/).

option(GPIPE_CCACHE "Compile the project's own targets through ccache where it is found" ON)
set(GPIPE_COMPILER_LAUNCHER "")
if(GPIPE_CCACHE AND PROJECT_IS_TOP_LEVEL AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(GPIPE_CCACHE_PROGRAM ccache)
  if(GPIPE_CCACHE_PROGRAM)
    set(GPIPE_COMPILER_LAUNCHER
      "${CMAKE_COMMAND}" -E env "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" CCACHE_NOHASHDIR=true
      "${GPIPE_CCACHE_PROGRAM}")
    set(CMAKE_CXX_COMPILER_LAUNCHER ${GPIPE_COMPILER_LAUNCHER})
    if(NOT CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${GPIPE_COMPILER_LAUNCHER})
    endif()
    message(STATUS "gpipe: compiling through ${GPIPE_CCACHE_PROGRAM}")
  endif()
endif()
