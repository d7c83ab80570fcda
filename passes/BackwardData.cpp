// The backward of the data-movement kinds (ir/ops Data, Reduce, View and Update): embedding
// as embedding_backward, topk and gather as scatter_add, concat as copies of parts of dy,
// contiguous as a copy, broadcast_to as reduce_to, sum and mean as expand. Views have none
// (a view's gradient is the same view of its base's gradient, Builder::gradOf), nor have the
// integer index generators, nor the kinds autodiff and step assembly add. The table is
// passes/BackwardTable.h.
#include "passes/BackwardBuilder.h"

namespace tally {
namespace backward {

namespace {

/// embedding_backward(ids, dy) → the weight's gradient, a scatter-add (the ids are integers).
void embeddingBackward(Builder &b, const Op &op, TensorId dy) {
  TensorId w = op.inputs[1];
  if (!b.needs(w))
    return;
  OpAttrs a;
  a.newShape = b.g.tensors[w].shape;
  bool acc = b.accumulateNext(w);
  b.emit(OpKind::EmbeddingBackward, {op.inputs[0], dy}, {b.gradOf(w)}, a, acc ? 1 : 0);
}

/// scatter_add(indices, dy) → dx: topk's values' gradient scattered back at the chosen
/// indices (its second output), gather's output gradient added at the gathered ones (its
/// second input).
void scatterBackward(Builder &b, const Op &op, TensorId dy, TensorId indices) {
  TensorId x = op.inputs[0];
  if (!b.needs(x))
    return;
  OpAttrs a;
  a.newShape = b.g.tensors[x].shape;
  a.dim = op.attrs->dim;
  bool acc = b.accumulateNext(x);
  b.emit(OpKind::ScatterAdd, {indices, dy}, {b.gradOf(x)}, a, acc ? 1 : 0);
}
void topkBackward(Builder &b, const Op &op, TensorId dy) {
  scatterBackward(b, op, dy, op.outputs[1]);
}
void gatherBackward(Builder &b, const Op &op, TensorId dy) {
  scatterBackward(b, op, dy, op.inputs[1]);
}

/// Each input's gradient is a copy of its part of dy (a view of it along the axis).
void concatBackward(Builder &b, const Op &op, TensorId dy) {
  Graph &g = b.g;
  size_t axis = 0;
  const Tensor y = g.tensors[dy];
  const llvm::SmallVector<int64_t, 4> ys = stridesOf(y.shape, y.layout);
  normalizeAxis(op.attrs->dim, y.shape.size(), axis);
  int64_t at = 0;
  for (TensorId x : op.inputs) {
    const Shape xs = g.tensors[x].shape;
    if (b.needs(x)) {
      TensorId part = b.view(dy, xs, ys, y.layout.offset() + at * ys[axis]);
      Builder::Target t = b.target(x, xs);
      b.emit(OpKind::Contiguous, {part}, {t.t}, SharedAttrs(), t.acc);
      b.finish(x, t);
    }
    at += xs[axis].size;
  }
}

/// dy copied into x's gradient.
void contiguousBackward(Builder &b, const Op &op, TensorId dy) {
  TensorId x = op.inputs[0];
  if (!b.needs(x))
    return;
  bool acc = b.accumulateNext(x);
  b.emit(OpKind::Contiguous, {dy}, {b.gradOf(x)}, SharedAttrs(), acc ? 1 : 0);
}

/// dy summed back to x's shape (reduce_to), or copied when no dimension grew.
void broadcastToBackward(Builder &b, const Op &op, TensorId dy) {
  if (b.needs(op.inputs[0]))
    b.writeGrad(op.inputs[0], dy);
}

/// expand(dy) → dx: dy broadcast back over the reduced dimensions (mean: divided by how many
/// elements each output averaged).
void reduceBackward(Builder &b, const Op &op, TensorId dy) {
  TensorId x = op.inputs[0];
  if (!b.needs(x))
    return;
  const Shape xs = b.g.tensors[x].shape;
  Builder::Target t = b.target(x, xs);
  OpAttrs a;
  a.newShape = xs;
  a.dim = op.attrs->dim;
  a.reduceAll = op.attrs->reduceAll;
  a.keepDim = op.attrs->keepDim;
  if (op.kind == OpKind::Mean) {
    a.hasScalar = true;
    a.scalar = numel(b.g.tensors[dy].shape) / numel(xs);
  }
  b.emit(OpKind::Expand, {dy}, {t.t}, a, t.acc);
  b.finish(x, t);
}

constexpr const char *kView = "a view: its gradient is the same view of its base's gradient";
constexpr const char *kAdded = "added by autodiff or step assembly, which never differentiates it";
constexpr const char *kOptimizer = "an optimizer-phase op: nothing differentiates the update";

} // namespace

// Data.
BACKWARD(Embedding, embeddingBackward)
NO_BACKWARD(Positions, "integer positions, made from nothing differentiable")
NO_BACKWARD(NextTokens, "integer labels, made from nothing differentiable")
BACKWARD(Concat, concatBackward)
BACKWARD(BroadcastTo, broadcastToBackward)
BACKWARD(Contiguous, contiguousBackward)
BACKWARD(TopK, topkBackward)
BACKWARD(Gather, gatherBackward)
NO_BACKWARD(Fill, kAdded)
NO_BACKWARD(ScatterAdd, kAdded)
NO_BACKWARD(EmbeddingBackward, kAdded)
// Reduce.
BACKWARD(Sum, reduceBackward)
BACKWARD(Mean, reduceBackward)
NO_BACKWARD(ReduceTo, kAdded)
NO_BACKWARD(Expand, kAdded)
// View.
NO_BACKWARD(Split, kView)
NO_BACKWARD(Reshape, kView)
NO_BACKWARD(Transpose, kView)
NO_BACKWARD(Slice, kView)
// Update: the optimizer phase's ops.
NO_BACKWARD(ZeroGrad, kOptimizer)
NO_BACKWARD(SumSquares, kOptimizer)
NO_BACKWARD(Scale, kOptimizer)
NO_BACKWARD(OptimizerUpdate, kOptimizer)

} // namespace backward
} // namespace tally
