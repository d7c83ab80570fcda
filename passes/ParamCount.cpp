// Parameter counts.
//
// 1. Sum every parameter tensor's element count once (a tied weight is one tensor, however
//    often it is used), split into trainable and frozen.
// 2. Attribute each parameter to the instance that declared it, then add each instance's count
//    to its parent, walking instances backwards (children come after their parents).
// 3. The experts' weights: the parameters an MoE op reads as its stacked expert weights, counted
//    once each (expert parallelism splits them, passes/StaticMemory.cpp).
#include "passes/Passes.h"

namespace tally {

void countParams(Analysis &a) {
  const Graph &g = *a.graph;
  std::vector<double> own(g.instances.size(), 0);
  for (const ParamInfo &p : g.params) {
    double n = numel(g.tensors[p.tensor].shape);
    a.params.total += n;
    if (p.trainable)
      a.params.trainable += n;
    own[p.instance] += n;
  }
  for (size_t i = g.instances.size(); i-- > 1;)
    own[g.instances[i].parent] += own[i];
  std::vector<bool> counted(g.tensors.size(), false);
  for (const Op &op : g.ops) {
    if (op.kind != OpKind::Moe)
      continue;
    for (size_t i = 3; i < op.inputs.size(); ++i) {
      TensorId t = g.tensors[op.inputs[i]].viewOf == kNone ? op.inputs[i]
                                                           : g.tensors[op.inputs[i]].viewOf;
      const Tensor &w = g.tensors[t];
      if (w.role != TensorRole::Param || counted[t])
        continue;
      counted[t] = true;
      a.params.expert += numel(w.shape);
      if (g.params[w.param].trainable)
        a.params.expertTrainable += numel(w.shape);
    }
  }
  a.params.byBlock.clear();
  a.params.byBlock.reserve(g.instances.size());
  for (uint32_t i = 0; i < g.instances.size(); ++i) {
    Analysis::BlockCount b;
    b.instance = i;
    b.count = own[i];
    a.params.byBlock.push_back(b);
  }
}

} // namespace tally
