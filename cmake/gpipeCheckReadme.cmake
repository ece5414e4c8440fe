# cmake -DCONFIG=<readme_check_config.cmake> -DREADME=<README.md> -DCONTEXTS=<dir> -DWORK=<dir>
#       -P gpipeCheckReadme.cmake
#
# The README's C++ must compile: every ```cpp block whose opening fence follows a line
#   <!-- compiled: NAME -->
# is put into CONTEXTS/NAME.cpp.in, where @BLOCK@ stands for the block and @PREVIOUS@ for the
# compiled block before it (for a block that uses the one above); the block's #include lines move
# to the top of the file. Each file is compiled with -fsyntax-only (instantiating what it uses);
# the check fails naming the README line of a block that does not compile. A context whose first
# line is `// needs: mpi` is skipped, with a message, where CONFIG has no MPI include directories.
# CONFIG sets GPIPE_CXX_COMPILER, GPIPE_CXX_FLAGS, GPIPE_INCLUDE_DIRS, GPIPE_MPI_INCLUDE_DIRS.
#
# A ```cpp block whose opening fence follows a line
#   <!-- quoted: PATH -->
# must be a verbatim part of the file PATH (relative to the README's directory), so that a README
# that walks through an example file cannot drift from it.

cmake_minimum_required(VERSION 3.25)
foreach(_var CONFIG README CONTEXTS WORK)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "gpipeCheckReadme.cmake: pass -D${_var}=...")
  endif()
endforeach()
include("${CONFIG}")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# Lines as a CMake list: ; [ ] would split or join list elements, so they travel escaped.
file(READ "${README}" _text)
string(REPLACE ";" "@SEMICOLON@" _text "${_text}")
string(REPLACE "[" "@LBRACKET@" _text "${_text}")
string(REPLACE "]" "@RBRACKET@" _text "${_text}")
string(REPLACE "\n" ";" _lines "${_text}")

function(_gpipe_unescape out text)
  string(REPLACE "@SEMICOLON@" ";" text "${text}")
  string(REPLACE "@LBRACKET@" "[" text "${text}")
  string(REPLACE "@RBRACKET@" "]" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

set(ENV{LC_ALL} C)
separate_arguments(_flags UNIX_COMMAND "${GPIPE_CXX_FLAGS}")
set(_line 0)
set(_context "")
set(_in_block FALSE)
set(_previous "")
set(_compiled 0)
set(_quote "")
set(_quoted 0)
get_filename_component(_root "${README}" DIRECTORY)
foreach(_l IN LISTS _lines)
  math(EXPR _line "${_line} + 1")
  if(_in_block AND NOT _quote STREQUAL "")
    if(_l MATCHES "^```")
      set(_in_block FALSE)
      _gpipe_unescape(_raw "${_raw}")
      file(READ "${_root}/${_quote}" _quoted_text)
      string(FIND "${_quoted_text}" "${_raw}" _at)
      if(_at EQUAL -1)
        message(FATAL_ERROR "README.md line ${_start}: the block is not a verbatim part of "
                            "${_quote} (the file changed, or the README did)")
      endif()
      message(STATUS "README line ${_start}: quotes ${_quote}")
      math(EXPR _quoted "${_quoted} + 1")
      set(_quote "")
    else()
      string(APPEND _raw "${_l}\n")
    endif()
  elseif(_in_block)
    if(_l MATCHES "^```")
      set(_in_block FALSE)
      _gpipe_unescape(_block "${_block}")
      _gpipe_unescape(_includes "${_includes}")
      file(READ "${CONTEXTS}/${_context}.cpp.in" _template)
      set(_dirs ${GPIPE_INCLUDE_DIRS})
      if(_template MATCHES "^// needs: mpi")
        if(NOT GPIPE_MPI_INCLUDE_DIRS)
          message(STATUS "README line ${_start}: skipped (no MPI found)")
          set(_previous "${_block}")
          continue()
        endif()
        list(APPEND _dirs ${GPIPE_MPI_INCLUDE_DIRS})
      endif()
      string(REPLACE "@BLOCK@" "${_block}" _source "${_template}")
      string(REPLACE "@PREVIOUS@" "${_previous}" _source "${_source}")
      set(_file "${WORK}/readme_line_${_start}.cpp")
      file(WRITE "${_file}" "${_includes}${_source}")
      set(_args "")
      foreach(_dir IN LISTS _dirs)
        list(APPEND _args "-I${_dir}")
      endforeach()
      execute_process(
        COMMAND "${GPIPE_CXX_COMPILER}" ${_flags} -std=c++20 -fsyntax-only -fdiagnostics-color=never
                ${_args} "${_file}"
        RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
      if(NOT _rc EQUAL 0)
        message(NOTICE "${_out}")
        message(FATAL_ERROR "README.md line ${_start}: the block does not compile in context "
                            "${_context} (${_file})")
      endif()
      message(STATUS "README line ${_start}: compiles (context ${_context})")
      math(EXPR _compiled "${_compiled} + 1")
      set(_previous "${_block}")
    elseif(_l MATCHES "^#include")
      string(APPEND _includes "${_l}\n")
    else()
      string(APPEND _block "${_l}\n")
    endif()
  elseif(_l MATCHES "^<!-- compiled: ([a-z_]+) -->")
    set(_context "${CMAKE_MATCH_1}")
  elseif(_l MATCHES "^<!-- quoted: ([A-Za-z0-9_./-]+) -->")
    set(_quote "${CMAKE_MATCH_1}")
    if(NOT EXISTS "${_root}/${_quote}")
      message(FATAL_ERROR "README.md line ${_line}: quotes ${_quote}, which does not exist")
    endif()
  elseif(_l MATCHES "^```cpp" AND NOT (_context STREQUAL "" AND _quote STREQUAL ""))
    set(_in_block TRUE)
    math(EXPR _start "${_line} + 1")
    set(_block "")
    set(_includes "")
    set(_raw "")
  elseif(NOT _l STREQUAL "")
    set(_context "")  # a marker belongs to the block right below it
    set(_quote "")
  endif()
endforeach()
if(_compiled EQUAL 0)
  message(FATAL_ERROR "README.md: no block marked <!-- compiled: ... --> was compiled")
endif()
message(STATUS "${_compiled} README blocks compile, ${_quoted} quote their files verbatim")
