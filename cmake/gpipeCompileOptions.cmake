# Flags for the project's own targets (tests, benchmarks, examples). The INTERFACE target
# gpipe::gpipe that consumers link carries none of these.

option(GPIPE_WARNINGS_AS_ERRORS "Warnings are errors in the project's own targets" ON)

# gpipe_add_warnings(<target>): warnings are errors in the project's own builds (unless
# GPIPE_WARNINGS_AS_ERRORS is OFF: scripts/gpu-check, which meets compilers CI has not seen).
# ptxas warns where a kernel spills registers or uses local memory, so that a kernel that would
# quietly lose its bandwidth to local-memory traffic fails the build instead (--Werror covers
# ptxas too).
function(gpipe_add_warnings target)
  set(ptxas -Xptxas=-warn-spills,-warn-lmem-usage)
  if(GPIPE_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror ${ptxas}>)
  else()
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra ${ptxas}>)
  endif()
endfunction()

# gpipe_add_sanitizers(<target>): applies GPIPE_SANITIZE (thread | address) to one target.
# address means ASan + UBSan, and any UBSan finding aborts (-fno-sanitize-recover=all).
# Optimization: TSan at -O1 (its tests run several times faster than at -O0, and g++ compiles
# -O1 as fast as -O0 under TSan); ASan + UBSan at -O0: UBSan's checks make -O1 twice as slow to
# compile (test_runtime_schedules.cpp: 83 s at -O1, 40 s at -O0, g++ 12), the tests are short,
# and nothing is optimized away before the checks see it.
function(gpipe_add_sanitizers target)
  if(GPIPE_SANITIZE STREQUAL "thread")
    set(flags -fsanitize=thread)
    set(optimize -O1)
  elseif(GPIPE_SANITIZE STREQUAL "address")
    set(flags -fsanitize=address,undefined -fno-sanitize-recover=all)
    set(optimize -O0)
  else()
    return()
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${flags} -fno-omit-frame-pointer ${optimize} -g1>)
  target_link_options(${target} PRIVATE ${flags})
endfunction()

# gpipe_configure_target(<target>): everything a project-owned target gets. Through the compiler
# cache (gpipeCompilerCache.cmake), C++ debug info names the source tree "." (gdb: run it from
# the source tree, or `set substitute-path`), so that the same code compiled in another folder
# gives the same object file.
function(gpipe_configure_target target)
  gpipe_add_warnings(${target})
  gpipe_add_sanitizers(${target})
  if(GPIPE_CUDA AND NOT GPIPE_CUDA_HOST_OPTIMIZE)
    target_compile_options(${target} PRIVATE
      $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<NOT:$<CONFIG:Debug>>>:-O0>)
  endif()
  if(GPIPE_COMPILER_LAUNCHER)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fdebug-prefix-map=${PROJECT_SOURCE_DIR}=.>)
  endif()
endfunction()

# gpipe_use_cuda_emulation(<target>): the target's CUDA code (kernels, backend, CUDA benchmark
# programs) is compiled by the host compiler against the CUDA headers and runs on the CPU emulator
# of tests/support/cuda_emulation.hpp, which its one source includes first. No cudart, cuBLAS or
# NCCL is linked. Device code's `#pragma unroll` means nothing to the host compiler; packed loads
# reinterpret floats; a misaligned packed load (a fault on a GPU) stops the program. Not with a
# sanitizer: the emulator switches stacks. Optimized builds compile it at -O1: 21% less compile
# time than -O2 (test_kernels_emulated.cpp: 36 s against 46 s, g++ 12) and the emulated tests run
# as fast (35 s both), their time going to the emulator's threads and coroutines; the same code
# is compiled at the build's level by nvcc and, outside the kernels, by the host tests.
#
# The emulator's CUDA runtime, cuBLAS and NCCL functions (and its context switch) are compiled
# once, into the static library gpipe_cuda_emulation (tests/support/cuda_emulation.cpp, made on
# first use), which every such target links; the target's own source still includes
# support/cuda_emulation.hpp first, with GPIPE_CUDA_EMULATION_LINKED defined so that it declares
# rather than defines them. That saves about 9 s of compile per emulated program.
#
# Likewise the CUDA backend's runtime for cuda::Backend (step runners, parameter store, optimizer
# updates: gpipe/backend/cuda/compiled.cuh) is compiled once on the emulator, into the static
# library gpipe_cuda_compiled_emulation (src/cuda.cu), which defines GPIPE_COMPILED_CUDA for every
# such target: their sources see those instantiations as extern templates.
function(_gpipe_cuda_emulation_flags target)
  target_include_directories(${target} SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_compile_options(${target} PRIVATE -Wno-unknown-pragmas -fno-strict-aliasing
                         -fsanitize=alignment -fno-sanitize-recover=alignment
                         $<$<NOT:$<CONFIG:Debug>>:-O1>)
  target_link_options(${target} PRIVATE -fsanitize=alignment)
  target_link_libraries(${target} PRIVATE Threads::Threads)
endfunction()
function(gpipe_use_cuda_emulation target)
  if(NOT TARGET gpipe_cuda_emulation)
    add_library(gpipe_cuda_emulation STATIC "${PROJECT_SOURCE_DIR}/tests/support/cuda_emulation.cpp")
    target_link_libraries(gpipe_cuda_emulation PRIVATE gpipe::core)
    gpipe_configure_target(gpipe_cuda_emulation)
    _gpipe_cuda_emulation_flags(gpipe_cuda_emulation)
  endif()
  if(NOT TARGET gpipe_cuda_compiled_emulation)
    # A generated wrapper, as gpipe_add_emulated_executable's, naming src/cuda.cu relative to the
    # source tree (on its include path), so that it reads the same in every clone.
    set(_wrapper "${PROJECT_BINARY_DIR}/emulated/gpipe_cuda_compiled.cpp")
    file(CONFIGURE OUTPUT "${_wrapper}" CONTENT
      "// Generated: src/cuda.cu on the CUDA emulator.\n#include \"support/cuda_emulation.hpp\"\n#include \"src/cuda.cu\"\n")
    add_library(gpipe_cuda_compiled_emulation STATIC "${_wrapper}")
    target_include_directories(gpipe_cuda_compiled_emulation PRIVATE "${PROJECT_SOURCE_DIR}")
    target_compile_definitions(gpipe_cuda_compiled_emulation
      PUBLIC GPIPE_COMPILED_CUDA PRIVATE GPIPE_CUDA_EMULATION_LINKED)
    target_link_libraries(gpipe_cuda_compiled_emulation PUBLIC gpipe::core gpipe_cuda_emulation)
    gpipe_configure_target(gpipe_cuda_compiled_emulation)
    _gpipe_cuda_emulation_flags(gpipe_cuda_compiled_emulation)
  endif()
  _gpipe_cuda_emulation_flags(${target})
  target_compile_definitions(${target} PRIVATE GPIPE_CUDA_EMULATION_LINKED)
  target_link_libraries(${target} PRIVATE gpipe_cuda_compiled_emulation gpipe_cuda_emulation)
endfunction()

# gpipe_add_emulated_executable(<target> <source.cu>): an executable of <source.cu> (a CUDA program
# of the project: a benchmark, an example) on the CUDA emulator, compiled from a generated
# one-line wrapper that includes tests/support/cuda_emulation.hpp first. Links gpipe::gpipe.
function(gpipe_add_emulated_executable target source)
  get_filename_component(_name "${source}" NAME_WLE)
  set(_wrapper "${CMAKE_CURRENT_BINARY_DIR}/emulated/${_name}.cpp")
  # The include names the source relative to the directory of the CMakeLists that adds it, which
  # is on the include path: the wrapper reads the same in every clone (the compiler cache hashes
  # it).
  if(IS_ABSOLUTE "${source}")
    file(RELATIVE_PATH source "${CMAKE_CURRENT_SOURCE_DIR}" "${source}")
  endif()
  file(CONFIGURE OUTPUT "${_wrapper}" CONTENT
    "// Generated: ${_name}.cu on the CUDA emulator.\n#include \"support/cuda_emulation.hpp\"\n#include \"${source}\"\n")
  add_executable(${target} "${_wrapper}")
  target_link_libraries(${target} PRIVATE gpipe::gpipe)
  target_include_directories(${target} PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
  gpipe_configure_target(${target})
  gpipe_use_cuda_emulation(${target})
endfunction()

# gpipe_machine_has_gpu(<var>): TRUE in <var> when this machine has an NVIDIA GPU that the
# driver lists (nvidia-smi -L), else FALSE. Decides which CUDA architectures a build compiles and
# whether the host code of its .cu files is optimized (GPIPE_CUDA_HOST_OPTIMIZE).
function(gpipe_machine_has_gpu var)
  set(_has FALSE)
  find_program(GPIPE_NVIDIA_SMI nvidia-smi)
  if(GPIPE_NVIDIA_SMI)
    execute_process(COMMAND "${GPIPE_NVIDIA_SMI}" -L RESULT_VARIABLE _result
                    OUTPUT_VARIABLE _gpus ERROR_QUIET)
    if(_result EQUAL 0 AND _gpus MATCHES "GPU [0-9]")
      set(_has TRUE)
    endif()
  endif()
  set(${var} ${_has} PARENT_SCOPE)
endfunction()
