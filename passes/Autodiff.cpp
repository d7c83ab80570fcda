// The backward FLOPs and bytes of a train plan, read from the backward ops of the training
// step (passes/Backward.cpp), and the FLOP totals of one optimizer step: backward split into
// weight and input gradients, the optimizer update, model and executed FLOPs, and 6·N·D.
//
// 1. Build the training step: the forward graph with its backward and optimizer ops (or take
//    the one analyzeGraph was given: the budget fixes' candidates of the base's graph).
// 2. Each backward op adds its FLOPs, executed FLOPs and bytes to the forward op it
//    differentiates (bytes: what it reads, what it writes, and the old value of a gradient it
//    adds into), its transcendental evaluations, and one kernel call unless it is a view
//    (the host time model prices both: passes/StepTime.cpp, kernelTime). FLOPs that write a parameter's gradient (or a temporary for one) are weight
//    gradients, the rest input gradients; a norm's backward splits hers: n per weight or bias
//    gradient, the rest for the input; moe_backward counts its experts' weight matmuls as
//    weight gradients. What the op's backward keeps from the forward comes from the op's rule
//    (`saved`). The per-input formulas of the rules (gradFlops) are a test oracle now:
//    tests/unit/test_backward.cpp checks the ops agree with them exactly.
//    A compact step (Graph::Skipped, passes/Backward.cpp step 5) has no backward ops for the
//    copies that repeat a model copy's: each forward op of those takes its model op's record,
//    costs included, which is what its backward ops would have added (the forward records are
//    checked equal first; when they are not, the whole step is built).
// 3. Totals per optimizer step = per-micro-batch sums × batch / micro_batch, the same scaling
//    as the forward (passes/OpCosts.cpp); the optimizer-phase ops run once per step.
// 4. step = forward + backward + optimizer (model FLOPs); executed = executed forward +
//    executed backward + optimizer (recompute is added by passes/Activations.cpp, which decides
//    it); sixND = 6 × trainable params × tokens per step; ratioToSixND = (forward + backward) /
//    sixND: the optimizer is left out of the comparison because 6·N·D counts only the forward
//    and backward passes.
//
// Infer plans have no backward: every backward number stays 0 and step = forward.
#include "passes/Passes.h"
#include "passes/Stack.h"

#include <algorithm>

namespace tally {

namespace {

/// Whether a backward op's output is (a local part of) a parameter's gradient.
bool writesWeightGrad(const Graph &g, TensorId t) {
  TensorId of = g.tensors[t].gradOf;
  if (of == kNone)
    return false;
  TensorId base = g.tensors[of].viewOf == kNone ? of : g.tensors[of].viewOf;
  return g.tensors[base].role == TensorRole::Param;
}

/// Bytes a backward op moves: its inputs and outputs, and the old value of every gradient it
/// adds into.
double backwardOpBytes(const Graph &g, const Op &op, const ForwardCost &c) {
  double b = c.bytesRead + c.bytesWritten;
  for (size_t i = 0; i < op.outputs.size(); ++i)
    if (i < 32 && ((op.accumulate >> i) & 1)) // a 32-bit mask: a shift past it is undefined
      b += g.bytes(op.outputs[i]);
  return b;
}

/// Whether the forward records of a compact step's skipped copies are their model copy's,
/// op by op (the records are shared: equal values usually hold one record).
bool skippedRecordsMatch(const Analysis &a, const Graph::Skipped &sk) {
  const RepeatCopies &rc = *a.copies;
  const std::vector<OpId> &model = rc.copies[sk.model].ops;
  for (uint32_t c = sk.first; c < sk.first + sk.count; ++c) {
    const std::vector<OpId> &ops = rc.copies[c].ops;
    if (ops.size() != model.size())
      return false;
    for (size_t j = 0; j < ops.size(); ++j)
      if (a.ops.recordOf(ops[j]) != a.ops.recordOf(model[j]) && !OpTable::same(a.ops[ops[j]], a.ops[model[j]]))
        return false;
  }
  return true;
}

} // namespace

std::shared_ptr<const Analysis::SavedLists> savedLists(const Graph &g, bool fusedGates) {
  auto store = std::make_shared<Analysis::SavedLists>();
  store->fusedGates = fusedGates;
  store->from.assign(g.ops.size() + 1, 0);
  // A fused gated unit (passes/Stack.h fusedGates): the multiply of `act(a) * b` does not keep
  // act(a), read by it alone; the fused backward recomputes it from a, which the activation
  // keeps. Per storage, its forward readers (2: more than one).
  std::vector<uint8_t> readers(fusedGates ? g.tensors.size() : 0, 0);
  for (OpId i = 0; fusedGates && i < g.ops.size(); ++i)
    if (g.ops[i].phase == Phase::Forward)
      for (TensorId t : g.ops[i].inputs) {
        uint8_t &r = readers[g.storageOf(t)];
        r = r == 0 ? 1 : 2;
      }
  auto gateActivation = [&](TensorId t) {
    TensorId s = g.storageOf(t);
    OpId p = g.tensors[s].producer;
    if (s != t || p == kNone || readers[s] != 1)
      return false;
    OpKind k = g.ops[p].kind;
    return (k == OpKind::Silu || k == OpKind::Gelu || k == OpKind::GeluTanh) &&
           g.tensors[g.ops[p].inputs[0]].requiresGrad;
  };
  // Room for 3 saved tensors per op (the examples and tests save 0.5-2.6 per op, a generated
  // GPT 1.47): the list does not grow by doubling from nothing (untouched room costs nothing).
  store->items.reserve(3 * g.ops.size());
  std::vector<SavedTensor> saved;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    llvm::SmallVector<bool, 3> needGrad;
    bool any = false;
    for (TensorId t : op.inputs) {
      needGrad.push_back(g.tensors[t].requiresGrad);
      any = any || g.tensors[t].requiresGrad;
    }
    saved.clear();
    if (any)
      ruleFor(op.kind).saved(g, op, needGrad, saved);
    if (fusedGates && op.kind == OpKind::Mul && op.phase == Phase::Forward)
      saved.erase(std::remove_if(saved.begin(), saved.end(),
                                 [&](const SavedTensor &x) { return x.tensor != kNone && gateActivation(x.tensor); }),
                  saved.end());
    store->items.insert(store->items.end(), saved.begin(), saved.end());
    store->from[i + 1] = static_cast<uint32_t>(store->items.size());
  }
  return store;
}

void differentiate(Analysis &a, bool compact) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  // Step 1 (unless the caller passed the step of an equal plan: analyzeGraph).
  if (!a.step)
    a.step = std::make_shared<const Graph>(buildTrainingStep(g, plan, compact ? a.copies.get() : nullptr,
                                                                   a.gradientShares.get()));
  if (!plan.isTrain) {
    a.flops.step = a.flops.forward;
    return;
  }
  // A compact step's skipped copies take their model copy's records (step 2b), which needs
  // their forward records to be the model's: else the whole step is built after all.
  if (a.step->skipped.count > 0 && !skippedRecordsMatch(a, a.step->skipped))
    a.step = std::make_shared<const Graph>(buildTrainingStep(g, plan, nullptr, a.gradientShares.get()));
  const Graph &s = *a.step;

  // Step 2: each backward op's cost, charged to its forward op.
  double inputGrad = 0, weightGrad = 0, executedBackward = 0, optimizer = 0;
  OpId current = kNone; // the forward op whose record `oa` holds, written back when it changes
  OpAnalysis oa;
  for (OpId i = static_cast<OpId>(g.ops.size()); i < s.ops.size(); ++i) {
    const Op &op = s.ops[i];
    ForwardCost c = ruleFor(op.kind).forward(s, op);
    // The step's padded head (passes/HeadPadding.h): its padded rows and columns are work the
    // step runs (executed FLOPs, bytes), not the model's (FLOPs, MFU): those count V of V'.
    const HeadPadding &hp = a.headPad;
    if (op.phase == Phase::Optimizer) {
      double f = c.flops;
      if (op.kind == OpKind::OptimizerUpdate && hp.applies())
        for (TensorId t : op.outputs)
          f -= t == hp.weight ? op.attrs->scalar * static_cast<double>(hp.extraElements()) : 0;
      optimizer += f;
      continue;
    }
    if (op.forwardOp == kNone || op.forwardOp >= a.ops.size())
      continue; // the loss gradient's fill: no FLOPs
    if (op.forwardOp != current) { // one write per forward op: its backward ops come together
      if (current != kNone)
        a.ops.set(current, oa);
      current = op.forwardOp;
      oa = a.ops[current];
    }
    double weight = 0;
    if (op.kind == OpKind::LayerNormBackward || op.kind == OpKind::RmsNormBackward) {
      double n = numel(s.tensors[op.inputs[0]].shape);
      for (TensorId t : op.outputs)
        if (writesWeightGrad(s, t))
          weight += n;
    } else if (op.kind == OpKind::MoeBackward) { // the experts' weights: inputs 3, 4, 5
      for (unsigned w = 3; w < 6; ++w)
        if ((op.attrs->gradMask >> w) & 1)
          weight += ruleFor(OpKind::Moe).gradFlops(g, g.ops[op.forwardOp], w);
    } else if (!op.outputs.empty() && writesWeightGrad(s, op.outputs[0])) {
      weight = c.flops;
    }
    double model = c.flops;
    if (hp.applies() && (op.forwardOp == hp.matmul || op.forwardOp == hp.loss)) {
      const double real = static_cast<double>(hp.vocab) / static_cast<double>(hp.padded);
      model *= real; // each backward product of the head is linear in the vocabulary
      weight *= real;
    }
    oa.weightGradFlops += weight;
    oa.inputGradFlops += model - weight;
    oa.executedBackwardFlops += c.executedFlops;
    oa.backwardBytes += backwardOpBytes(s, op, c);
    oa.backwardTranscendentals += c.transcendentals;
    if (c.flops > 0 || c.bytesRead + c.bytesWritten > 0) // a view launches no kernel
      oa.backwardCalls += c.kernels;
  }
  if (current != kNone)
    a.ops.set(current, oa);
  // Step 2b: a compact step's skipped copies (Graph::Skipped) would have made their model's
  // backward ops, ids shifted, and so added the same costs to the same forward records.
  if (s.skipped.count > 0) {
    const std::vector<OpId> &model = a.copies->copies[s.skipped.model].ops;
    for (uint32_t c = s.skipped.first; c < s.skipped.first + s.skipped.count; ++c) {
      const std::vector<OpId> &ops = a.copies->copies[c].ops;
      for (size_t j = 0; j < ops.size(); ++j) {
        OpAnalysis value = a.ops[model[j]]; // a copy: set() may move the records
        a.ops.set(ops[j], value);
      }
    }
  }
  // Each op's saved list (unless the caller made them already: analyzeGraph).
  if (!a.saved || a.saved->fusedGates != fusedGates(plan))
    a.saved = savedLists(g, fusedGates(plan));
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const OpAnalysis &oa = a.ops[i];
    inputGrad += oa.inputGradFlops;
    weightGrad += oa.weightGradFlops;
    executedBackward += oa.executedBackwardFlops;
  }

  // Step 3: per optimizer step.
  double microSteps = static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch);
  a.flops.backwardInputGrad = inputGrad * microSteps;
  a.flops.backwardWeightGrad = weightGrad * microSteps;
  a.flops.backward = a.flops.backwardInputGrad + a.flops.backwardWeightGrad;

  // Step 4: the update, the step, and the 6ND comparison.
  a.flops.optimizer = optimizer;
  a.flops.step = a.flops.forward + a.flops.backward + a.flops.optimizer;
  a.flops.executed += executedBackward * microSteps + a.flops.optimizer;
  a.flops.sixND = 6 * a.params.trainable * a.flops.tokensPerStep;
  a.flops.ratioToSixND =
      a.flops.sixND > 0 ? (a.flops.forward + a.flops.backward) / a.flops.sixND : 0;
}

} // namespace tally
