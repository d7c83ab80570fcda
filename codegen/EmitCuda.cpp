// The CUDA backend of the generated training step: the same walk, calls and memory plan as the
// CPU step (codegen/EmitStep.cpp), spelled for the CUDA runtime (codegen/runtime/cuda/, the same
// functions and arguments with rt::Ctx = rt::cu::Ctx). What this file adds:
// - step.cu includes cuda/tally_rt.cuh; every op sets `ctx.where = "<op path>"` before its call,
//   so a failed launch, CUDA call or cuBLASLt call names the op; the loss and the fp16 overflow
//   check's sum of squares are copied back from device memory;
// - the host-side checks of the CUDA runtime's limits (codegen/runtime/cuda/launch.h, the same
//   functions the runtime calls before each launch), so a plan it cannot run is refused at
//   `tally build` with the op and its source line, not at the first step on a GPU;
// - the CMakeLists.txt (codegen/templates/cuda.cmake.in): nvcc from the CUDA toolkit
//   (/usr/local/cuda unless CMAKE_CUDA_COMPILER is given), sm_90 unless -DTALLY_CUDA_ARCH=,
//   cuBLASLt; the driver is driver/driver_cuda.cu.
#include "codegen/EmitBackend.h"

#include "codegen/runtime/cuda/launch.h"
#include "passes/Passes.h"

namespace tally::codegen {

static_assert(kCudaStepWorkspaceBytes == rt::cuda_plan::kDefaultWorkspaceBytes,
              "the memory estimate of the CUDA step prices the workspace its context allocates");

namespace {

std::string checkAttention(int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv, int64_t hd, int64_t rowQ,
                           int64_t rowK, int64_t rowV, bool backward) {
  namespace cp = rt::cuda_plan;
  std::string bad = cp::checkAttention(B, S, Skv, H, Hkv, hd);
  if (bad.empty())
    bad = cp::checkAttentionRows(H, Hkv, hd, rowQ, rowK, rowV);
  if (!bad.empty())
    return "the CUDA runtime's attention refuses it: " + bad;
  if (backward) {
    int64_t need = cp::attentionScratchBytes(B, H, S);
    if (need > cp::kDefaultWorkspaceBytes)
      return "the CUDA attention backward needs " + std::to_string(need) + " bytes of workspace scratch; the "
             "context has " + std::to_string(cp::kDefaultWorkspaceBytes);
  }
  return "";
}

std::string checkEmbeddingBackward(int64_t rows, int64_t vocab) {
  namespace cp = rt::cuda_plan;
  int64_t need = cp::embeddingScratchBytes(rows, vocab);
  if (need > cp::kDefaultWorkspaceBytes)
    return "the CUDA embedding backward needs " + std::to_string(need) + " bytes of workspace scratch for " +
           std::to_string(rows) + " ids over a vocabulary of " + std::to_string(vocab) + "; the context has " +
           std::to_string(cp::kDefaultWorkspaceBytes);
  return "";
}

} // namespace

const Backend &cudaBackend() {
  static const Backend be = {
      "cuda", "CUDA", "on a CUDA GPU", "step.cu", "cuda/tally_rt.cuh", "#include \"driver/tally_step_cuda.h\"\n",
      "NCCL", true,
      "cuda.cmake.in",
      "driver/tally_comm_nccl.h",
      "cuda-data-parallel.cmake.in",
      {"cpu/", "driver/driver_cpu.cpp", "driver/tally_comm.h", nullptr},
      checkAttention,
      checkEmbeddingBackward,
      nullptr};
  return be;
}

std::string emitCudaStep(const Analysis &a, const EmitOptions &options, std::vector<File> &out) {
  return emitStep(a, options, cudaBackend(), out);
}

} // namespace tally::codegen
