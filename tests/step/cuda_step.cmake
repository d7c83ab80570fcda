# cuda-step-compiles (included by the top-level CMakeLists.txt): `tally build --backend cuda`
# on the e2e GPT, Llama block and data-parallel dp2, dp2o, dp2z (MPI + NCCL) of tests/step/e2e/, then the
# generated CMakeLists.txt configured and built with nvcc (-arch=sm_90); then tp2's and pp2's step.cu
# (tensor and pipeline parallel over NCCL) compiled into dp2's build and linked: compile and link only,
# nothing runs (no GPU here). Skipped
# (exit 77, reason printed) where nvcc is absent. Label "cuda": minutes of nvcc on a small machine.
# The steps link the CUDA runtime prebuilt once by the fixture cuda_rt (cuda-runtime-lib,
# tests/step/cuda_tests.cmake) rather than each compiling its kernels again.
include(CheckLanguage)
check_language(CUDA)
add_test(NAME cuda-step-compiles
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/step/cuda_step_compiles.sh $<TARGET_FILE:tally> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR}/cuda-step "${CMAKE_CUDA_COMPILER}")
set_tests_properties(cuda-step-compiles PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 3600 LABELS "cuda;slow"
                     FIXTURES_REQUIRED cuda_rt COST 950   # started first: tests/step/cuda_tests.cmake
                     ENVIRONMENT "TALLY_CUDA_RT_LIB=${CMAKE_BINARY_DIR}/cuda-rt/libtally_rt_cuda.a${STEP_CCACHE_ENV}")
