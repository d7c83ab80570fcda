# Makes a generated CUDA step link the prebuilt CUDA runtime (tests/step/cuda_rt_lib.sh) instead
# of compiling the runtime's kernels itself. cuda_step_compiles.sh configures the step's own,
# unchanged CMakeLists.txt with
#   -DCMAKE_PROJECT_INCLUDE=<this file> -DTALLY_RT_PREBUILT_LIB=<libtally_rt_cuda.a>
# CMake includes this file at the end of the step's project() call; the call deferred to the end
# of its CMakeLists.txt then force-includes tests/step/cuda_rt_extern.cuh into step.cu and
# driver_cuda.cu (declarations: nvcc compiles no runtime kernel there but the fused ones) and
# links the library into tally_step.
if(NOT TALLY_RT_PREBUILT_LIB OR NOT EXISTS "${TALLY_RT_PREBUILT_LIB}")
  message(FATAL_ERROR "TALLY_RT_PREBUILT_LIB: no prebuilt CUDA runtime at '${TALLY_RT_PREBUILT_LIB}'")
endif()
set(TALLY_RT_EXTERN_HEADER "${CMAKE_CURRENT_LIST_DIR}/cuda_rt_extern.cuh")
function(tally_link_prebuilt_runtime)
  if(NOT TARGET tally_step)
    message(FATAL_ERROR "cuda_rt_prebuilt.cmake: the generated CMakeLists.txt defines no tally_step")
  endif()
  target_compile_options(tally_step PRIVATE "SHELL:-include ${TALLY_RT_EXTERN_HEADER}")
  target_link_libraries(tally_step PRIVATE "${TALLY_RT_PREBUILT_LIB}")
endfunction()
cmake_language(DEFER CALL tally_link_prebuilt_runtime)
