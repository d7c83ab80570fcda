// Forward cost of every op.
//
// 1. Ask each op's rule (ir/OpRules.cpp) for its forward FLOPs and bytes on the lowered graph,
//    which holds one micro-batch on one data-parallel replica.
// 2. Note the dtype it computes in (its output's; integer and view ops have no rate); its
//    arithmetic intensity, FLOPs per byte moved, follows (OpAnalysis::intensity).
// 3. Scale the sums to one optimizer step: batch / micro_batch micro-batches of the graph
//    (accumulation steps × data-parallel replicas).
#include "passes/Passes.h"

namespace tally {

void costOps(Analysis &a) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  a.ops.assign(g.ops.size());
  double forward = 0, matmul = 0, executed = 0;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    OpAnalysis oa;
    oa.forward = ruleFor(op.kind).forward(g, op);
    oa.computeDtype = op.outputs.empty() ? g.activationDtype : g.tensors[op.outputs[0]].dtype;
    if (!isFloat(oa.computeDtype))
      oa.computeDtype = g.activationDtype;
    forward += oa.forward.flops;
    matmul += oa.forward.matmulFlops;
    executed += oa.forward.executedFlops;
    a.ops.set(i, oa);
  }
  double microSteps = static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch);
  if (!plan.isTrain)
    microSteps = 1;
  a.flops.forward = forward * microSteps;
  a.flops.forwardMatmul = matmul * microSteps;
  a.flops.executed = executed * microSteps;
  a.flops.tokensPerStep = static_cast<double>(plan.batch) * static_cast<double>(plan.seq);
  a.flops.sequence = false;
  for (TensorId t : g.inputs)
    for (const Dim &d : g.tensors[t].shape)
      a.flops.sequence |= d.sym != 0 && d.sym < g.symbols.size() && g.symbols[d.sym] == "seq";
  for (const Op &op : g.ops)
    if (op.kind == OpKind::Attention) {
      a.flops.attention = true;
      a.flops.causalAttention |= op.attrs->causal;
    }
}

} // namespace tally
