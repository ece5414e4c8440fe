# gpipe_add_cuda_target(<name> [IMPORTED]): the INTERFACE library of the CUDA backend
# (<gpipe/cuda.cuh>, compiled by nvcc): gpipe::core (not the host backend's oneDNN: a program
# that also runs the host backend links gpipe::gpipe too) plus the CUDA runtime, cuBLAS and
# cuBLASLt of the CUDA toolkit (found by the caller: find_package(CUDAToolkit)), and NCCL (its
# include directory, library and GPIPE_CUDA_NCCL=1) where nccl.h and libnccl are found and
# GPIPE_ENABLE_NCCL is not OFF. Sets GPIPE_CUDA_NCCL (TRUE or FALSE) in the caller's scope. Used
# by gpipe's own build and by its installed package (gpipeConfig.cmake), so both define
# gpipe::cuda the same way.
function(gpipe_add_cuda_target name)
  if(ARGN STREQUAL "IMPORTED")
    add_library(${name} INTERFACE IMPORTED)
  else()
    add_library(${name} INTERFACE)
  endif()
  target_link_libraries(${name} INTERFACE gpipe::core CUDA::cudart CUDA::cublas CUDA::cublasLt)
  set(_nccl FALSE)
  if(NOT DEFINED GPIPE_ENABLE_NCCL OR GPIPE_ENABLE_NCCL)
    find_path(GPIPE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(GPIPE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(GPIPE_NCCL_INCLUDE_DIR AND GPIPE_NCCL_LIBRARY)
      target_include_directories(${name} INTERFACE "${GPIPE_NCCL_INCLUDE_DIR}")
      target_link_libraries(${name} INTERFACE "${GPIPE_NCCL_LIBRARY}")
      target_compile_definitions(${name} INTERFACE GPIPE_CUDA_NCCL=1)
      set(_nccl TRUE)
    endif()
  endif()
  set(GPIPE_CUDA_NCCL ${_nccl} PARENT_SCOPE)
endfunction()
