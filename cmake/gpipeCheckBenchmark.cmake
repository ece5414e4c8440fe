# cmake -DPROGRAM=<bench_x> -DOUT=<x.json> [-DEXPECT_ANY=<c1,c2,...>] [-DLAUNCHER=<l1,l2,...>]
#       -P gpipeCheckBenchmark.cmake [-- <program arguments>...]
#
# A benchmark program's smoke test: runs PROGRAM with the arguments after `--`, writing Google Benchmark's JSON to
# OUT, and fails unless the program exits 0, ran at least one benchmark, no benchmark reported an
# error, every benchmark ran at least one iteration, every counter is a finite number, and each
# benchmark has at least one of the counters EXPECT_ANY names (if given). It checks that the
# program runs and reports, not what it measures. LAUNCHER, if given, runs the program (mpiexec
# and its arguments, say).

cmake_minimum_required(VERSION 3.25)
foreach(_var PROGRAM OUT)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "gpipeCheckBenchmark.cmake: pass -D${_var}=...")
  endif()
endforeach()

string(REPLACE "," ";" EXPECT_ANY "${EXPECT_ANY}")
string(REPLACE "," ";" LAUNCHER "${LAUNCHER}")
set(_args "")
set(_after FALSE)
math(EXPR _last_arg "${CMAKE_ARGC} - 1")
foreach(_a RANGE ${_last_arg})
  if(_after)
    list(APPEND _args "${CMAKE_ARGV${_a}}")
  elseif(CMAKE_ARGV${_a} STREQUAL "--")
    set(_after TRUE)
  endif()
endforeach()

file(REMOVE "${OUT}")
execute_process(
  COMMAND ${LAUNCHER} "${PROGRAM}" ${_args} "--benchmark_out=${OUT}" --benchmark_out_format=json
  RESULT_VARIABLE _rc)
if(NOT _rc STREQUAL "0")
  message(FATAL_ERROR "${PROGRAM} exited with ${_rc}")
endif()
if(NOT EXISTS "${OUT}")
  message(FATAL_ERROR "${PROGRAM} wrote no ${OUT}")
endif()

file(READ "${OUT}" _json)
if(_json STREQUAL "")
  message(FATAL_ERROR "${PROGRAM} ran no benchmark (its filter matched none?)")
endif()
string(JSON _count ERROR_VARIABLE _error LENGTH "${_json}" benchmarks)
if(_error)
  # Google Benchmark writes a NaN or infinite counter as NaN / Infinity, which is not JSON.
  message(FATAL_ERROR "${OUT} is not valid JSON (a NaN or infinite counter?): ${_error}")
endif()
if(_count EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} ran no benchmark")
endif()

# Keys of a benchmark's JSON object that are not counters.
set(_fixed name family_index per_family_instance_index run_name run_type repetitions
  repetition_index threads iterations real_time cpu_time time_unit label aggregate_name
  aggregate_unit error_occurred error_message manual_time)
math(EXPR _last "${_count} - 1")
foreach(_i RANGE ${_last})
  string(JSON _name GET "${_json}" benchmarks ${_i} name)
  string(JSON _failed ERROR_VARIABLE _none GET "${_json}" benchmarks ${_i} error_occurred)
  if(_failed STREQUAL "ON" OR _failed STREQUAL "true")
    string(JSON _message GET "${_json}" benchmarks ${_i} error_message)
    message(FATAL_ERROR "${_name}: ${_message}")
  endif()
  string(JSON _iterations GET "${_json}" benchmarks ${_i} iterations)
  if(NOT _iterations GREATER 0)
    message(FATAL_ERROR "${_name}: ran ${_iterations} iterations")
  endif()
  string(JSON _keys LENGTH "${_json}" benchmarks ${_i})
  math(EXPR _last_key "${_keys} - 1")
  set(_found FALSE)
  foreach(_k RANGE ${_last_key})
    string(JSON _key MEMBER "${_json}" benchmarks ${_i} ${_k})
    if(_key IN_LIST _fixed)
      continue()
    endif()
    string(JSON _value GET "${_json}" benchmarks ${_i} "${_key}")
    if(NOT _value MATCHES "^-?[0-9]+(\\.[0-9]*)?([eE][-+]?[0-9]+)?$")
      message(FATAL_ERROR "${_name}: counter ${_key} is ${_value}, not a finite number")
    endif()
    if(_key IN_LIST EXPECT_ANY)
      set(_found TRUE)
    endif()
  endforeach()
  if(EXPECT_ANY AND NOT _found)
    message(FATAL_ERROR "${_name}: none of the counters ${EXPECT_ANY}")
  endif()
endforeach()
message(STATUS "${PROGRAM}: ${_count} benchmarks ran and reported")
