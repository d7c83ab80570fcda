// What differs between the generated CPU and CUDA training steps. Both are printed by one
// emitter (codegen/EmitStep.cpp walks the schedule and the memory plan); a backend only spells
// the result: its includes, where the regions live (host or device memory), the op path set
// before every call on the device, the file names, the CMakeLists.txt and which runtime files
// travel with the step. codegen/EmitCuda.cpp describes the CUDA backend.
#pragma once

#include "codegen/Emit.h"

#include <string>

namespace tally::codegen {

/// The spelling of one backend's generated step (see the banner).
struct Backend {
  const char *name;           ///< "cpu", "cuda": kLayout.backend
  const char *title;          ///< "CPU", "CUDA": in messages ("the CUDA backend runs …")
  const char *machine;        ///< the header comment: "on the CPU", "on a CUDA GPU"
  const char *stepFile;       ///< "step.cpp", "step.cu"
  const char *runtimeHeader;  ///< "cpu/tally_rt.h": included, and named in the header comment
  const char *extraIncludes;  ///< included after the runtime and tally_step.h ("" for none)
  const char *parallelEngine; ///< "MPI", "NCCL": the data-parallel engine
  /// The regions are device memory: every op sets `ctx.where` to its path (the runtime names it
  /// in every error), the loss and the fp16 overflow check are copied back to the host, and the
  /// op classes are a table by path (kOpSites) instead of the `op_class` global.
  bool device;
  /// CMakeLists.txt: its template under codegen/templates/ ("cpu.cmake.in"; the emitter fills in
  /// @STEP_SOURCE@ with stepFile and @DATA_PARALLEL@ with the next one for data > 1, else "").
  const char *cmakeTemplate;
  const char *commHeader;     ///< the collectives a data-parallel step includes ("driver/tally_comm.h")
  const char *dataParallelCmakeTemplate; ///< for data > 1: find and link the engine (codegen/templates/)
  /// Embedded runtime files not copied (path prefixes under codegen/runtime, or driver/…; null
  /// ends the list early): the other backend's runtime and driver.
  const char *skip[4];
  /// Host-side checks of one op against what this backend's runtime can run, called before its
  /// call is printed with the op's kind and numbers (attention: B, S, Skv, H, Hkv, hd and row
  /// strides); "" or why not. Null: everything the walk prints runs.
  std::string (*checkAttention)(int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv, int64_t hd,
                                int64_t rowQ, int64_t rowK, int64_t rowV, bool backward);
  /// As checkAttention, for the embedding backward's scratch (rows of ids, vocabulary).
  std::string (*checkEmbeddingBackward)(int64_t rows, int64_t vocab);
  /// Files written beside the step from its finished source (the CPU's kernels.h and
  /// kernels_FAMILY.cpp: the runtime kernels it calls, instantiated in translation units of their
  /// own, which the CMakeLists.txt compiles with the step); null: none.
  void (*kernelFiles)(const std::string &stepSource, std::vector<File> &files);
};

/// The CPU backend's description (codegen/EmitCpu.cpp).
const Backend &cpuBackend();
/// The CUDA backend's description (codegen/EmitCuda.cpp).
const Backend &cudaBackend();

/// The templates of the generated CMakeLists.txt (codegen/templates/, embedded in tally at build
/// time as the runtime is): file name, and text.
llvm::ArrayRef<RuntimeFile> cmakeTemplates();

/// The training step of a train plan for backend `be`; "" or why it cannot be generated.
std::string emitStep(const Analysis &a, const EmitOptions &options, const Backend &be, std::vector<File> &out);

} // namespace tally::codegen
