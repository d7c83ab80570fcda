// The runtime headers and the driver, embedded at build time (scripts/embed_runtime.cmake), so
// that `tally build` can copy them next to a generated step without knowing where the sources are.
#include "codegen/Emit.h"

namespace tally::codegen {

llvm::ArrayRef<RuntimeFile> runtimeFiles() {
  static const RuntimeFile files[] = {
#include "RuntimeFiles.inc"
  };
  return files;
}

} // namespace tally::codegen
