// Whether the generated CUDA step replays its forward and backward as a CUDA graph (issue 38,
// item 3). One rule, read by the estimate (passes/StepTime.cpp: no launch floor for a kernel
// inside the graph, one graph launch per step) and by the emitter (codegen/EmitStep.cpp: the
// graph region forward_backward(), kGraph, and `tally build`'s `cuda graph:` lines), so the
// estimate prices what the step runs.
//
// The region is every micro-batch's data copy (device to device, from the driver's staging
// buffer), forward and backward, with each loss copied to device memory, and under overlapped
// data parallelism the gradient buckets' NCCL all-reduces and their wait. Outside it, each for
// a reason cudaGraphExclusions names: the upload of the batch from host memory, the loss
// read-back, the non-overlapped reduction (it begins with a host barrier), the optimizer update
// (its step number, hence AdamW's bias correction, is a kernel argument; the fp16 overflow
// check reads its sum of squares on the host), ZeRO-1's parameter gather and zero_grad (after
// --dump-grads reads the gradients).
#pragma once

#include "ir/Graph.h"
#include "ir/Plan.h"

#include <string>
#include <utility>
#include <vector>

namespace tally {

/// "" when the CUDA step of `plan` captures its forward and backward in a CUDA graph, else why
/// it runs them as launched kernels: a dropout (of a dropout op or inside an attention) draws
/// its mask from the micro-batch's Philox seed, a kernel argument that a replayed graph would
/// repeat; the reason names the first such op. A pipelined plan is not captured (its reason).
std::string cudaGraphRefusal(const Graph &g, const Plan &plan);

/// What the CUDA step of `plan` runs outside its graph region, each {what, why}, in step order.
std::vector<std::pair<std::string, std::string>> cudaGraphExclusions(const Plan &plan);

/// Whether the estimate prices `plan`'s forward and backward kernels as replayed from a graph.
inline bool cudaGraphCaptured(const Graph &g, const Plan &plan) {
  return plan.cudaStep && cudaGraphRefusal(g, plan).empty();
}

} // namespace tally
