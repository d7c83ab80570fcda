// The loss family's rules: cross_entropy (logits and integer labels to a mean fp32 loss) and
// cross_entropy_backward. docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Cross entropy: logits [..., V] and integer labels [...] → the mean loss, a fp32 scalar.

bool inferCrossEntropy(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                       ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Tensor &logits = in(g, op, 0), &labels = in(g, op, 1);
  if (logits.shape.empty())
    return fail(err, ShapeErrorKind::Invalid, "cross_entropy logits must have a class dimension, got []");
  if (!isInteger(labels.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "cross_entropy labels must be integers, got " + nameOf(labels.dtype).str() +
                    g.formatShape(labels.shape));
  bool same = labels.shape.size() + 1 == logits.shape.size();
  for (size_t i = 0; same && i < labels.shape.size(); ++i)
    same = labels.shape[i].size == logits.shape[i].size;
  if (!same)
    return fail(err, ShapeErrorKind::Mismatch,
                "cross_entropy labels " + g.formatShape(labels.shape) +
                    " must have the shape of the logits " + g.formatShape(logits.shape) +
                    " without the last dimension");
  // (loss, logsumexp per row in fp32, which the backward reads).
  outs.push_back({Shape(), Dtype::F32});
  outs.push_back({labels.shape, Dtype::F32});
  return true;
}

struct CrossEntropyCounts : BaseCounts {
  /// N rows of V logits: max, subtract, exp, sum, log per logit; one add per row into the mean.
  template <class C> static Num<C> flops(C &c) {
    const Shape &logits = in(c.g, c.op, 0).shape;
    Num<C> N = c.rows(logits, "N");
    Num<C> V = c.dim("V", logits.back());
    c.note("max, subtract, exp, sum, log per logit; one add per row for the mean");
    return c.lit(5) * N * V + N;
  }
  template <class C> static Num<C> written(C &c) {
    c.note("the fp32 loss, and the logsumexp per row in fp32 (out1)");
    return sumBytes(c, c.op.outputs, "out");
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i != 0) {
      c.note("integer labels have no gradient");
      return c.lit(0);
    }
    c.note("exp(x - lse), minus the one-hot label, divided by N");
    return c.lit(3) * c.numelIn(0);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    const Shape &logits = in(g, op, 0).shape;
    r.transcendentals = numel(logits) + rowsOf(logits); // an exp per logit, a log per row
  }
};

void savedCrossEntropy(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                       std::vector<SavedTensor> &out) {
  if (!need(needGrad, 0))
    return;
  keep(g, out, op.inputs[0], "logits");
  keep(g, out, op.inputs[1], "labels");
  keep(g, out, op.outputs[1], "logsumexp");
}

/// cross_entropy_backward(logits, labels, lse, dloss): dlogits.
bool inferCrossEntropyBackward(const Graph &g, const Op &op,
                               llvm::SmallVectorImpl<TensorType> &outs, ShapeError &err) {
  if (!expectInputs(op, 4, 4, err))
    return false;
  outs.push_back({in(g, op, 0).shape, in(g, op, 0).dtype});
  return true;
}
struct CrossEntropyBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("exp(x - lse), minus the one-hot label, divided by N");
    return c.lit(3) * c.numelIn(0);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    r.transcendentals = numel(in(g, op, 0).shape); // p = exp(x − lse) per logit
  }
};

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE(CrossEntropy, inferCrossEntropy, CrossEntropyCounts, executedDefault, savedCrossEntropy)
RULE(CrossEntropyBackward, inferCrossEntropyBackward, CrossEntropyBackwardCounts, executedDefault, savesNothing)

} // namespace tally::oprules
