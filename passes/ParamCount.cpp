// Parameter counts.
//
// 1. Sum every parameter tensor's element count once (a tied weight is one tensor, however
//    often it is used), split into trainable and frozen.
// 2. Attribute each parameter to the instance that declared it, then add each instance's count
//    to its parent, walking instances backwards (children come after their parents).
// 3. The experts' weights: the parameters an MoE op reads as its stacked expert weights, counted
//    once each (expert parallelism splits them, passes/StaticMemory.cpp). Active parameters,
//    the ones a token reads: the total less (E − k)/E of each moe op's expert weights, E the
//    experts it stacks and k the top_k each token is routed to (Mixtral-8x7B: 46.7B, of which
//    32 layers × 8 experts × 3 × 4096 × 14336 are experts, 2 of 8 read: 12.9B, its card's
//    active count). Shared experts, routers and attention are dense: every token reads them.
// 4. By pipeline stage: the parameters read by an op before the first repeat-block copy (the
//    first stage's own) and those read by ops in the copies, each counted once (a weight read
//    in both, as none is in a transformer, counts before the copies).
// 6. Quantized: frozen parameters stored in int8, int4 or nf4, and their bytes with the block
//    scales (ir/Dtype.h, quantBitsPerElement; the plan's `base` record or the dtype's
//    defaults).
// 5. Tied: a parameter read by an op written outside the block that declares it (and that
//    block's children) is shared between blocks (GPT-2's head reads the embedding's weight).
// 7. ZeRO 3's units: the largest repeat-block copy's parameters (all and trainable), each
//    parameter in the copy its declaring instance is in (passes/StaticMemory.cpp, zeroTransients).
// 8. The most trainable parameter elements whose spans of readers overlap at one op, a span
//    running from the first op that reads the parameter to the last: what tally's step holds
//    of one micro-batch's parameter gradients under ZeRO 2 and 3, each living from the backward
//    of its last reader to that of its first (passes/ZeroShards.cpp).
#include "passes/Passes.h"

#include <algorithm>

namespace tally {

void countParams(Analysis &a) {
  const Graph &g = *a.graph;
  std::vector<double> own(g.instances.size(), 0);
  for (const ParamInfo &p : g.params) {
    double n = numel(g.tensors[p.tensor].shape);
    a.params.total += n;
    if (p.trainable)
      a.params.trainable += n;
    Dtype d = g.tensors[p.tensor].dtype;
    if (!p.trainable && isQuantized(d) && a.plan) {
      a.params.quantized += n;
      a.params.quantizedBytes += n * quantBitsPerElement(quantSpecFor(a.plan->precision, d)) / 8;
    }
    own[p.instance] += n;
  }
  for (size_t i = g.instances.size(); i-- > 1;)
    own[g.instances[i].parent] += own[i];
  std::vector<bool> counted(g.tensors.size(), false);
  double inactive = 0;
  for (const Op &op : g.ops) {
    if (op.kind != OpKind::Moe || op.inputs.size() < 6)
      continue;
    double E = static_cast<double>(g.tensors[op.inputs[3]].shape[0].size);
    double k = static_cast<double>(g.tensors[op.inputs[1]].shape.back().size);
    double unread = E > 0 ? std::max(0.0, (E - k) / E) : 0;
    for (size_t i = 3; i < op.inputs.size(); ++i) {
      TensorId t = g.tensors[op.inputs[i]].viewOf == kNone ? op.inputs[i]
                                                           : g.tensors[op.inputs[i]].viewOf;
      const Tensor &w = g.tensors[t];
      if (w.role != TensorRole::Param || counted[t])
        continue;
      counted[t] = true;
      a.params.expert += numel(w.shape);
      inactive += unread * numel(w.shape);
      if (g.params[w.param].trainable)
        a.params.expertTrainable += numel(w.shape);
    }
  }
  a.params.active = a.params.total - inactive;
  const RepeatCopies *rc = a.copies.get();
  if (rc && !rc->copies.empty()) { // step 7
    std::vector<double> all(rc->copies.size(), 0), trainable(rc->copies.size(), 0);
    for (const ParamInfo &p : g.params) {
      uint32_t c = p.instance < rc->ofInstance.size() ? rc->ofInstance[p.instance] : kNone;
      if (c == kNone)
        continue;
      double n = numel(g.tensors[p.tensor].shape);
      all[c] += n;
      trainable[c] += p.trainable ? n : 0;
    }
    for (size_t c = 0; c < all.size(); ++c)
      if (all[c] > a.params.largestCopy) {
        a.params.largestCopy = all[c];
        a.params.largestCopyTrainable = trainable[c];
      }
  }
  if (!rc || rc->copies.empty()) {
    a.params.beforeCopies = a.params.total;
    a.params.beforeCopiesTrainable = a.params.trainable;
  } else {
    // 0: not read yet, 1: read by a copy, 2: read before the copies.
    std::vector<uint8_t> where(g.tensors.size(), 0);
    OpId firstCopyOp = rc->copies.front().ops.front();
    for (OpId i = 0; i < g.ops.size(); ++i) {
      uint8_t w = i < firstCopyOp ? 2 : rc->ofOp[i] != kNone ? 1 : 0;
      if (w == 0)
        continue;
      for (TensorId x : g.ops[i].inputs) {
        TensorId s = g.storageOf(x);
        if (g.tensors[s].role == TensorRole::Param)
          where[s] = std::max(where[s], w);
      }
    }
    for (const ParamInfo &p : g.params) {
      double n = numel(g.tensors[p.tensor].shape);
      uint8_t w = where[g.storageOf(p.tensor)];
      if (w == 2) {
        a.params.beforeCopies += n;
        a.params.beforeCopiesTrainable += p.trainable ? n : 0;
      } else if (w == 1) {
        a.params.inCopies += n;
        a.params.inCopiesTrainable += p.trainable ? n : 0;
      }
    }
  }
  // Step 5: tied parameters.
  auto within = [&](uint32_t inst, uint32_t ancestor) {
    for (uint32_t i = inst; i != kNone && i < g.instances.size(); i = g.instances[i].parent)
      if (i == ancestor)
        return true;
    return false;
  };
  std::vector<bool> tied(g.tensors.size(), false);
  for (const Op &op : g.ops)
    for (TensorId x : op.inputs) {
      TensorId s = g.storageOf(x);
      const Tensor &w = g.tensors[s];
      if (w.role == TensorRole::Param && !tied[s] && !within(op.instance, g.params[w.param].instance))
        tied[s] = true;
    }
  for (const ParamInfo &p : g.params)
    if (tied[g.storageOf(p.tensor)])
      a.params.tied += numel(g.tensors[p.tensor].shape);
  // Step 8.
  {
    std::vector<std::pair<OpId, OpId>> span(g.params.size(), {kNone, kNone});
    for (OpId i = 0; i < g.ops.size(); ++i)
      for (TensorId x : g.ops[i].inputs) {
        const Tensor &w = g.tensors[g.storageOf(x)];
        if (w.role != TensorRole::Param || w.param >= span.size())
          continue;
        auto &[first, last] = span[w.param];
        if (first == kNone)
          first = i;
        last = i;
      }
    std::vector<double> delta(g.ops.size() + 1, 0);
    for (size_t k = 0; k < g.params.size(); ++k)
      if (g.params[k].trainable && span[k].first != kNone) {
        double n = numel(g.tensors[g.params[k].tensor].shape);
        delta[span[k].first] += n;
        delta[span[k].second + 1] -= n;
      }
    double live = 0;
    a.params.gradientSpanPeak = 0;
    for (double d : delta)
      a.params.gradientSpanPeak = std::max(a.params.gradientSpanPeak, live += d);
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
