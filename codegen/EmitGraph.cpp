// The CUDA step's graph region (issue 38, item 3; docs/cuda.md, "CUDA graphs"): train_step()
// of a device backend runs forward_backward() — every micro-batch's data copy, forward and
// backward, each loss copied to device memory, and under overlapped data parallelism the
// buckets' NCCL all-reduces and their wait — through step_graph (driver/tally_step_cuda.h),
// which the driver turns on after the warm-up: captured once, then replayed each step. What the
// step runs outside the region, and why, is passes/CudaGraph.h's list (the estimate reads the
// same rule); kGraph carries it to the driver, which prints it, and `tally build` prints it as
// `cuda graph:` lines. A plan whose kernels take a per-step argument inside the region (a
// dropout's Philox seed) is not captured: kGraph says why, and every step runs the region's
// kernels as launched.
#include "codegen/EmitInternal.h"

#include "passes/CudaGraph.h"

namespace tally::codegen::emit {

std::vector<std::string> Emitter::graphNotes() const {
  std::vector<std::string> out;
  std::string why = cudaGraphRefusal(*a.graph, plan);
  if (!why.empty()) {
    out.push_back("not captured: " + why);
    return out;
  }
  int64_t micro = plan.batch / (plan.microBatch * plan.parallel.data);
  out.push_back("captures forward_backward(): the data copy, forward and backward of " + std::to_string(micro) +
                (micro == 1 ? " micro-batch" : " micro-batches") + ", each loss copied to device memory" +
                (overlap() ? ", and the gradient buckets' NCCL all-reduces and their wait" : std::string()) +
                (tensorParallel() ? ", and the tensor-parallel NCCL all-reduces" : ""));
  for (const auto &[what, reason] : cudaGraphExclusions(plan))
    out.push_back("outside: " + what + " (" + reason + ")");
  return out;
}

std::string Emitter::graphPlan() const {
  std::string why = cudaGraphRefusal(*a.graph, plan);
  std::string out = "/// The CUDA graph of the step (passes/CudaGraph.h): whether forward_backward() is captured\n"
                    "/// after the warm-up and replayed, else why not; what runs outside it, and why.\n"
                    "const GraphPlan kGraph = {" +
                    std::string(why.empty() ? "true" : "false") + ", " + literal(why) + ", {\n";
  for (const auto &[what, reason] : cudaGraphExclusions(plan))
    out += "    {" + literal(what) + ", " + literal(reason) + "},\n";
  return out + "    {nullptr, nullptr}}};\n\n";
}

std::string Emitter::deviceTrainStep(const std::string &tail) {
  if (lossType.empty())
    return fail("internal error: the step stores no loss (no forward entry writes it)"), "";
  std::string out = graphPlan();
  out += "/// The graph region: every micro-batch's data (copied from the driver's staging buffer),\n"
         "/// forward and backward, each loss to device_losses[m]" +
         std::string(overlap() ? ", then the wait for the gradient buckets'\n/// all-reduces (started in the last "
                                 "backward)"
                               : "") +
         ". No host synchronisation, allocation or\n/// host-side value that changes between steps.\n"
         "static void forward_backward(rt::Ctx &ctx, uint64_t seed, void (*load_micro_batch)(int64_t m)) {\n"
         "  for (int64_t m = 0; m < kLayout.microSteps; ++m) {\n"
         "    load_micro_batch(m);\n"
         "    micro_step(ctx, seed + static_cast<uint64_t>(m), m);\n"
         "  }\n" +
         std::string(overlap() ? "  reduce_gradients(ctx);\n" : "") + "}\n\n";
  out += "double train_step(rt::Ctx &ctx, int64_t step, uint64_t seed, void (*load_micro_batch)(int64_t m),\n"
         "                  void (*before_zero)(), bool *updated, void (*check_gradients)()) {\n"
         "  step_graph.run(ctx, [&] { forward_backward(ctx, seed, load_micro_batch); });\n"
         "  const double loss = read_losses<" + lossType + ">(ctx);\n" +
         tail + "  return loss / static_cast<double>(kLayout.microSteps);\n}\n\n";
  return out;
}

} // namespace tally::codegen::emit
