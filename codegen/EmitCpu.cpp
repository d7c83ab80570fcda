// The CPU backend of the generated training step (codegen/EmitBackend.h): the walk of
// codegen/EmitStep.cpp spelled for the CPU runtime (codegen/runtime/cpu/): step.cpp includes
// cpu/tally_rt.h, every op sets the `op_class` global the kernel timer reads, the regions are
// host memory, and data parallelism runs on MPI processes (driver/tally_comm.h). Its
// CMakeLists.txt is codegen/templates/cpu.cmake.in (OpenBLAS, OpenMP; MPI for data > 1).
#include "codegen/EmitBackend.h"

namespace tally::codegen {

const Backend &cpuBackend() {
  static const Backend be = {
      "cpu", "CPU", "on the CPU", "step.cpp", "cpu/tally_rt.h", "", "MPI", false,
      "cpu.cmake.in",
      "driver/tally_comm.h",
      "cpu-data-parallel.cmake.in",
      {"cuda/", "driver/driver_cuda.cu", "driver/tally_step_cuda.h", "driver/tally_comm_nccl.h"},
      nullptr,
      nullptr};
  return be;
}

std::string emitCpuStep(const Analysis &a, const EmitOptions &options, std::vector<File> &out) {
  return emitStep(a, options, cpuBackend(), out);
}

} // namespace tally::codegen
