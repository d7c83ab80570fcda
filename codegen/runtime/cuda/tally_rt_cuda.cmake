# tally CUDA runtime: defines the header-only interface target `tally_rt_cuda` (include path,
# cuBLASLt from the CUDA toolkit, C++17). For the CMakeLists.txt of generated CUDA training steps,
# which enable CUDA themselves (project(... LANGUAGES CXX CUDA), CMAKE_CUDA_ARCHITECTURES 90).
# Safe to include twice.
if(NOT TARGET tally_rt_cuda)
  find_package(CUDAToolkit REQUIRED)
  add_library(tally_rt_cuda INTERFACE)
  target_include_directories(tally_rt_cuda INTERFACE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(tally_rt_cuda INTERFACE CUDA::cublasLt CUDA::cudart)
  target_compile_features(tally_rt_cuda INTERFACE cxx_std_17 cuda_std_17)
endif()
