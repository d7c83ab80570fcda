// The CUDA graph rule of the generated CUDA step (passes/CudaGraph.h).
#include "passes/CudaGraph.h"

#include "llvm/Support/FormatVariadic.h"

namespace tally {

std::string cudaGraphRefusal(const Graph &g, const Plan &plan) {
  // Pipeline parallel (codegen/EmitPipeline.cpp): each rank runs its units as launched.
  if (plan.parallel.pipeline > 1)
    return "pipeline = " + std::to_string(plan.parallel.pipeline) +
           ": each rank issues its units' kernels and its ncclSend/ncclRecv (grouped where both directions meet) "
           "in the 1F1B order, and the shared gradient's exchange begins with a host wait (MPI), so the step runs "
           "as launched; point-to-point NCCL inside a graph replayed by two processes at once has not run on a GPU";
  // Otherwise every plan the CUDA backend generates captures unless an op draws a dropout mask.
  for (const Op &op : g.ops)
    if ((op.kind == OpKind::Dropout || op.kind == OpKind::Attention) && op.attrs->p > 0)
      return llvm::formatv("{0} '{1}' draws a dropout mask (p = {2}) from the micro-batch's Philox seed, a "
                           "kernel argument that a replayed graph would repeat every step",
                           op.kind == OpKind::Dropout ? "dropout" : "attention", g.opPath(op), op.attrs->p)
          .str();
  return "";
}

std::vector<std::pair<std::string, std::string>> cudaGraphExclusions(const Plan &plan) {
  const Parallelism &par = plan.parallel;
  bool dataParallel = par.data > 1, sharded = dataParallel && par.zero >= 1;
  std::vector<std::pair<std::string, std::string>> out;
  out.push_back({"the batch's upload", "host memory, copied to the driver's staging buffer before the replay"});
  if (dataParallel && (sharded || !par.overlap))
    out.push_back({sharded ? "the gradient reduce-scatter" : "the gradient all-reduce",
                   "it begins with a barrier: a cudaStreamSynchronize and an MPI_Barrier"});
  out.push_back({"the loss read-back", "one cudaMemcpyAsync of every micro-batch's loss and a stream synchronise"});
  out.push_back({"the optimizer update", plan.precision.lossScaling
                                             ? "the step number is a kernel argument, and the fp16 overflow check "
                                               "reads its sum of squares on the host to skip the step"
                                             : "the step number, which the bias correction and the schedule "
                                               "read, is a kernel argument"});
  if (sharded)
    out.push_back({"the parameter all-gather", "it follows the update"});
  out.push_back({"zero_grad", "after the update and --dump-grads, which reads the gradients"});
  return out;
}

} // namespace tally
