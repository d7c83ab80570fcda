// The GPU half of tests/step/cuda_check, shared by its per-dtype translation units
// (cuda_check_f32.cu, cuda_check_bf16.cu): device memory for the cases, and the cases themselves
// (cuda_check_cases.h) compiled against the CUDA runtime. Split by dtype so nvcc builds the
// halves in parallel.
#pragma once

#include "codegen/runtime/cuda/tally_rt.cuh"

#include <vector>

namespace cuda_check {
/// Device memory for the cases: freed with the Mem; download waits for the context's stream.
class Mem {
 public:
  explicit Mem(cudaStream_t s) : stream_(s) {}
  Mem(const Mem&) = delete;
  ~Mem() {
    for (void* p : blocks_) cudaFree(p);
  }
  template <class T> T* upload(const std::vector<T>& v) {
    T* p = zeros<T>(static_cast<int64_t>(v.size()));
    // Pageable source: staged before the call returns, then ordered on the kernels' stream.
    rt::cu::check(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream_),
                  "cudaMemcpyAsync", "upload", "");
    return p;
  }
  template <class T> T* zeros(int64_t n) {
    void* p = nullptr;
    rt::cu::check(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T) + 1), "cudaMalloc", "zeros", "");
    rt::cu::check(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(T) + 1, stream_), "cudaMemsetAsync", "zeros", "");
    blocks_.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T> std::vector<T> download(const T* p, int64_t n) {
    rt::cu::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", "download", "");
    std::vector<T> v(static_cast<size_t>(n));
    rt::cu::check(cudaMemcpy(v.data(), p, v.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy", "download", "");
    return v;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> blocks_;
};
}  // namespace cuda_check

#define TALLY_CHECK_NS cuda_check
#define TALLY_CHECK_CUDNN  // runCudnnCases: cuDNN's fused attention (cudnn_attention.cuh)
#include "tests/step/cuda_check_cases.h"

namespace cuda_check {
/// The cases on the GPU for one dtype (cuda_check_f32.cu / cuda_check_bf16.cu).
std::vector<tally_check::CaseResult> runGpuF32(rt::Ctx& ctx);
std::vector<tally_check::CaseResult> runGpuBf16(rt::Ctx& ctx);

/// One timed kernel of the benchmark (cuda_check_bf16.cu).
struct Bench {
  std::string name;
  double medianMs = 0, tflops = 0, flops = 0;
};
/// Times attention and matmul at GPT-2 sizes in bf16, median of `iters` runs.
std::vector<Bench> runBenchmarks(rt::Ctx& ctx, int iters);
}  // namespace cuda_check
