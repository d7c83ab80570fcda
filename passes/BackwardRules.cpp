// The backward of each op kind (step 3 of passes/Backward.cpp): the ops that compute the
// gradients of an op's inputs from the gradient of its first output, one builder per kind
// (PyTorch's derivatives.yaml, written once here): matmul as two matmuls over transposed views
// (flattening the batch when the other operand is a weight), elementwise ops as elementwise
// ops, and a backward kind per fused op (norms, softmax, attention, cross entropy, embedding,
// moe; topk and gather scatter_add). A gradient computed at a broadcast shape is summed back
// with reduce_to. The Builder is passes/BackwardBuilder.h.
#include "passes/BackwardBuilder.h"

namespace tally {
namespace backward {

// ------------------------------------------------------------------------------------------
// Step 3: the backward of one op. `dy` is the gradient of its first output.

/// A view of `t` with shape `s` and strides `st` over the same storage.
TensorId Builder::view(TensorId t, const Shape &s, llvm::ArrayRef<int64_t> st, int64_t offset) {
  Tensor v;
  v.shape = s;
  v.dtype = g.tensors[t].dtype;
  v.role = g.tensors[t].role == TensorRole::Gradient ? TensorRole::Gradient
                                                     : TensorRole::Activation;
  v.viewOf = base(t);
  v.layout = Layout(st, offset);
  v.producer = g.tensors[t].producer;
  TensorId id = g.addTensor(std::move(v));
  g.gradient.push_back(kNone);
  return id;
}

TensorId Builder::transposed(TensorId t) {
  const Tensor &x = g.tensors[t];
  Shape s = x.shape;
  llvm::SmallVector<int64_t, 4> st = stridesOf(x.shape, x.layout);
  size_t r = s.size();
  std::swap(s[r - 1], s[r - 2]);
  std::swap(st[r - 1], st[r - 2]);
  return view(t, s, st, x.layout.offset());
}

/// [..., K] viewed as [rows, K]; nullopt-free: callers only flatten tensors whose batch
/// dimensions collapse (acceptsLayout guarantees it for matmul operands).
TensorId Builder::flattened(TensorId t) {
  const Tensor &x = g.tensors[t];
  Shape s{Dim{static_cast<int64_t>(numel(x.shape) / std::max<int64_t>(1, x.shape.back().size)), 0},
          x.shape.back()};
  auto st = viewStrides(x.shape, stridesOf(x.shape, x.layout), s);
  if (!st) // not expressible as a view: copy first
    return flattened(copyDense(t));
  return view(t, s, *st, x.layout.offset());
}

TensorId Builder::copyDense(TensorId t) {
  TensorId d = temp(g.tensors[t].shape, g.tensors[t].dtype, g.tensors[t].gradOf);
  emit(OpKind::Contiguous, {t}, {d}, SharedAttrs());
  return d;
}

void Builder::matmulBackward(const Op &op, TensorId dy) {
  TensorId a = op.inputs[0], b = op.inputs[1];
  // Copies, not references: adding tensors grows g.tensors.
  const Shape as = g.tensors[a].shape, bs = g.tensors[b].shape;
  if (as.size() < 2 || bs.size() < 2) {
    vectorMatmulBackward(op, dy);
    return;
  }
  if (needs(a)) { // dA = dC · Bᵀ, at C's batch shape
    Shape s = g.tensors[dy].shape;
    s.back() = as.back();
    Target t = target(a, s);
    emit(OpKind::Matmul, {dy, transposed(b)}, {t.t}, SharedAttrs(), t.acc);
    finish(a, t);
  }
  if (needs(b)) { // dB = Aᵀ · dC; a 2-D B against a batched A sums over the flattened batch
    if (bs.size() == 2 && as.size() > 2) {
      Target t = target(b, bs);
      emit(OpKind::Matmul, {transposed(flattened(a)), flattened(dy)}, {t.t}, SharedAttrs(), t.acc);
      finish(b, t);
    } else {
      Shape s = g.tensors[dy].shape;
      s[s.size() - 2] = bs[bs.size() - 2];
      Target t = target(b, s);
      emit(OpKind::Matmul, {transposed(a), dy}, {t.t}, SharedAttrs(), t.acc);
      finish(b, t);
    }
  }
}

/// A vector operand ([K] @ [K, N], [M, K] @ [K]): the outer-product and mat-vec forms,
/// written with unit dimensions as views.
void Builder::vectorMatmulBackward(const Op &op, TensorId dy) {
  TensorId a = op.inputs[0], b = op.inputs[1];
  auto asMatrix = [&](TensorId t, bool row) {
    const Tensor &x = g.tensors[t];
    if (x.shape.size() >= 2)
      return t;
    Shape s = row ? Shape{Dim{1, 0}, x.shape[0]} : Shape{x.shape[0], Dim{1, 0}};
    llvm::SmallVector<int64_t, 4> st = row ? llvm::SmallVector<int64_t, 4>{x.shape[0].size, 1}
                                           : llvm::SmallVector<int64_t, 4>{1, 1};
    return view(t, s, st, x.layout.offset());
  };
  TensorId A = asMatrix(a, true), B = asMatrix(b, false);
  // dy as [M, N] with unit dimensions where A or B was a vector.
  const Shape as = g.tensors[A].shape, bs = g.tensors[B].shape;
  Shape ds{as[as.size() - 2], bs.back()};
  TensorId D = view(dy, ds, denseStrides(ds), g.tensors[dy].layout.offset());
  if (needs(a)) {
    Target t = target(a, g.tensors[a].shape);
    TensorId out = t.t;
    if (g.tensors[a].shape.size() < 2)
      out = view(t.t, as, denseStrides(as), 0);
    emit(OpKind::Matmul, {D, transposed(B)}, {out}, SharedAttrs(), t.acc);
    finish(a, t);
  }
  if (needs(b)) {
    Target t = target(b, g.tensors[b].shape);
    TensorId out = t.t;
    if (g.tensors[b].shape.size() < 2)
      out = view(t.t, bs, denseStrides(bs), 0);
    emit(OpKind::Matmul, {transposed(A), D}, {out}, SharedAttrs(), t.acc);
    finish(b, t);
  }
}

void Builder::binaryBackward(const Op &op, TensorId dy) {
  const OpAttrs &at = op.attrs;
  TensorId y = op.outputs[0];
  if (at.hasScalar) {
    TensorId x = op.inputs[0];
    if (!needs(x))
      return;
    Target t = target(x, g.tensors[dy].shape);
    OpAttrs s;
    switch (op.kind) {
    case OpKind::Add:
      emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
      break;
    case OpKind::Sub:
      if (at.scalarOnLeft)
        emit(OpKind::Neg, {dy}, {t.t}, SharedAttrs(), t.acc);
      else
        emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
      break;
    case OpKind::Mul:
      s.hasScalar = true;
      s.scalar = at.scalar;
      emit(OpKind::Mul, {dy}, {t.t}, s, t.acc);
      break;
    default: // Div
      if (at.scalarOnLeft) { // d(c/x) = -g·y²/c
        s.hasScalar = true;
        s.scalar = at.scalar;
        s.scalarOnLeft = true;
        emit(OpKind::DivBackward, {y, dy}, {t.t}, s, t.acc);
      } else {
        s.hasScalar = true;
        s.scalar = at.scalar;
        emit(OpKind::Div, {dy}, {t.t}, s, t.acc);
      }
    }
    finish(x, t);
    return;
  }
  TensorId a = op.inputs[0], b = op.inputs[1];
  const Shape ds = g.tensors[dy].shape;
  for (unsigned i = 0; i < 2; ++i) {
    TensorId x = op.inputs[i];
    if (!needs(x))
      continue;
    bool identity = op.kind == OpKind::Add || (op.kind == OpKind::Sub && i == 0);
    if (identity && numel(ds) != numel(g.tensors[x].shape)) {
      writeGrad(x, dy); // a broadcast bias: sum dy straight into its gradient
      continue;
    }
    Target t = target(x, ds);
    switch (op.kind) {
    case OpKind::Add:
      emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
      break;
    case OpKind::Sub:
      if (i == 0)
        emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
      else
        emit(OpKind::Neg, {dy}, {t.t}, SharedAttrs(), t.acc);
      break;
    case OpKind::Mul:
      emit(OpKind::Mul, {dy, i == 0 ? b : a}, {t.t}, SharedAttrs(), t.acc);
      break;
    default: // Div: da = g / b; db = -g·a/b²
      if (i == 0)
        emit(OpKind::Div, {dy, b}, {t.t}, SharedAttrs(), t.acc);
      else
        emit(OpKind::DivBackward, {a, b, dy}, {t.t}, SharedAttrs(), t.acc);
    }
    finish(x, t);
  }
}

void Builder::unaryBackward(const Op &op, TensorId dy) {
  TensorId x = op.inputs[0];
  if (!needs(x))
    return;
  Target t = target(x, g.tensors[dy].shape);
  OpAttrs a = op.attrs;
  a.of = op.kind;
  llvm::SmallVector<TensorId, 3> in;
  switch (op.kind) {
  case OpKind::Gelu:
  case OpKind::Silu: in = {x, dy}; break;
  case OpKind::Relu:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Exp: in = {op.outputs[0], dy}; break;
  case OpKind::Dropout: in = {op.outputs[1], dy}; break;
  default: in = {dy}; break; // neg, rope
  }
  emit(OpKind::UnaryBackward, in, {t.t}, a, t.acc);
  finish(x, t);
}

/// A multi-output backward op: the gradients of the inputs in `which` (in that order).
void Builder::multiBackward(const Op &op, OpKind kind, llvm::SmallVector<TensorId, 3> in,
                            llvm::ArrayRef<unsigned> which) {
  OpAttrs a = op.attrs;
  a.gradMask = 0;
  llvm::SmallVector<TensorId, 3> outs;
  uint32_t acc = 0;
  for (unsigned i : which) {
    if (i >= op.inputs.size())
      continue;
    TensorId x = op.inputs[i];
    if (!needs(x))
      continue;
    a.gradMask |= 1u << i;
    if (accumulateNext(x))
      acc |= 1u << outs.size();
    outs.push_back(gradOf(x));
  }
  if (!outs.empty())
    emit(kind, in, outs, a, acc);
}

void Builder::reduceBackward(const Op &op, TensorId dy) {
  TensorId x = op.inputs[0];
  if (!needs(x))
    return;
  const Shape xs = g.tensors[x].shape;
  Target t = target(x, xs);
  OpAttrs a;
  a.newShape = xs;
  a.dim = op.attrs->dim;
  a.reduceAll = op.attrs->reduceAll;
  a.keepDim = op.attrs->keepDim;
  if (op.kind == OpKind::Mean) {
    a.hasScalar = true;
    a.scalar = numel(g.tensors[dy].shape) / numel(xs);
  }
  emit(OpKind::Expand, {dy}, {t.t}, a, t.acc);
  finish(x, t);
}

void Builder::concatBackward(const Op &op, TensorId dy) {
  size_t axis = 0;
  const Tensor y = g.tensors[dy];
  const llvm::SmallVector<int64_t, 4> ys = stridesOf(y.shape, y.layout);
  normalizeAxis(op.attrs->dim, y.shape.size(), axis);
  int64_t at = 0;
  for (TensorId x : op.inputs) {
    const Shape xs = g.tensors[x].shape;
    if (needs(x)) {
      TensorId part = view(dy, xs, ys, y.layout.offset() + at * ys[axis]);
      Target t = target(x, xs);
      emit(OpKind::Contiguous, {part}, {t.t}, SharedAttrs(), t.acc);
      finish(x, t);
    }
    at += xs[axis].size;
  }
}

/// The fused ops' backward (softmax, norms, attention, embedding, cross entropy, topk and
/// gather, moe, conv2d, pooling): one backward kind each, reading what the forward kept.
void Builder::fusedBackward(const Op &op, TensorId dy) {
  switch (op.kind) {
  case OpKind::Softmax: {
    TensorId x = op.inputs[0];
    if (needs(x)) {
      Target t = target(x, g.tensors[dy].shape);
      emit(OpKind::SoftmaxBackward, {op.outputs[0], dy}, {t.t}, op.attrs, t.acc);
      finish(x, t);
    }
    break;
  }
  case OpKind::LayerNorm: {
    llvm::SmallVector<TensorId, 3> in{op.inputs[0], op.inputs[1], op.outputs[1], op.outputs[2], dy};
    multiBackward(op, OpKind::LayerNormBackward, in, {0u, 1u, 2u});
    break;
  }
  case OpKind::RmsNorm:
    multiBackward(op, OpKind::RmsNormBackward, {op.inputs[0], op.inputs[1], op.outputs[1], dy}, {0u, 1u});
    break;
  case OpKind::Attention: {
    llvm::SmallVector<TensorId, 3> in{op.inputs[0], op.inputs[1], op.inputs[2]};
    if (op.attrs->hasMask)
      in.push_back(op.inputs[3]);
    if (op.attrs->fused) {
      in.push_back(op.outputs[0]);
      in.push_back(op.outputs[1]);
    } else {
      for (size_t i = 1; i < op.outputs.size(); ++i)
        in.push_back(op.outputs[i]);
    }
    in.push_back(dy);
    multiBackward(op, OpKind::AttentionBackward, in, {0u, 1u, 2u});
    break;
  }
  case OpKind::Embedding: {
    TensorId w = op.inputs[1];
    if (needs(w)) {
      OpAttrs a;
      a.newShape = g.tensors[w].shape;
      bool acc = accumulateNext(w);
      emit(OpKind::EmbeddingBackward, {op.inputs[0], dy}, {gradOf(w)}, a, acc ? 1 : 0);
    }
    break;
  }
  case OpKind::CrossEntropy: {
    TensorId x = op.inputs[0];
    if (needs(x)) {
      bool acc = accumulateNext(x);
      emit(OpKind::CrossEntropyBackward, {x, op.inputs[1], op.outputs[1], dy}, {gradOf(x)},
           SharedAttrs(), acc ? 1 : 0);
    }
    break;
  }
  case OpKind::TopK:   // the values' gradient scattered back at the chosen indices
  case OpKind::Gather: { // the output gradient scatter-added at the gathered indices
    TensorId x = op.inputs[0];
    if (needs(x)) {
      OpAttrs a;
      a.newShape = g.tensors[x].shape;
      a.dim = op.attrs->dim;
      TensorId idx = op.kind == OpKind::TopK ? op.outputs[1] : op.inputs[1];
      bool acc = accumulateNext(x);
      emit(OpKind::ScatterAdd, {idx, dy}, {gradOf(x)}, a, acc ? 1 : 0);
    }
    break;
  }
  case OpKind::Moe: {
    llvm::SmallVector<TensorId, 3> in(op.inputs.begin(), op.inputs.end());
    in.append(op.outputs.begin() + 1, op.outputs.end());
    in.push_back(dy);
    multiBackward(op, OpKind::MoeBackward, in, {0u, 1u, 3u, 4u, 5u});
    break;
  }
  case OpKind::Conv2d: // conv2d_backward(x, w, dy) → dx, dw, db
    multiBackward(op, OpKind::Conv2dBackward, {op.inputs[0], op.inputs[1], dy}, {0u, 1u, 2u});
    break;
  case OpKind::MaxPool2d:
  case OpKind::AvgPool2d: { // pool2d_backward([argmax indices,] dy) → dx
    TensorId x = op.inputs[0];
    if (needs(x)) {
      OpAttrs a = op.attrs;
      a.of = op.kind;
      a.newShape = g.tensors[x].shape;
      llvm::SmallVector<TensorId, 3> in;
      if (op.kind == OpKind::MaxPool2d)
        in.push_back(op.outputs[1]);
      in.push_back(dy);
      bool acc = accumulateNext(x);
      emit(OpKind::PoolBackward, in, {gradOf(x)}, a, acc ? 1 : 0);
    }
    break;
  }
  default:
    break;
  }
}

void Builder::opBackward(OpId o) {
  const Op op = g.ops[o]; // a copy: emitting ops grows g.ops
  current = o;
  TensorId dy = gradOf(op.outputs[0]);
  switch (op.kind) {
  case OpKind::Matmul: matmulBackward(op, dy); break;
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div: binaryBackward(op, dy); break;
  case OpKind::Neg:
  case OpKind::Relu:
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Exp:
  case OpKind::Dropout:
  case OpKind::Rope: unaryBackward(op, dy); break;
  case OpKind::Softmax:
  case OpKind::LayerNorm:
  case OpKind::RmsNorm:
  case OpKind::Attention:
  case OpKind::Embedding:
  case OpKind::CrossEntropy:
  case OpKind::TopK:
  case OpKind::Gather:
  case OpKind::Moe:
  case OpKind::Conv2d:
  case OpKind::MaxPool2d:
  case OpKind::AvgPool2d: fusedBackward(op, dy); break;
  case OpKind::BroadcastTo: // summed back to x's shape (reduce_to), or copied when no dim grew
    if (needs(op.inputs[0]))
      writeGrad(op.inputs[0], dy);
    break;
  case OpKind::Sum:
  case OpKind::Mean: reduceBackward(op, dy); break;
  case OpKind::Concat: concatBackward(op, dy); break;
  case OpKind::Contiguous: {
    TensorId x = op.inputs[0];
    if (needs(x)) {
      bool acc = accumulateNext(x);
      emit(OpKind::Contiguous, {dy}, {gradOf(x)}, SharedAttrs(), acc ? 1 : 0);
    }
    break;
  }
  default: // views, index data: no backward op
    break;
  }
  current = kNone;
}

} // namespace backward
} // namespace tally
