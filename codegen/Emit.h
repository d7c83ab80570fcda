// Code generation: the analyzed training step (Analysis::step, its schedule and memory plan)
// printed as a program that runs it. codegen/EmitStep.cpp walks the step once for both backends
// (codegen/EmitBackend.h: what differs), the CPU step in C++ and the CUDA step (EmitCuda.cpp);
// the kernels it calls are the runtime's (codegen/runtime/API.md), embedded in tally and copied next to
// the generated source so the folder builds on its own. shared/design/codegen.md has the plan.
#pragma once

#include "passes/Analysis.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/SMLoc.h"

#include <functional>
#include <string>
#include <vector>

namespace tally::codegen {

struct EmitOptions {
  std::string source;  ///< the .tally file's name, for the header comment
  /// "file.tally:12" for a source location, "" when unknown (the per-call comments).
  std::function<std::string(llvm::SMLoc)> where;
  /// When set, lines for `tally build`'s output: which attention engine the CUDA step runs
  /// (cuDNN's fused attention or the runtime's kernels, and why), one line per choice.
  std::vector<std::string> *notes = nullptr;
};

/// One generated file: its path relative to the output folder, and its text.
struct File {
  std::string path, text;
};

/// The CPU training step of a train plan: step.cpp (the schedule as kernel calls over the
/// memory plan's regions), CMakeLists.txt, and the runtime and driver sources under runtime/.
/// Returns "" on success, else why this plan cannot be generated (out is then unspecified).
std::string emitCpuStep(const Analysis &a, const EmitOptions &options, std::vector<File> &out);

/// The CUDA training step of a train plan: step.cu (the same calls over the same regions as
/// the CPU step, each after `ctx.where = "<op path>"`), CMakeLists.txt (nvcc from the CUDA
/// toolkit, -arch=sm_90 unless -DTALLY_CUDA_ARCH=), the CUDA runtime and driver_cuda.cu.
/// Returns "" on success, else why this plan cannot be generated for the CUDA runtime.
std::string emitCudaStep(const Analysis &a, const EmitOptions &options, std::vector<File> &out);

/// The runtime files embedded in tally at build time: path under codegen/runtime, and text.
struct RuntimeFile {
  const char *path;
  const char *text;
};
llvm::ArrayRef<RuntimeFile> runtimeFiles();

} // namespace tally::codegen
