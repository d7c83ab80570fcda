# tally CPU runtime: defines the header-only interface target `tally_rt_cpu` (include path,
# OpenMP, OpenBLAS from Debian's libopenblas-dev via pkg-config). Included by tests/step and by
# the CMakeLists.txt of generated training steps; safe to include twice.
# TALLY_RT_NATIVE (default ON): compile the kernels for this machine's vector units
# (-march=native); turn it off for binaries that must run on another CPU.
option(TALLY_RT_NATIVE "Compile the tally CPU runtime with -march=native" ON)
if(NOT TARGET tally_rt_cpu)
  # GCC's OpenMP is its -fopenmp (libgomp ships with it): FindOpenMP's try-compiles cost 0.4 s
  # of the 1.3 s configure of every generated step (2-core machine, 2026-12-07); another
  # compiler is asked through FindOpenMP.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT TARGET OpenMP::OpenMP_CXX)
    add_library(OpenMP::OpenMP_CXX INTERFACE IMPORTED)
    set_target_properties(OpenMP::OpenMP_CXX PROPERTIES INTERFACE_COMPILE_OPTIONS -fopenmp
                          INTERFACE_LINK_OPTIONS -fopenmp)
  else()
    find_package(OpenMP REQUIRED COMPONENTS CXX)
  endif()
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
  # Nor does it read the floating-point exception flags. With them kept (GCC's default
  # -ftrapping-math) GCC will not evaluate both sides of a select whose side may raise one
  # (sigmoid's e·d for x < 0, the erf fit's branches), so on a CPU without AVX-512's masked
  # vectors (the 2-vCPU AMD EPYC VM: AVX2) the branch-free rt::vm math stayed scalar: exp, SiLU
  # and GELU at 5-8 ns an element, 0.8-1.9 with this flag (one thread, 65,536 floats;
  # docs/performance.md). IEEE results are unchanged: no reassociation, no flush to zero.
  target_compile_options(tally_rt_cpu INTERFACE -fno-trapping-math)
  if(TALLY_RT_NATIVE)
    target_compile_options(tally_rt_cpu INTERFACE -march=native)
  endif()
endif()
