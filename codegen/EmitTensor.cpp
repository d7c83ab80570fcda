// Tensor parallelism in the generated step (CPU, MPI; Plan::tensorStep): the all-reduces of
// Megatron's split, at the ops tensorSplit (passes/StepTime.cpp) names, the rule the estimate
// prices. The step graph is one rank's shard (passes/TensorShard.cpp), so every other call is
// the single-rank call on smaller shapes.
// - Forward (and recompute): after each row-parallel matmul its output, a partial sum on each
//   rank, is summed over the tensor group (tally_comm::tp_all_reduce, a ring that counts the
//   bytes it sends).
// - Backward: each storage read by column-parallel matmuls (tensorSplit's columnInputs) has its
//   gradient, the sum of those matmuls' partial input gradients, summed over the group once,
//   after the last backward op that writes it. Such a storage must be read by nothing else
//   (else the other readers' whole gradients would be summed t times): refused.
#include "codegen/EmitInternal.h"

namespace tally::codegen::emit {

bool Emitter::indexTensorParallel() {
  if (!tensorParallel())
    return true;
  const Graph &g = *a.graph;
  tp = tensorSplit(g, plan);
  std::vector<bool> column(g.tensors.size(), false);
  for (TensorId x : tp.columnInputs)
    column[x] = true;
  for (OpId i = 0; i < g.ops.size(); ++i)
    for (TensorId x : g.ops[i].inputs)
      if (column[g.storageOf(x)] && !tp.columnParallel[i]) {
        op = &s.ops[i];
        return fail("tensor " + g.tensorName(g.storageOf(x)) +
                    " is read by a column-parallel matmul and by this op: the generated tensor-parallel "
                    "step all-reduces the gradient of a column-parallel input only when column-parallel "
                    "matmuls alone read it");
      }
  // The last backward entry writing each such gradient (or a view of it).
  std::map<TensorId, size_t> lastWrite;
  for (TensorId x : tp.columnInputs)
    if (x < s.gradient.size() && s.gradient[x] != kNone)
      lastWrite[s.gradient[x]] = SIZE_MAX;
  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    if (se.kind != StepEntry::Backward)
      continue;
    for (TensorId o : s.ops[se.op].outputs) {
      auto it = lastWrite.find(s.storageOf(o));
      if (it != lastWrite.end())
        it->second = e;
    }
  }
  for (auto &[grad, e] : lastWrite)
    if (e != SIZE_MAX)
      tpReduceAfter[e].push_back(grad);
  return true;
}

void Emitter::tensorParallelAfter(size_t e) {
  if (!tensorParallel())
    return;
  const StepEntry &se = a.stepSchedule[e];
  auto allReduce = [&](TensorId x, const std::string &why) {
    body += "\n  // tensor parallel: " + why + "\n";
    site("tensor_parallel.all_reduce", "communication");
    line(llvm::formatv("tally_comm::tp_all_reduce<{0}>(ctx, {1}, {2});", T(x), ptr(x), n(x)).str());
  };
  if (se.kind != StepEntry::Backward && se.op < tp.rowParallel.size() && tp.rowParallel[se.op])
    for (TensorId o : s.ops[se.op].outputs)
      allReduce(o, "the row-parallel partial sums of " + commentSafe(s.opPath(s.ops[se.op])) + " summed over the ranks");
  auto r = tpReduceAfter.find(e);
  if (r != tpReduceAfter.end())
    for (TensorId grad : r->second)
      allReduce(grad, "the gradient of a column-parallel input, summed over the ranks");
}

} // namespace tally::codegen::emit
