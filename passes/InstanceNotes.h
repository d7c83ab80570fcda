// InstanceNotes.h — notes that lead a pass's diagnostic about an op back to the user's file.
#pragma once

#include "ir/Graph.h"
#include "support/Diagnostics.h"

namespace tally {

/// Adds "in 'Linear' instantiated here as h[0].mlp.fc" notes for the member declarations that
/// made `instance`, innermost first (at most four; the model and repeat lists add none), as
/// lowering does for its own errors: a diagnostic raised at an op of the standard library is
/// then reported at the innermost of them in the user's file (DiagnosticEngine::setLibraryBuffer).
/// Nothing when `at`, where the diagnostic is, lies in the user's file already.
inline void noteInstances(DiagBuilder &d, const DiagnosticEngine &diags, llvm::SMLoc at,
                          const Graph &g, uint32_t instance) {
  if (!diags.inLibrary(at))
    return;
  size_t shown = 0;
  for (uint32_t i = instance; i < g.instances.size() && shown < 4;) {
    const Instance &in = g.instances[i];
    if (in.parent >= i) // the model itself, or a broken link
      break;
    if (in.where.isValid() && *in.block != "repeat") {
      d.note(in.where.Start,
             "in '" + *in.block + "' instantiated here as " + g.instancePath(i), in.where);
      ++shown;
    }
    i = in.parent;
  }
}

} // namespace tally
