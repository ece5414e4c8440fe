# gpipe_add_compiled_target(<name> <source>): the static library behind gpipe::compiled, the
# optional compiled part of gpipe: <source> (src/host.cpp; installed next to this file) compiled
# once, by the consuming project's own compiler and flags, on gpipe::gpipe, with
# GPIPE_COMPILED_HOST defined for it and for everything that links it. A program linking
# gpipe::compiled instead of gpipe::gpipe compiles only what depends on its model's types
# (backend/host/linkage.hpp, backend/host/compiled.hpp): the same code, half the compile time or
# less. Used by gpipe's own build and by its installed package (gpipeConfig.cmake).
function(gpipe_add_compiled_target name source)
  add_library(${name} STATIC "${source}")
  target_link_libraries(${name} PUBLIC gpipe::gpipe)
  target_compile_definitions(${name} PUBLIC GPIPE_COMPILED_HOST)
endfunction()
