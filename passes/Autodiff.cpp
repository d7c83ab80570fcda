// The backward pass of a train plan, derived op by op from the forward IR, and the FLOP totals
// of one optimizer step: backward split into weight and input gradients, the optimizer update,
// model and executed FLOPs, and the 6·N·D comparison.
//
// 1. Walk the ops in reverse topological order (the order the backward runs them). An input
//    needs a gradient iff its tensor requires one (lowering sets requiresGrad on trainable
//    parameters and on every float tensor computed from one): data inputs, integer tensors and
//    frozen parameters need none, so no FLOPs are spent on them.
// 2. For each input that needs a gradient, ask the op's rule for its gradient FLOPs. An input
//    whose storage is a parameter (the parameter itself or a view of it, such as the tied
//    head's transpose(wte.weight)) is a weight gradient; anything else an input gradient.
// 3. The op's executed backward FLOPs (causal skipping, flash attention's internal recompute)
//    come from its rule; its backward bytes are estimated as 2× its forward bytes (the backward
//    reads the output gradient and what was saved, and writes one gradient per input needing
//    one: about twice the forward's traffic for matmuls and elementwise ops); what its backward
//    keeps from the forward comes from the rule's `saved`.
// 4. Totals per optimizer step = per-micro-batch sums × batch / micro_batch, the same scaling
//    as the forward (passes/OpCosts.cpp).
// 5. The optimizer runs once per step over the trainable parameters: optimizerFlopsPerParam()
//    documents the per-element count for each optimizer.
// 6. step = forward + backward + optimizer (model FLOPs); executed = executed forward +
//    executed backward + optimizer (recompute is added by passes/Activations.cpp, which decides
//    it); sixND = 6 × trainable params × tokens per step; ratioToSixND = (forward + backward) /
//    sixND: the optimizer is left out of the comparison because 6·N·D counts only the forward
//    and backward passes.
//
// Infer plans have no backward: every backward number stays 0 and step = forward.
#include "passes/Passes.h"

namespace tally {

namespace {

/// The tensor whose storage `t` shares (itself unless it is the output of a view op).
TensorId baseOf(const Graph &g, TensorId t) {
  TensorId v = g.tensors[t].viewOf;
  return v == kNone ? t : v;
}

bool isWeight(const Graph &g, TensorId t) {
  return g.tensors[baseOf(g, t)].role == TensorRole::Param;
}

/// FLOPs per trainable parameter of one optimizer update, with every per-step scalar (the
/// learning rate, bias corrections, 1 − β) computed once per step and not counted:
///   SGD        p -= lr·g                                              2
///              + momentum b = μ·b + g (then p -= lr·b)               +2
///   AdaGrad    s += g·g; p -= lr·g / (√s + ε)                         7
///   RMSprop    s = α·s + (1−α)·g²; p -= lr·g / (√s + ε)               9
///              + momentum                                            +2
///   Adam       m = β1·m + (1−β1)·g (3); v = β2·v + (1−β2)·g² (4);
///              d = √v / √bc2 + ε (3); p -= step·m / d (3)            13
///   AdamW      Adam, and the decoupled decay p ·= (1 − lr·wd)        +1
///   Lion       c = β1·m + (1−β1)·g (3); sign(c) (1); p -= lr·sign (2);
///              m = β2·m + (1−β2)·g (3)                                9
///              + decoupled decay p ·= (1 − lr·wd)                    +1
/// SGD, AdaGrad, RMSprop and Adam apply weight decay as L2, g += wd·p: +2 when wd > 0.
double optimizerFlopsPerParam(const OptimizerSpec &o) {
  bool decay = o.weightDecay > 0;
  const std::string &n = o.name;
  if (n == "AdamW")
    return 13 + (decay ? 1 : 0);
  if (n == "Lion")
    return 9 + (decay ? 1 : 0);
  double f = 0;
  if (n == "Adam")
    f = 13;
  else if (n == "AdaGrad")
    f = 7;
  else if (n == "RMSprop")
    f = 9 + (o.momentum > 0 ? 2 : 0);
  else // SGD
    f = 2 + (o.momentum > 0 ? 2 : 0);
  return f + (decay ? 2 : 0);
}

} // namespace

void differentiate(Analysis &a) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  if (!plan.isTrain) {
    a.flops.step = a.flops.forward;
    return;
  }

  // Steps 1-3: each op's backward, in the order the backward runs.
  double inputGrad = 0, weightGrad = 0, executedBackward = 0;
  for (OpId i = static_cast<OpId>(g.ops.size()); i-- > 0;) {
    const Op &op = g.ops[i];
    OpAnalysis &oa = a.ops[i];
    const OpRule &rule = ruleFor(op.kind);
    llvm::SmallVector<bool, 3> needGrad;
    for (TensorId t : op.inputs)
      needGrad.push_back(g.tensors[t].requiresGrad);
    bool any = false;
    for (unsigned k = 0; k < op.inputs.size(); ++k) {
      if (!needGrad[k])
        continue;
      any = true;
      double f = rule.gradFlops(g, op, k);
      (isWeight(g, op.inputs[k]) ? oa.weightGradFlops : oa.inputGradFlops) += f;
    }
    oa.saved.clear();
    if (!any)
      continue;
    oa.executedBackwardFlops = rule.executedBackwardFlops(g, op, needGrad);
    oa.backwardBytes = 2 * (oa.forward.bytesRead + oa.forward.bytesWritten);
    rule.saved(g, op, needGrad, oa.saved);
    inputGrad += oa.inputGradFlops;
    weightGrad += oa.weightGradFlops;
    executedBackward += oa.executedBackwardFlops;
  }

  // Step 4: per optimizer step.
  double microSteps = static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch);
  a.flops.backwardInputGrad = inputGrad * microSteps;
  a.flops.backwardWeightGrad = weightGrad * microSteps;
  a.flops.backward = a.flops.backwardInputGrad + a.flops.backwardWeightGrad;

  // Steps 5-6: the update, the step, and the 6ND comparison.
  a.flops.optimizer = optimizerFlopsPerParam(plan.optimizer) * a.params.trainable;
  a.flops.step = a.flops.forward + a.flops.backward + a.flops.optimizer;
  a.flops.executed += executedBackward * microSteps + a.flops.optimizer;
  a.flops.sixND = 6 * a.params.trainable * a.flops.tokensPerStep;
  a.flops.ratioToSixND =
      a.flops.sixND > 0 ? (a.flops.forward + a.flops.backward) / a.flops.sixND : 0;
}

} // namespace tally
