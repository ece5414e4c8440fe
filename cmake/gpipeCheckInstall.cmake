# cmake -DBUILD_DIR=<gpipe build> -DCONSUMER_DIR=<tests/install/consumer> -DGENERATOR=<generator>
#       [-DMAKE_PROGRAM=<path>] [-DCXX_COMPILER=<path>] [-DCUDA_COMPILER=<path>]
#       [-DCONFIG=<build type>] [-DLAUNCHER=<compiler launcher, its arguments joined by |>]
#       -P gpipeCheckInstall.cmake
#
# Installs BUILD_DIR into BUILD_DIR/install-test, configures CONSUMER_DIR against that prefix
# alone (find_package(gpipe)) into BUILD_DIR/consumer-build, builds it and runs its `app`, its
# `app_compiled` (the same program on gpipe::compiled: both must print the same), and its
# `cuda_app` where the consumer found nvcc.

cmake_minimum_required(VERSION 3.25)
foreach(_var BUILD_DIR CONSUMER_DIR GENERATOR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "gpipeCheckInstall.cmake: pass -D${_var}=...")
  endif()
endforeach()

set(_prefix "${BUILD_DIR}/install-test")
set(_consumer_build "${BUILD_DIR}/consumer-build")
file(REMOVE_RECURSE "${_prefix}" "${_consumer_build}")

function(_gpipe_step what)
  message(STATUS "${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${_rc}):\n${_out}")
  endif()
  set(_step_output "${_out}" PARENT_SCOPE)
endfunction()

set(_config_args "")
set(_build_type_args "")
if(CONFIG)
  set(_config_args --config "${CONFIG}")
  set(_build_type_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
set(_tool_args "")
if(MAKE_PROGRAM)
  list(APPEND _tool_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
  list(APPEND _tool_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(CUDA_COMPILER)
  list(APPEND _tool_args "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}")
endif()
if(LAUNCHER)  # the compiler cache of gpipe's own build (gpipeCompilerCache.cmake)
  # A list does not survive a -D argument of a list of arguments: an initial cache file holds it.
  string(REPLACE "|" ";" _launcher "${LAUNCHER}")
  set(_initial_cache "${BUILD_DIR}/consumer-launcher.cmake")
  file(WRITE "${_initial_cache}"
    "set(CMAKE_CXX_COMPILER_LAUNCHER \"${_launcher}\" CACHE STRING \"\")\n"
    "set(CMAKE_CUDA_COMPILER_LAUNCHER \"${_launcher}\" CACHE STRING \"\")\n")
  list(APPEND _tool_args -C "${_initial_cache}")
endif()

_gpipe_step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${_prefix}"
            ${_config_args})
_gpipe_step("configure consumer" "${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${_consumer_build}"
            -G "${GENERATOR}" ${_tool_args} ${_build_type_args}
            "-DCMAKE_PREFIX_PATH=${_prefix}"
            -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

# The package must come from the fresh prefix, not from a gpipe installed elsewhere.
file(STRINGS "${_consumer_build}/CMakeCache.txt" _gpipe_dir REGEX "^gpipe_DIR:")
string(REGEX REPLACE "^gpipe_DIR:[A-Z]+=" "" _gpipe_dir "${_gpipe_dir}")
file(REAL_PATH "${_prefix}" _real_prefix)
file(REAL_PATH "${_gpipe_dir}" _real_gpipe_dir)
string(FIND "${_real_gpipe_dir}/" "${_real_prefix}/" _at)
if(NOT _at EQUAL 0)
  message(FATAL_ERROR "consumer found gpipe in ${_gpipe_dir}, not under ${_prefix}")
endif()

_gpipe_step("build consumer" "${CMAKE_COMMAND}" --build "${_consumer_build}" ${_config_args})

set(_app "${_consumer_build}/app")
if(CONFIG AND NOT EXISTS "${_app}")
  set(_app "${_consumer_build}/${CONFIG}/app")  # multi-config generators
endif()
_gpipe_step("run consumer" "${_app}")
message(STATUS "consumer says: ${_step_output}")
set(_header_only_output "${_step_output}")

get_filename_component(_app_dir "${_app}" DIRECTORY)
_gpipe_step("run compiled consumer" "${_app_dir}/app_compiled")
if(NOT _step_output STREQUAL _header_only_output)
  message(FATAL_ERROR "app_compiled (gpipe::compiled) printed\n${_step_output}\nbut app "
                      "(gpipe::gpipe)\n${_header_only_output}")
endif()
if(EXISTS "${_app_dir}/cuda_app")
  _gpipe_step("run CUDA consumer" "${_app_dir}/cuda_app")
  message(STATUS "CUDA consumer says: ${_step_output}")
endif()
