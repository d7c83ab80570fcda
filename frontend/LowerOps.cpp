// Lowering: the op a primitive call appends, by op family (frontend/LowerPrimitives.cpp binds
// the call's arguments and appends the op). primitiveOp dispatches on the primitive's kind to
// one function per family (elementwise, matmul, attention, norms, reductions, convolution and
// pooling, shapes, indexing), which reads the arguments each kind takes into its OpAttrs and
// inputs and calls op1.
#include "frontend/Lowerer.h"

#include "support/Format.h"

namespace tally {
namespace lowering {

Value Lowerer::primitiveOp(const Bound &b, const Expr &e, Scope &scope) {
  switch (b.prim->kind) {
  case OpKind::Relu:
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Exp:
  case OpKind::NextTokens:
  case OpKind::Rope:
  case OpKind::Dropout:
    return elementwiseOp(b, e, scope);
  case OpKind::Matmul:
  case OpKind::Moe:
    return matmulOp(b, e, scope);
  case OpKind::Attention:
    return attentionOp(b, e, scope);
  case OpKind::LayerNorm:
  case OpKind::RmsNorm:
    return normOp(b, e, scope);
  case OpKind::Sum:
  case OpKind::Mean:
  case OpKind::Softmax:
  case OpKind::TopK:
  case OpKind::CrossEntropy:
    return reductionOp(b, e, scope);
  case OpKind::Conv2d:
  case OpKind::MaxPool2d:
  case OpKind::AvgPool2d:
    return convolutionOp(b, e, scope);
  case OpKind::BroadcastTo:
  case OpKind::Reshape:
  case OpKind::Transpose:
  case OpKind::Concat:
  case OpKind::Split:
    return shapeOp(b, e, scope);
  case OpKind::Embedding:
  case OpKind::Gather:
  case OpKind::Positions:
    return indexingOp(b, e, scope);
  default:
    break;
  }
  return noLowering(b);
}

Value Lowerer::noLowering(const Bound &b) {
  internalError(b, "the lowering has no case for it");
  return {};
}

/// Activations and the other ops of one input read element by element: relu, gelu,
/// silu, tanh, sigmoid, exp, next_tokens, rope, dropout.
Value Lowerer::elementwiseOp(const Bound &b, const Expr &e, Scope &scope) {
  const OpKind kind = b.prim->kind;
  OpAttrs attrs;
  TensorId x = kNone;
  switch (kind) {
  case OpKind::Relu:
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Exp:
  case OpKind::NextTokens:
    if (!tensorArg(b, "x", x))
      return {};
    return op1(kind, {x}, attrs, e, scope);
  case OpKind::Rope: { // fraction < 1: partial rotary (NeoX rotary_pct)
    if (!tensorArg(b, "x", x))
      return {};
    auto f = numberArg(b, "fraction");
    if (!f)
      return {};
    if (!(*f > 0 && *f <= 1)) {
      const Value &v = b.values[slot(b, "fraction")];
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "'fraction' of rope is the share of each head's dims rotated, in (0, 1], not " +
                       significant(*f))
          .range(v.range);
      return {};
    }
    attrs.fraction = *f;
    return op1(OpKind::Rope, {x}, attrs, e, scope);
  }
  case OpKind::Dropout: {
    if (!tensorArg(b, "x", x))
      return {};
    auto p = probability(b, "p");
    if (!p)
      return {};
    attrs.p = *p;
    return op1(OpKind::Dropout, {x}, attrs, e, scope);
  }
  default:
    break;
  }
  return noLowering(b);
}

/// Matrix products: matmul, and moe (each token through its experts' gate, up and down
/// matmuls).
Value Lowerer::matmulOp(const Bound &b, const Expr &e, Scope &scope) {
  const OpKind kind = b.prim->kind;
  OpAttrs attrs;
  TensorId x = kNone, y = kNone;
  switch (kind) {
  case OpKind::Matmul:
    if (!tensorArg(b, "a", x) || !tensorArg(b, "b", y))
      return {};
    return op1(OpKind::Matmul, {x, y}, attrs, e, scope);
  case OpKind::Moe: {
    llvm::SmallVector<TensorId, 3> ins(6, kNone);
    static const char *const names[] = {"x", "gates", "indices", "w_gate", "w_up", "w_down"};
    for (unsigned i = 0; i < 6; ++i)
      if (!tensorArg(b, names[i], ins[i]))
        return {};
    auto cf = numberArg(b, "capacity_factor");
    if (!cf)
      return {};
    if (*cf < 0 || *cf > 1e6) {
      const Value &v = b.values[slot(b, "capacity_factor")];
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "capacity_factor is 0 (no cap) or a positive factor such as 1.25, not " +
                       significant(*cf))
          .range(v.range);
      return {};
    }
    attrs.capacity = *cf;
    return op1(OpKind::Moe, ins, attrs, e, scope);
  }
  default:
    break;
  }
  return noLowering(b);
}

/// attention(q, k, v, heads, ...): its heads, mask, dropout and flags.
Value Lowerer::attentionOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone, y = kNone, z = kNone;
  if (!tensorArg(b, "q", x) || !tensorArg(b, "k", y) || !tensorArg(b, "v", z))
    return {};
  auto heads = intArg(b, "heads");
  auto kv = intArg(b, "kv_heads", heads ? *heads : 1); // kv_heads = heads
  auto causal = boolArg(b, "causal");
  auto fused = boolArg(b, "fused");
  auto p = probability(b, "dropout");
  auto alibi = boolArg(b, "alibi");
  if (!heads || !kv || !causal || !fused || !p || !alibi)
    return {};
  TensorId mask = kNone;
  size_t maskSlot = slot(b, "mask");
  if (b.has(maskSlot) && !tensorArg(b, "mask", mask))
    return {};
  if (mask != kNone && isFloat(g.tensors[mask].dtype)) {
    diags.report(DiagKind::TypeMismatch, b.values[maskSlot].range.Start,
                 "'mask' of 'attention' is a padding mask of integers or booleans "
                 "[batch, seq_kv] (nonzero: attend), not " +
                     nameOf(g.tensors[mask].dtype).str())
        .range(b.values[maskSlot].range);
    return {};
  }
  if (*heads <= 0 || *kv <= 0) {
    diags.report(DiagKind::InvalidValue, e.range.Start,
                 "attention needs a positive number of heads")
        .range(e.range);
    return {};
  }
  attrs.heads = *heads;
  attrs.kvHeads = *kv;
  attrs.causal = *causal;
  attrs.fused = *fused;
  attrs.p = *p;
  attrs.alibi = *alibi;
  attrs.hasMask = mask != kNone;
  if (mask != kNone)
    return op1(OpKind::Attention, {x, y, z, mask}, attrs, e, scope);
  return op1(OpKind::Attention, {x, y, z}, attrs, e, scope);
}

/// Normalizations: layer_norm and rms_norm.
Value Lowerer::normOp(const Bound &b, const Expr &e, Scope &scope) {
  const OpKind kind = b.prim->kind;
  OpAttrs attrs;
  TensorId x = kNone, y = kNone, z = kNone;
  switch (kind) {
  case OpKind::LayerNorm: {
    if (!tensorArg(b, "x", x) || !tensorArg(b, "weight", y))
      return {};
    if (b.has(slot(b, "bias")) && !tensorArg(b, "bias", z))
      return {};
    auto eps = numberArg(b, "eps");
    if (!eps)
      return {};
    attrs.eps = *eps;
    if (z == kNone)
      return op1(OpKind::LayerNorm, {x, y}, attrs, e, scope);
    return op1(OpKind::LayerNorm, {x, y, z}, attrs, e, scope);
  }
  case OpKind::RmsNorm: {
    if (!tensorArg(b, "x", x) || !tensorArg(b, "weight", y))
      return {};
    auto eps = numberArg(b, "eps");
    if (!eps)
      return {};
    attrs.eps = *eps;
    return op1(OpKind::RmsNorm, {x, y}, attrs, e, scope);
  }
  default:
    break;
  }
  return noLowering(b);
}

/// Reductions along a dim (or over everything): sum, mean, softmax, top_k, cross_entropy.
Value Lowerer::reductionOp(const Bound &b, const Expr &e, Scope &scope) {
  const OpKind kind = b.prim->kind;
  OpAttrs attrs;
  TensorId x = kNone, y = kNone;
  switch (kind) {
  case OpKind::Sum:
  case OpKind::Mean: {
    if (!tensorArg(b, "x", x))
      return {};
    // Without `dim`, over every element (dim keeps OpAttrs' -1).
    attrs.reduceAll = !b.has(slot(b, "dim"));
    auto dim = attrs.reduceAll ? std::optional<int64_t>(attrs.dim) : intArg(b, "dim");
    auto keep = boolArg(b, "keepdim");
    if (!dim || !keep)
      return {};
    attrs.dim = *dim;
    attrs.keepDim = *keep;
    return op1(kind, {x}, attrs, e, scope);
  }
  case OpKind::Softmax: {
    if (!tensorArg(b, "x", x))
      return {};
    auto dim = intArg(b, "dim");
    if (!dim)
      return {};
    attrs.dim = *dim;
    return op1(OpKind::Softmax, {x}, attrs, e, scope);
  }
  case OpKind::TopK: {
    if (!tensorArg(b, "x", x))
      return {};
    auto k = intArg(b, "k");
    auto dim = intArg(b, "dim");
    if (!k || !dim)
      return {};
    attrs.k = *k;
    attrs.dim = *dim;
    return op1(OpKind::TopK, {x}, attrs, e, scope);
  }
  case OpKind::CrossEntropy:
    if (!tensorArg(b, "logits", x) || !tensorArg(b, "labels", y))
      return {};
    return op1(OpKind::CrossEntropy, {x, y}, attrs, e, scope);
  default:
    break;
  }
  return noLowering(b);
}

/// Convolutions and pooling over the last two dims: conv2d, max_pool2d, avg_pool2d.
Value Lowerer::convolutionOp(const Bound &b, const Expr &e, Scope &scope) {
  const OpKind kind = b.prim->kind;
  OpAttrs attrs;
  TensorId x = kNone, y = kNone, z = kNone;
  switch (kind) {
  case OpKind::Conv2d: {
    if (!tensorArg(b, "x", x) || !tensorArg(b, "weight", y))
      return {};
    if (b.has(slot(b, "bias")) && !tensorArg(b, "bias", z))
      return {};
    if (!pairArg(b, "stride", 1, attrs.strides) || !pairArg(b, "padding", 0, attrs.pads))
      return {};
    const Shape &w = g.tensors[y].shape;
    if (w.size() == 4) {
      attrs.window[0] = w[2].size;
      attrs.window[1] = w[3].size;
    }
    if (z == kNone)
      return op1(OpKind::Conv2d, {x, y}, attrs, e, scope);
    return op1(OpKind::Conv2d, {x, y, z}, attrs, e, scope);
  }
  case OpKind::MaxPool2d:
  case OpKind::AvgPool2d: {
    if (!tensorArg(b, "x", x) || !pairArg(b, "kernel", 1, attrs.window))
      return {};
    // The stride defaults to the window, as in PyTorch.
    if (!pairArg(b, "stride", 1, attrs.strides, attrs.window[0]) ||
        !pairArg(b, "padding", 0, attrs.pads))
      return {};
    if (!b.has(slot(b, "stride")))
      attrs.strides[1] = attrs.window[1];
    return op1(kind, {x}, attrs, e, scope);
  }
  default:
    break;
  }
  return noLowering(b);
}

/// Views and copies that change a shape: broadcast_to, reshape, transpose, concat, split.
Value Lowerer::shapeOp(const Bound &b, const Expr &e, Scope &scope) {
  const OpKind kind = b.prim->kind;
  OpAttrs attrs;
  TensorId x = kNone;
  switch (kind) {
  case OpKind::BroadcastTo:
  case OpKind::Reshape:
    if (!tensorArg(b, "x", x) || !shapeArg(b, "shape", attrs.newShape))
      return {};
    return op1(kind, {x}, attrs, e, scope);
  case OpKind::Transpose: {
    if (!tensorArg(b, "x", x))
      return {};
    auto d0 = intArg(b, "dim0");
    auto d1 = intArg(b, "dim1");
    if (!d0 || !d1)
      return {};
    attrs.transposeA = *d0;
    attrs.transposeB = *d1;
    return op1(OpKind::Transpose, {x}, attrs, e, scope);
  }
  case OpKind::Concat: {
    auto dim = intArg(b, "dim");
    if (!dim)
      return {};
    attrs.dim = *dim;
    llvm::SmallVector<TensorId, 3> ins;
    const Value &list = b.values[slot(b, "tensors")];
    std::vector<Value> items = list.kind == Value::Tuple ? list.elems : std::vector<Value>{list};
    for (const Value &v : items) {
      if (v.kind != Value::Tensor) {
        diags.report(DiagKind::TypeMismatch, v.range.Start,
                     "concat joins tensors, not " + v.describe())
            .range(v.range);
        return {};
      }
      ins.push_back(v.tensor);
    }
    return op1(OpKind::Concat, ins, attrs, e, scope);
  }
  case OpKind::Split: {
    if (!tensorArg(b, "x", x))
      return {};
    auto parts = intArg(b, "parts");
    auto dim = intArg(b, "dim");
    if (!parts || !dim)
      return {};
    if (*parts <= 0 || *parts > 4096) {
      const Value &v = b.values[slot(b, "parts")];
      diags.report(DiagKind::InvalidValue, v.range.Start, "split needs between 1 and 4096 parts")
          .range(v.range);
      return {};
    }
    attrs.parts = *parts;
    attrs.dim = *dim;
    return op1(OpKind::Split, {x}, attrs, e, scope);
  }
  default:
    break;
  }
  return noLowering(b);
}

/// Lookups by index: embedding, gather, and positions(n) (the indices 0..n-1).
Value Lowerer::indexingOp(const Bound &b, const Expr &e, Scope &scope) {
  const OpKind kind = b.prim->kind;
  OpAttrs attrs;
  TensorId x = kNone, y = kNone;
  switch (kind) {
  case OpKind::Embedding:
    if (!tensorArg(b, "ids", x) || !tensorArg(b, "weight", y))
      return {};
    return op1(OpKind::Embedding, {x, y}, attrs, e, scope);
  case OpKind::Gather: {
    if (!tensorArg(b, "x", x) || !tensorArg(b, "indices", y))
      return {};
    auto dim = intArg(b, "dim");
    if (!dim)
      return {};
    attrs.dim = *dim;
    return op1(OpKind::Gather, {x, y}, attrs, e, scope);
  }
  case OpKind::Positions: {
    auto n = intArg(b, "n");
    if (!n)
      return {};
    if (*n <= 0) {
      diags.report(DiagKind::InvalidValue, e.range.Start, "positions(n) needs n > 0")
          .range(e.range);
      return {};
    }
    Dim d;
    d.size = *n;
    const Expr *arg = b.exprs[slot(b, "n")];
    if (arg->kind == ExprKind::Name && (arg->text == "seq" || arg->text == "batch") &&
        !scope.locals.count(arg->text) && !scope.module->consts.count(arg->text))
      d.sym = g.symbol(arg->text);
    attrs.newShape.push_back(d);
    return op1(OpKind::Positions, {}, attrs, e, scope);
  }
  default:
    break;
  }
  return noLowering(b);
}
} // namespace lowering
} // namespace tally
