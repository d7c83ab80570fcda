// The unused-value lint: a parameter that no op reads.
//
// 1. Mark every tensor some op reads, seeing through views to their base.
// 2. A parameter tensor never read still counts toward parameters, memory and the optimizer,
//    but gets no gradient and does no work: warn once per declaration (the copies of a
//    repeated block share one), naming how many copies and parameters it holds.
#include "passes/Passes.h"

#include "support/Diagnostics.h"
#include "ir/Units.h"

#include <map>

namespace tally {

void unusedParams(Analysis &a, DiagnosticEngine &diags) {
  const Graph &g = *a.graph;
  std::vector<bool> read(g.tensors.size(), false);
  for (const Op &op : g.ops)
    for (TensorId t : op.inputs) {
      read[t] = true;
      if (g.tensors[t].viewOf != kNone)
        read[g.tensors[t].viewOf] = true;
    }
  struct Unused {
    const ParamInfo *first = nullptr;
    unsigned copies = 0;
    double elements = 0;
  };
  std::map<const char *, Unused> byDecl; // keyed by the declaration's position in the source
  for (const ParamInfo &p : g.params) {
    if (read[p.tensor])
      continue;
    Unused &u = byDecl[p.range.Start.getPointer()];
    if (!u.first)
      u.first = &p;
    ++u.copies;
    u.elements += numel(g.tensors[p.tensor].shape);
  }
  for (const auto &entry : byDecl) {
    const Unused &u = entry.second;
    std::string where = u.copies > 1 ? " (and " + std::to_string(u.copies - 1) +
                                           (u.copies == 2 ? " more copy" : " more copies") +
                                           " of its block)"
                                     : "";
    diags.report(DiagKind::UnusedValue, u.first->range.Start,
                 "parameter '" + g.paramPath(*u.first) + "'" + where +
                     " is never read by the forward function; its " +
                     formatCount(u.elements) +
                     " parameters still count toward memory and the optimizer")
        .range(u.first->range);
  }
}

} // namespace tally
