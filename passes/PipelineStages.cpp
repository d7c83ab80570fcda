// PipelineStages.cpp — what each pipeline stage computes (StepTime.cpp, step 4).
//
// A pipeline runs at the pace of its slowest stage, so the stages' loads are counted, not
// taken as 1/p of the model each. The L repeat copies (a transformer's layers) are split over
// the p·v virtual stages (chunks; chunk k runs on device k mod p) in balanced whole counts —
// L/(p·v) each, the first L mod (p·v) chunks one more, as DeepSpeed's partition_uniform
// splits them (Megatron-LM requires L divisible and splits evenly) — and an op outside the
// copies runs with the copy before it: the embedding and whatever precedes the first copy on
// chunk 0, the final norm, the output layer and the loss on the last chunk. That the first
// and last stages are the heavier is why Megatron-Core has account_for_embedding_in_pipeline_split
// and account_for_loss_in_pipeline_split (megatron/core/transformer/transformer_config.py).
// chunkOfOps is that assignment alone: the generated CPU step runs its stages by it too
// (passes/PipelineStep.cpp), so what is priced is what runs.
#include "passes/Passes.h"

#include <algorithm>

namespace tally {

std::vector<uint32_t> chunkOfOps(const Graph &g, const RepeatCopies &rc, int64_t chunks) {
  int64_t copies = static_cast<int64_t>(rc.copies.size());
  if (chunks <= 1 || copies < chunks)
    return {};
  // The chunk of each copy: balanced counts, the first `extra` chunks one copy more.
  int64_t base = copies / chunks, extra = copies % chunks;
  std::vector<uint32_t> chunkOfCopy(static_cast<size_t>(copies));
  for (int64_t k = 0, c = 0; k < chunks; ++k)
    for (int64_t n = 0; n < base + (k < extra ? 1 : 0); ++n)
      chunkOfCopy[static_cast<size_t>(c++)] = static_cast<uint32_t>(k);
  std::vector<uint32_t> chunkOfOp(g.ops.size(), 0);
  uint32_t current = 0; // the chunk of the last copy op seen
  for (OpId i = 0; i < g.ops.size(); ++i) {
    uint32_t c = rc.ofOp[i];
    if (c != kNone)
      current = chunkOfCopy[c];
    chunkOfOp[i] = current;
  }
  return chunkOfOp;
}

StageTimes stageTimes(const Analysis &a, int64_t chunks, const std::vector<OpId> &recompute,
                      double recomputeRatio) {
  const Graph &g = *a.graph;
  StageTimes st;
  std::vector<uint32_t> chunkOfOp = chunkOfOps(g, *a.copies, chunks);
  if (chunkOfOp.empty())
    return st;
  size_t n = static_cast<size_t>(chunks);
  st.forward.assign(n, 0);
  st.backward.assign(n, 0);
  st.recompute.assign(n, 0);
  for (OpId i = 0; i < g.ops.size(); ++i) {
    st.forward[chunkOfOp[i]] += a.ops[i].forwardTime;
    st.backward[chunkOfOp[i]] += a.ops[i].backwardTime;
  }
  for (OpId i : recompute)
    if (i < g.ops.size())
      st.recompute[chunkOfOp[i]] += a.ops[i].forwardTime;
  if (recompute.empty() && recomputeRatio > 0)
    for (size_t k = 0; k < n; ++k)
      st.recompute[k] = st.forward[k] * recomputeRatio;
  return st;
}

std::vector<TensorId> sharedStageParams(const Graph &g, const std::vector<uint32_t> &chunkOfOp, int64_t p) {
  std::vector<TensorId> out;
  if (p <= 1 || chunkOfOp.size() != g.ops.size())
    return out;
  std::vector<int64_t> device(g.tensors.size(), -1);
  std::vector<bool> shared(g.tensors.size(), false);
  for (OpId i = 0; i < g.ops.size(); ++i)
    for (TensorId x : g.ops[i].inputs) {
      TensorId s = g.storageOf(x);
      if (g.tensors[s].role != TensorRole::Param)
        continue;
      int64_t d = static_cast<int64_t>(chunkOfOp[i]) % p;
      if (device[s] >= 0 && device[s] != d)
        shared[s] = true;
      device[s] = device[s] < 0 ? d : device[s];
    }
  for (const ParamInfo &pi : g.params)
    if (pi.trainable && shared[pi.tensor])
      out.push_back(pi.tensor);
  return out;
}

} // namespace tally
