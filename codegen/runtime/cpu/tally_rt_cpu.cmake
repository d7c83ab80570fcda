# tally CPU runtime: defines the header-only interface target `tally_rt_cpu` (include path,
# OpenMP, OpenBLAS from Debian's libopenblas-dev via pkg-config). Included by tests/step and by
# the CMakeLists.txt of generated training steps; safe to include twice.
# TALLY_RT_NATIVE (default ON): compile the kernels for this machine's vector units
# (-march=native); turn it off for binaries that must run on another CPU.
option(TALLY_RT_NATIVE "Compile the tally CPU runtime with -march=native" ON)
if(NOT TARGET tally_rt_cpu)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(TALLY_OPENBLAS REQUIRED IMPORTED_TARGET openblas)
  add_library(tally_rt_cpu INTERFACE)
  target_include_directories(tally_rt_cpu INTERFACE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(tally_rt_cpu INTERFACE OpenMP::OpenMP_CXX PkgConfig::TALLY_OPENBLAS)
  target_compile_features(tally_rt_cpu INTERFACE cxx_std_17)
  # The runtime never reads errno: without it sqrtf is one instruction with no branch to the
  # library's error path, so loops taking square roots (the optimizer updates) vectorise: Adam
  # 3-4x faster on the 2-vCPU VM. The results are the same instructions' results.
  target_compile_options(tally_rt_cpu INTERFACE -fno-math-errno)
  if(TALLY_RT_NATIVE)
    target_compile_options(tally_rt_cpu INTERFACE -march=native)
  endif()
endif()
