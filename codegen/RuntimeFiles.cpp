// The runtime headers and the driver, embedded at build time (scripts/embed_runtime.cmake), so
// that `tally build` can copy them next to a generated step without knowing where the sources are;
// and the templates of the step's CMakeLists.txt (codegen/templates/), embedded the same way.
#include "codegen/EmitBackend.h"

namespace tally::codegen {

llvm::ArrayRef<RuntimeFile> runtimeFiles() {
  static const RuntimeFile files[] = {
#include "RuntimeFiles.inc"
  };
  return files;
}

llvm::ArrayRef<RuntimeFile> cmakeTemplates() {
  static const RuntimeFile files[] = {
#include "CMakeTemplates.inc"
  };
  return files;
}

} // namespace tally::codegen
