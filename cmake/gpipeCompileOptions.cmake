# Flags for the project's own targets (tests, benchmarks, examples). The INTERFACE target
# gpipe::gpipe that consumers link carries none of these.

option(GPIPE_WARNINGS_AS_ERRORS "Warnings are errors in the project's own targets" ON)

# gpipe_add_warnings(<target>): warnings are errors in the project's own builds (unless
# GPIPE_WARNINGS_AS_ERRORS is OFF: scripts/gpu-check, which meets compilers CI has not seen).
function(gpipe_add_warnings target)
  if(GPIPE_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
  else()
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  endif()
endfunction()

# gpipe_add_sanitizers(<target>): applies GPIPE_SANITIZE (thread | address) to one target.
# address means ASan + UBSan, and any UBSan finding aborts (-fno-sanitize-recover=all).
function(gpipe_add_sanitizers target)
  if(GPIPE_SANITIZE STREQUAL "thread")
    set(flags -fsanitize=thread)
  elseif(GPIPE_SANITIZE STREQUAL "address")
    set(flags -fsanitize=address,undefined -fno-sanitize-recover=all)
  else()
    return()
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${flags} -fno-omit-frame-pointer -O1 -g>)
  target_link_options(${target} PRIVATE ${flags})
endfunction()

# gpipe_configure_target(<target>): everything a project-owned target gets.
function(gpipe_configure_target target)
  gpipe_add_warnings(${target})
  gpipe_add_sanitizers(${target})
endfunction()
