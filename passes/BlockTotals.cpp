// FLOPs and time by block.
//
// 1. Add each op's forward and backward model FLOPs and its forward + backward time to the
//    instance it was written in.
// 2. Add every instance's totals to its parent, walking instances backwards (children come
//    after their parents), so each instance holds everything below it.
// 3. Scale FLOPs to one optimizer step (batch / micro_batch micro-batches, as OpCosts does)
//    and time by the accumulation steps one device runs.
#include "passes/Passes.h"

namespace tally {

void blockTotals(Analysis &a) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  size_t n = g.instances.size();
  std::vector<double> fwd(n, 0), bwd(n, 0), time(n, 0);
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const OpAnalysis &o = a.ops[i];
    uint32_t inst = g.ops[i].instance;
    fwd[inst] += o.forward.flops;
    bwd[inst] += o.inputGradFlops + o.weightGradFlops;
    time[inst] += o.forwardTime + o.backwardTime;
  }
  std::vector<double> selfFwd = fwd, selfBwd = bwd, selfTime = time;
  for (size_t i = n; i-- > 1;) {
    uint32_t parent = g.instances[i].parent;
    fwd[parent] += fwd[i];
    bwd[parent] += bwd[i];
    time[parent] += time[i];
  }
  double microSteps =
      plan.isTrain ? static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch) : 1;
  double perDevice = static_cast<double>(std::max<int64_t>(1, a.time.accumulationSteps));
  for (size_t i = 0; i < n && i < a.params.byBlock.size(); ++i) {
    Analysis::BlockCount &b = a.params.byBlock[i];
    b.forwardFlops = fwd[i] * microSteps;
    b.backwardFlops = bwd[i] * microSteps;
    b.time = time[i] * perDevice;
    b.selfForwardFlops = selfFwd[i] * microSteps;
    b.selfBackwardFlops = selfBwd[i] * microSteps;
    b.selfTime = selfTime[i] * perDevice;
  }
}

} // namespace tally
