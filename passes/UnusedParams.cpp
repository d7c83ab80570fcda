// The unused-value lint: a parameter that no op reads, and a computed local whose value
// reaches no output.
//
// Parameters:
// 1. Mark every tensor some op reads, seeing through views to their base.
// 2. A parameter tensor never read still counts toward parameters, memory and the optimizer,
//    but gets no gradient and does no work: warn once per declaration (the copies of a
//    repeated block share one), naming how many copies and parameters it holds.
// Locals (unusedLocals):
// 1. Mark the forward ops the outputs depend on, walking back from them (ops are in
//    topological order); the rest are dead: computed, counted and run, for nothing.
// 2. A local (Graph::locals) whose producer is dead and that no op reads ends a dead chain:
//    warn at its name, once per assignment (a repeated block's copies share one), with the
//    forward FLOPs of the dead ops its value was computed from (those no live op needs).
#include "passes/InstanceNotes.h"
#include "passes/Passes.h"

#include "ir/OpRules.h"
#include "ir/Units.h"
#include "support/Diagnostics.h"

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

namespace {

/// Which forward ops the forward function's outputs depend on.
std::vector<bool> liveForwardOps(const Graph &g) {
  std::vector<bool> liveTensor(g.tensors.size(), false), liveOp(g.ops.size(), false);
  auto mark = [&](TensorId t) {
    while (t != kNone && t < g.tensors.size() && !liveTensor[t]) {
      liveTensor[t] = true;
      t = g.tensors[t].viewOf; // a view keeps its storage's producer
    }
  };
  for (TensorId t : g.outputs)
    mark(t);
  if (g.loss != kNone)
    mark(g.loss);
  for (OpId i = static_cast<OpId>(g.ops.size()); i-- > 0;) {
    const Op &op = g.ops[i];
    if (op.phase != Phase::Forward)
      continue;
    bool live = false;
    for (TensorId t : op.outputs)
      live |= liveTensor[t];
    if (!live)
      continue;
    liveOp[i] = true;
    for (TensorId t : op.inputs)
      mark(t);
  }
  return liveOp;
}

} // namespace

void unusedLocals(const Analysis &a, DiagnosticEngine &diags) {
  const Graph &g = *a.graph;
  if (g.locals.empty())
    return;
  std::vector<bool> live = liveForwardOps(g);
  auto dead = [&](TensorId t) {
    OpId p = g.tensors[t].producer;
    return p != kNone && p < g.ops.size() && g.ops[p].phase == Phase::Forward && !live[p];
  };
  std::vector<bool> read(g.tensors.size(), false);
  for (const Op &op : g.ops)
    for (TensorId t : op.inputs)
      read[t] = true;
  // One name per tensor: the last binding (a caller's `h = blk(x)` after the block's own).
  std::vector<size_t> binding(g.tensors.size(), SIZE_MAX);
  for (size_t l = 0; l < g.locals.size(); ++l)
    if (g.locals[l].tensor < g.tensors.size())
      binding[g.locals[l].tensor] = l;
  struct Unused {
    size_t local = 0;
    TensorId tensor = kNone;
    unsigned copies = 0;
    double flops = 0;
  };
  std::map<const char *, Unused> byName; // keyed by the name's position in the source
  std::vector<bool> counted(g.ops.size(), false);
  for (size_t l = 0; l < g.locals.size(); ++l) {
    TensorId t = g.locals[l].tensor;
    if (t >= g.tensors.size() || binding[t] != l || read[t] || !dead(t))
      continue;
    Unused &u = byName[g.locals[l].name.Start.getPointer()];
    if (!u.copies) {
      u.local = l;
      u.tensor = t;
    }
    ++u.copies;
    // The dead ops this value was computed from, each counted once.
    std::vector<OpId> work{g.tensors[t].producer};
    while (!work.empty()) {
      OpId o = work.back();
      work.pop_back();
      if (counted[o])
        continue;
      counted[o] = true;
      const Op &op = g.ops[o];
      u.flops += ruleFor(op.kind).forward(g, op).flops;
      for (TensorId in : op.inputs)
        for (TensorId x = in; x != kNone && x < g.tensors.size(); x = g.tensors[x].viewOf)
          if (dead(x))
            work.push_back(g.tensors[x].producer);
    }
  }
  for (const auto &entry : byName) {
    const Unused &u = entry.second;
    llvm::SMRange r = g.locals[u.local].name;
    std::string name(r.Start.getPointer(), r.End.getPointer() - r.Start.getPointer());
    std::string where = u.copies > 1 ? " (and " + std::to_string(u.copies - 1) +
                                           (u.copies == 2 ? " more copy" : " more copies") +
                                           " of its block)"
                                     : "";
    auto d = diags.report(DiagKind::UnusedValue, r.Start,
                          "value '" + name + "'" + where +
                              " reaches no output of the forward function; the " +
                              formatFlops(u.flops) +
                              " that compute it (forward, per micro-batch" +
                              (u.copies > 1 ? ", all copies" : "") +
                              ") are still counted and run");
    d.range(r);
    OpId p = g.tensors[u.tensor].producer;
    noteInstances(d, diags, r.Start, g, g.ops[p].instance);
  }
}

} // namespace tally
