# CUDA runtime tests, included by tests/step/CMakeLists.txt (its hook for tests/step/cuda*). CUDA is never enabled for the
# build itself (a machine without nvcc configures and builds as before): check_language(CUDA)
# only looks for nvcc, and the tests compile with it at test time.
#   cuda-runtime-lib      the CUDA runtime compiled once per test run (tests/step/cuda_rt_lib.sh:
#                         every kernel for float, bf16 and fp16) into cuda-rt/libtally_rt_cuda.a;
#                         the fixture cuda_rt, which the two tests below require and link
#                         (TALLY_CUDA_RT_LIB) instead of compiling the runtime in each of their
#                         translation units. Up to date when its inputs have not changed.
#   cuda-check-compiles   builds tests/step/cuda_check (every CUDA kernel for float, bf16, fp16,
#                         and the CPU reference) with nvcc -arch=sm_90; skipped (exit 77, with the
#                         reason printed) where nvcc is absent. Label "cuda": slow (minutes).
#   gpu-plans             the 1-GPU plans of scripts/gpu-validate analyse, with hand-derived checks.
#   gpu-torch-baseline-smoke  scripts/gpu_torch_baseline.py --smoke on the CPU (system python3).
#   gpu-validate-degrades     scripts/gpu-validate's quick parts on a machine without a GPU.
#   gpu-validate-syntax   bash -n on scripts/gpu-validate and the build script.
include_guard(GLOBAL)
find_package(Python3 REQUIRED COMPONENTS Interpreter)  # the top level finds it after tests/step
include(CheckLanguage)
check_language(CUDA)
set(TALLY_NVCC "${CMAKE_CUDA_COMPILER}")
if(NOT TALLY_NVCC)
  set(TALLY_NVCC "")
endif()
# Three nvcc processes at once: PROCESSORS 2 keeps ctest -j2 from starting another test beside it.
# COST: ctest -j starts the most costly tests first, so the CUDA chain (the library, then the two
# compiles; the longest on a 2-core machine) starts at once instead of last (a clean checkout has
# no measured costs; without COST they ran after every other test: ctest -j2 took 474 s, not 390).
add_test(NAME cuda-runtime-lib
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/step/cuda_rt_lib.sh ${CMAKE_BINARY_DIR}/cuda-rt ${TALLY_NVCC})
set_tests_properties(cuda-runtime-lib PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1800 LABELS "cuda;slow"
                     FIXTURES_SETUP cuda_rt PROCESSORS 2 COST 1000)
set(TALLY_CUDA_RT_LIB ${CMAKE_BINARY_DIR}/cuda-rt/libtally_rt_cuda.a)
add_test(NAME cuda-check-compiles
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/step/cuda_check_build.sh ${CMAKE_BINARY_DIR}/cuda-check ${TALLY_NVCC})
set_tests_properties(cuda-check-compiles PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 3600 LABELS "cuda;slow"
                     FIXTURES_REQUIRED cuda_rt COST 900
                     ENVIRONMENT "TALLY_CUDA_RT_LIB=${TALLY_CUDA_RT_LIB}")

add_test(NAME gpu-plans
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/gpu/check_plans.py $<TARGET_FILE:tally>
                 ${CMAKE_SOURCE_DIR})

# Debian's python3-torch is for the system python (/usr/bin/python3), not a pyenv one.
find_program(TALLY_SYSTEM_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)
set(TALLY_TORCH_OK 1)
if(TALLY_SYSTEM_PYTHON)
  execute_process(COMMAND ${TALLY_SYSTEM_PYTHON} -c "import torch" RESULT_VARIABLE TALLY_TORCH_OK
                  OUTPUT_QUIET ERROR_QUIET)
endif()
if(TALLY_SYSTEM_PYTHON AND TALLY_TORCH_OK EQUAL 0)
  add_test(NAME gpu-torch-baseline-smoke
           COMMAND ${TALLY_SYSTEM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/gpu/check_baseline_smoke.py ${TALLY_SYSTEM_PYTHON}
                   ${CMAKE_SOURCE_DIR}/scripts/gpu_torch_baseline.py ${CMAKE_BINARY_DIR}/gpu-baseline-smoke.json)
else()
  add_test(NAME gpu-torch-baseline-smoke
           COMMAND bash -c "echo 'skipped: /usr/bin/python3 cannot import torch (apt install python3-torch)'; exit 77")
  set_tests_properties(gpu-torch-baseline-smoke PROPERTIES SKIP_RETURN_CODE 77)
endif()
set_tests_properties(gpu-plans gpu-torch-baseline-smoke PROPERTIES LABELS slow)

# gpu-validate without a GPU: failures reported, the table still printed last.
if(TALLY_SYSTEM_PYTHON AND TALLY_TORCH_OK EQUAL 0)
  add_test(NAME gpu-validate-degrades
           COMMAND ${TALLY_SYSTEM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/gpu/check_validate_cpu.py ${CMAKE_SOURCE_DIR}
                   $<TARGET_FILE:tally> ${TALLY_SYSTEM_PYTHON} ${CMAKE_BINARY_DIR}/gpu-validate-cpu)
  set_tests_properties(gpu-validate-degrades PROPERTIES LABELS slow)
endif()

add_test(NAME gpu-validate-syntax
         COMMAND bash -c "bash -n '${CMAKE_SOURCE_DIR}/scripts/gpu-validate' && bash -n '${CMAKE_SOURCE_DIR}/tests/step/cuda_check_build.sh'")
set_tests_properties(gpu-validate-syntax PROPERTIES LABELS slow)
