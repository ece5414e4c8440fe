# cmake -DCONFIG=<compile_check_config.cmake> -DSOURCE=<file.cpp> -P gpipeCheckCompile.cmake
#
# Compiles SOURCE with -fsyntax-only and checks the outcome its first line asks for:
#   // expect: <regex>     must fail, with compiler output matching <regex> (CMake regex)
#   // expect-compiles     must compile
# CONFIG sets GPIPE_CXX_COMPILER, GPIPE_CXX_FLAGS and GPIPE_INCLUDE_DIRS (tests/compile_fail).

cmake_minimum_required(VERSION 3.25)
foreach(_var CONFIG SOURCE)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "gpipeCheckCompile.cmake: pass -D${_var}=...")
  endif()
endforeach()
include("${CONFIG}")

file(READ "${SOURCE}" _head LIMIT 4096)
string(REGEX MATCH "^[^\n]*" _first "${_head}")
string(REGEX REPLACE "[ \t\r]+$" "" _first "${_first}")
if(_first MATCHES "^// expect-compiles$")
  set(_expect_failure FALSE)
elseif(_first MATCHES "^// expect:[ \t]*(.+)$")
  set(_expect_failure TRUE)
  set(_regex "${CMAKE_MATCH_1}")
else()
  message(FATAL_ERROR "${SOURCE}: the first line must be `// expect: <regex>` or "
                      "`// expect-compiles`, found `${_first}`")
endif()

separate_arguments(_flags UNIX_COMMAND "${GPIPE_CXX_FLAGS}")
set(_includes "")
foreach(_dir IN LISTS GPIPE_INCLUDE_DIRS)
  list(APPEND _includes "-I${_dir}")
endforeach()
set(_command "${GPIPE_CXX_COMPILER}" ${_flags} -std=c++20 -fsyntax-only
             -fdiagnostics-color=never ${_includes} "${SOURCE}")

# ASCII quotes in diagnostics, so a regex written on one machine matches on another.
set(ENV{LC_ALL} C)
execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
list(JOIN _command " " _command_line)

# message(FATAL_ERROR) re-flows its text, so the compiler's output goes out verbatim first.
function(_gpipe_fail why)
  message(NOTICE "${_command_line}\n${_out}")
  message(FATAL_ERROR "${SOURCE}: ${why}")
endfunction()

if(NOT _expect_failure)
  if(NOT _rc EQUAL 0)
    _gpipe_fail("expected to compile, but it failed (${_rc})")
  endif()
  message(STATUS "compiles, as expected")
elseif(_rc EQUAL 0)
  _gpipe_fail("expected a compile error matching `${_regex}`, but it compiled")
elseif(NOT _out MATCHES "${_regex}")
  _gpipe_fail("failed to compile, as expected, but no output matches `${_regex}`")
else()
  message(STATUS "fails to compile with output matching `${_regex}`, as expected")
endif()
