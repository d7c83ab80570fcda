// The backward of the matrix-product kinds (ir/ops Matmul, Moe and Conv): matmul as two
// matmuls over transposed views (flattening the batch when the other operand is a weight; a
// vector operand as a matrix with a unit dimension), moe as one moe_backward, conv2d as one
// conv2d_backward and pooling as one pool2d_backward. Their backward kinds have none. The
// table is passes/BackwardTable.h.
#include "passes/BackwardBuilder.h"

namespace tally {
namespace backward {

namespace {

/// A vector operand ([K] @ [K, N], [M, K] @ [K]): the outer-product and mat-vec forms,
/// written with unit dimensions as views.
void vectorMatmulBackward(Builder &b, const Op &op, TensorId dy) {
  Graph &g = b.g;
  TensorId a = op.inputs[0], bt = op.inputs[1];
  auto asMatrix = [&](TensorId t, bool row) {
    const Tensor &x = g.tensors[t];
    if (x.shape.size() >= 2)
      return t;
    Shape s = row ? Shape{Dim{1, 0}, x.shape[0]} : Shape{x.shape[0], Dim{1, 0}};
    llvm::SmallVector<int64_t, 4> st = row ? llvm::SmallVector<int64_t, 4>{x.shape[0].size, 1}
                                           : llvm::SmallVector<int64_t, 4>{1, 1};
    return b.view(t, s, st, x.layout.offset());
  };
  TensorId A = asMatrix(a, true), B = asMatrix(bt, false);
  // dy as [M, N] with unit dimensions where A or B was a vector.
  const Shape as = g.tensors[A].shape, bs = g.tensors[B].shape;
  Shape ds{as[as.size() - 2], bs.back()};
  TensorId D = b.view(dy, ds, denseStrides(ds), g.tensors[dy].layout.offset());
  if (b.needs(a)) {
    Builder::Target t = b.target(a, g.tensors[a].shape);
    TensorId out = t.t;
    if (g.tensors[a].shape.size() < 2)
      out = b.view(t.t, as, denseStrides(as), 0);
    b.emit(OpKind::Matmul, {D, b.transposed(B)}, {out}, SharedAttrs(), t.acc);
    b.finish(a, t);
  }
  if (b.needs(bt)) {
    Builder::Target t = b.target(bt, g.tensors[bt].shape);
    TensorId out = t.t;
    if (g.tensors[bt].shape.size() < 2)
      out = b.view(t.t, bs, denseStrides(bs), 0);
    b.emit(OpKind::Matmul, {b.transposed(A), D}, {out}, SharedAttrs(), t.acc);
    b.finish(bt, t);
  }
}

void matmulBackward(Builder &b, const Op &op, TensorId dy) {
  Graph &g = b.g;
  TensorId a = op.inputs[0], bt = op.inputs[1];
  // Copies, not references: adding tensors grows g.tensors.
  const Shape as = g.tensors[a].shape, bs = g.tensors[bt].shape;
  if (as.size() < 2 || bs.size() < 2) {
    vectorMatmulBackward(b, op, dy);
    return;
  }
  if (b.needs(a)) { // dA = dC · Bᵀ, at C's batch shape
    Shape s = g.tensors[dy].shape;
    s.back() = as.back();
    Builder::Target t = b.target(a, s);
    b.emit(OpKind::Matmul, {dy, b.transposed(bt)}, {t.t}, SharedAttrs(), t.acc);
    b.finish(a, t);
  }
  if (b.needs(bt)) { // dB = Aᵀ · dC; a 2-D B against a batched A sums over the flattened batch
    if (bs.size() == 2 && as.size() > 2) {
      Builder::Target t = b.target(bt, bs);
      b.emit(OpKind::Matmul, {b.transposed(b.flattened(a)), b.flattened(dy)}, {t.t}, SharedAttrs(),
             t.acc);
      b.finish(bt, t);
    } else {
      Shape s = g.tensors[dy].shape;
      s[s.size() - 2] = bs[bs.size() - 2];
      Builder::Target t = b.target(bt, s);
      b.emit(OpKind::Matmul, {b.transposed(a), dy}, {t.t}, SharedAttrs(), t.acc);
      b.finish(bt, t);
    }
  }
}

/// moe_backward(inputs..., what the forward kept..., dy) → the gradients of x, the gates and
/// the three expert weights (input 2, the chosen experts' indices, has none).
void moeBackward(Builder &b, const Op &op, TensorId dy) {
  llvm::SmallVector<TensorId, 3> in(op.inputs.begin(), op.inputs.end());
  in.append(op.outputs.begin() + 1, op.outputs.end());
  in.push_back(dy);
  b.multiBackward(op, OpKind::MoeBackward, in, {0u, 1u, 3u, 4u, 5u});
}

/// conv2d_backward(x, w, dy) → dx, dw, db.
void conv2dBackward(Builder &b, const Op &op, TensorId dy) {
  b.multiBackward(op, OpKind::Conv2dBackward, {op.inputs[0], op.inputs[1], dy}, {0u, 1u, 2u});
}

/// pool2d_backward([argmax indices,] dy) → dx; max pooling reads the indices it kept.
void poolBackward(Builder &b, const Op &op, TensorId dy) {
  TensorId x = op.inputs[0];
  if (!b.needs(x))
    return;
  OpAttrs a = op.attrs;
  a.of = op.kind;
  a.newShape = b.g.tensors[x].shape;
  llvm::SmallVector<TensorId, 3> in;
  if (op.kind == OpKind::MaxPool2d)
    in.push_back(op.outputs[1]);
  in.push_back(dy);
  bool acc = b.accumulateNext(x);
  b.emit(OpKind::PoolBackward, in, {b.gradOf(x)}, a, acc ? 1 : 0);
}

} // namespace

BACKWARD(Matmul, matmulBackward)
BACKWARD(Moe, moeBackward)
BACKWARD(Conv2d, conv2dBackward)
BACKWARD(MaxPool2d, poolBackward)
BACKWARD(AvgPool2d, poolBackward)
NO_BACKWARD(MoeBackward, "a backward op: autodiff adds it and never differentiates it")
NO_BACKWARD(Conv2dBackward, "a backward op: autodiff adds it and never differentiates it")
NO_BACKWARD(PoolBackward, "a backward op: autodiff adds it and never differentiates it")

} // namespace backward
} // namespace tally
