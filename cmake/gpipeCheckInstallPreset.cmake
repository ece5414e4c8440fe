# cmake -DSOURCE_DIR=<gpipe> -DWORK_DIR=<dir> -P gpipeCheckInstallPreset.cmake
#
# The README's install route: configures SOURCE_DIR with the `install` preset (into
# WORK_DIR/build) while doctest, Google Benchmark and Python are made unfindable, installs it into
# WORK_DIR/prefix, and fails unless the headers and the CMake package are there. Shows that
# installing needs only CMake, a compiler and the runtime dependencies, not the test tools.

cmake_minimum_required(VERSION 3.25)
foreach(_var SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "gpipeCheckInstallPreset.cmake: pass -D${_var}=...")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" --preset install -B "${WORK_DIR}/build"
    -DCMAKE_DISABLE_FIND_PACKAGE_doctest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_Python3=ON
  RESULT_VARIABLE _rc)
if(NOT _rc STREQUAL "0")
  message(FATAL_ERROR "the install preset did not configure without the test tools")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${WORK_DIR}/build" --prefix "${WORK_DIR}/prefix"
  RESULT_VARIABLE _rc)
if(NOT _rc STREQUAL "0")
  message(FATAL_ERROR "cmake --install failed")
endif()
foreach(_file include/gpipe/gpipe.hpp include/gpipe/mpi.hpp)
  if(NOT EXISTS "${WORK_DIR}/prefix/${_file}")
    message(FATAL_ERROR "the install has no ${_file}")
  endif()
endforeach()
file(GLOB_RECURSE _config "${WORK_DIR}/prefix/*/gpipeConfig.cmake")
if(NOT _config)
  message(FATAL_ERROR "the install has no gpipeConfig.cmake")
endif()
message(STATUS "installed with the install preset: ${_config}")
