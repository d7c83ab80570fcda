// FLOPs and time by block.
//
// 1. Add each op's forward and backward model FLOPs and its forward + backward time to the
//    instance it was written in.
// 2. Add every instance's totals to its parent, walking instances backwards (children come
//    after their parents), so each instance holds everything below it.
// 3. Scale FLOPs to one optimizer step (batch / micro_batch micro-batches, as OpCosts does)
//    and time by the accumulation steps one device runs, divided by the pipeline stages the
//    block's ops run on: a block's time is one device's. Stages are cut between repeat-block
//    copies as StepTime.cpp prices them (L/p copies each, or L/(p·v) per chunk with v
//    interleaved chunks, chunk k on device k mod p); an op before the copies runs on the first
//    stage, one after them on the last. A block on stages s..s' (chunks k..k') spans
//    min(p, k' − k + 1) devices, so the model's time is the step's compute per device.
#include "passes/Passes.h"

#include <algorithm>

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
  // The pipeline chunks each instance's own ops run on, [first, last] (kNone: no op).
  const Parallelism &par = plan.parallel;
  uint64_t p = static_cast<uint64_t>(std::max<int64_t>(1, par.pipeline));
  uint64_t chunks = p * static_cast<uint64_t>(std::max<int64_t>(1, par.interleave));
  std::vector<uint32_t> firstChunk(n, kNone), lastChunk(n, 0);
  const RepeatCopies *rc = a.copies.get();
  if (p > 1 && rc && !rc->copies.empty()) {
    uint64_t L = rc->copies.size();
    OpId firstCopyOp = rc->copies.front().ops.front();
    for (OpId i = 0; i < g.ops.size(); ++i) {
      uint32_t c = rc->ofOp[i];
      uint64_t k = c != kNone ? c * chunks / L : i < firstCopyOp ? 0 : chunks - 1;
      uint32_t inst = g.ops[i].instance;
      firstChunk[inst] = std::min<uint32_t>(firstChunk[inst], static_cast<uint32_t>(k));
      lastChunk[inst] = std::max<uint32_t>(lastChunk[inst], static_cast<uint32_t>(k));
    }
  }
  auto devices = [&](size_t i) {
    if (firstChunk[i] == kNone)
      return 1.0;
    return static_cast<double>(std::min<uint64_t>(p, lastChunk[i] - firstChunk[i] + 1));
  };
  std::vector<double> selfFwd = fwd, selfBwd = bwd, selfTime = time;
  std::vector<double> selfDevices(n);
  for (size_t i = 0; i < n; ++i)
    selfDevices[i] = devices(i);
  for (size_t i = n; i-- > 1;) {
    uint32_t parent = g.instances[i].parent;
    fwd[parent] += fwd[i];
    bwd[parent] += bwd[i];
    time[parent] += time[i];
    firstChunk[parent] = std::min(firstChunk[parent], firstChunk[i]);
    if (firstChunk[i] != kNone)
      lastChunk[parent] = std::max(lastChunk[parent], lastChunk[i]);
  }
  double microSteps =
      plan.isTrain ? static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch) : 1;
  double perDevice = static_cast<double>(std::max<int64_t>(1, a.time.accumulationSteps));
  for (size_t i = 0; i < n && i < a.params.byBlock.size(); ++i) {
    Analysis::BlockCount &b = a.params.byBlock[i];
    b.forwardFlops = fwd[i] * microSteps;
    b.backwardFlops = bwd[i] * microSteps;
    b.time = time[i] * perDevice / devices(i);
    b.selfForwardFlops = selfFwd[i] * microSteps;
    b.selfBackwardFlops = selfBwd[i] * microSteps;
    b.selfTime = selfTime[i] * perDevice / selfDevices[i];
  }
}

} // namespace tally
