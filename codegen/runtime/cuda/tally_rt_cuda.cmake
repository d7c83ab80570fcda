# tally CUDA runtime: defines the header-only interface target `tally_rt_cuda` (include path,
# cuBLASLt and cuDNN from the CUDA toolkit, C++17). For the CMakeLists.txt of generated CUDA
# training steps, which enable CUDA themselves (project(... LANGUAGES CXX CUDA),
# CMAKE_CUDA_ARCHITECTURES 90). cuDNN 9 (fused attention, cudnn_attention.cuh) is looked for in the
# toolkit's folders, then the system's (-DTALLY_CUDNN_LIBRARY=/path/libcudnn.so to name it).
# Safe to include twice.
if(NOT TARGET tally_rt_cuda)
  find_package(CUDAToolkit REQUIRED)
  find_library(TALLY_CUDNN_LIBRARY cudnn
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  find_path(TALLY_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(NOT TALLY_CUDNN_LIBRARY OR NOT TALLY_CUDNN_INCLUDE)
    message(FATAL_ERROR "cuDNN 9 not found (libcudnn.so, cudnn.h): the CUDA step's attention needs it; "
                        "pass -DTALLY_CUDNN_LIBRARY=... and -DTALLY_CUDNN_INCLUDE=...")
  endif()
  add_library(tally_rt_cuda INTERFACE)
  target_include_directories(tally_rt_cuda INTERFACE ${CMAKE_CURRENT_LIST_DIR} ${TALLY_CUDNN_INCLUDE})
  target_link_libraries(tally_rt_cuda INTERFACE CUDA::cublasLt CUDA::cudart ${TALLY_CUDNN_LIBRARY})
  target_compile_features(tally_rt_cuda INTERFACE cxx_std_17 cuda_std_17)
endif()
