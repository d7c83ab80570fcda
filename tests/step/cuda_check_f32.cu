// tests/step/cuda_check, fp32 half: the cases in fp32 on the GPU.
#include "tests/step/cuda_check_gpu.cuh"

namespace cuda_check {

std::vector<tally_check::CaseResult> runGpuF32(rt::Ctx& ctx) {
  Mem m(ctx.stream);
  return runCases<float>(ctx, m, "f32");
}

}  // namespace cuda_check
