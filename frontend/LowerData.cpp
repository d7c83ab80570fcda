// Lowering of the reductions (ir/ops/Reduce.cpp), the data family (Data.cpp: lookups, index
// generation, top-k, concatenation, broadcasts, copies) and the views (View.cpp), with the ops
// of those families that only an operator, the autodiff or the lowering itself makes. Each
// kind's table entry follows the code that reads its arguments; frontend/LowerOps.cpp indexes
// them.
#include "frontend/Lowerer.h"

namespace tally {
namespace lowering {

// ---------------------------------------------------------------------------------------------
// Reductions along a dim (or over everything): sum, mean.

Value Lowerer::reduceOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
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
  return op1(b.prim->kind, {x}, attrs, e, scope);
}
LOWERING(Sum, &Lowerer::reduceOp)
LOWERING(Mean, &Lowerer::reduceOp)
NO_LOWERING(ReduceTo, "the autodiff's: a broadcast operand's gradient summed to its shape")
NO_LOWERING(Expand, "the autodiff's: sum's and mean's gradient")

// ---------------------------------------------------------------------------------------------
// Lookups by index and index generation: embedding, gather, topk, positions(n) (the indices
// 0..n-1), next_tokens.

/// A learned positional table read at positions(n) (`wpe(positions(seq))`) needs n rows: a
/// longer sequence would index past the table (the generated step fails there). The error is
/// at the plan's `seq` when n is the plan's sequence length, with notes at the lookup and the
/// table's declaration.
bool Lowerer::positionsFit(TensorId ids, TensorId table, const Expr &e, Scope &scope) {
  OpId p = g.tensors[ids].producer;
  const Shape &rows = g.tensors[table].shape;
  if (p == kNone || g.ops[p].kind != OpKind::Positions || rows.empty() ||
      g.ops[p].attrs->newShape.empty())
    return true;
  const Dim &n = g.ops[p].attrs->newShape[0];
  if (n.size <= rows[0].size)
    return true;
  const Instance &in = g.instances[scope.module->instance];
  std::string table_ = in.where.isValid() ? "'" + g.instancePath(scope.module->instance) + "'"
                                          : "the embedding";
  std::string what = std::to_string(n.size) + " positions, but the learned positional table " +
                     table_ + " has " + std::to_string(rows[0].size) + " rows: positions " +
                     std::to_string(rows[0].size) + " to " + std::to_string(n.size - 1) +
                     " have no embedding";
  auto seq = settingRanges.find("seq");
  bool fromSeq = n.sym != 0 && g.symbols[n.sym] == "seq" && seq != settingRanges.end() &&
                 seq->second.isValid();
  llvm::SMRange at = fromSeq ? seq->second : g.ops[p].range;
  auto d = diags.report(DiagKind::InvalidValue, at.Start,
                        (fromSeq ? "seq = " + std::to_string(n.size) + " asks for " : "") +
                            what);
  d.range(at);
  d.note(g.ops[p].range.Start, "the positions are made here", g.ops[p].range);
  if (in.where.isValid())
    d.note(in.where.Start,
           "the table is declared here with " + std::to_string(rows[0].size) + " rows", in.where);
  else
    d.note(e.range.Start, "the table is read here", e.range);
  fail();
  return false;
}

Value Lowerer::embeddingOp(const Bound &b, const Expr &e, Scope &scope) {
  TensorId x = kNone, y = kNone;
  if (!tensorArg(b, "ids", x) || !tensorArg(b, "weight", y))
    return {};
  if (!positionsFit(x, y, e, scope))
    return {};
  return op1(OpKind::Embedding, {x, y}, OpAttrs(), e, scope);
}
LOWERING(Embedding, &Lowerer::embeddingOp)
NO_LOWERING(EmbeddingBackward, "the autodiff's: embedding's gradient")

Value Lowerer::gatherOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone, y = kNone;
  if (!tensorArg(b, "x", x) || !tensorArg(b, "indices", y))
    return {};
  auto dim = intArg(b, "dim");
  if (!dim)
    return {};
  attrs.dim = *dim;
  return op1(OpKind::Gather, {x, y}, attrs, e, scope);
}
LOWERING(Gather, &Lowerer::gatherOp)

/// topk(x, k, dim): returns (values, indices).
Value Lowerer::topKOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
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
LOWERING_ALL(TopK, &Lowerer::topKOp)
NO_LOWERING(ScatterAdd, "the autodiff's: gather's and topk's gradient")

Value Lowerer::positionsOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
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
LOWERING(Positions, &Lowerer::positionsOp)
LOWERING(NextTokens, &Lowerer::oneTensorOp) // next_tokens(x): one tensor (LowerElementwise.cpp)

// ---------------------------------------------------------------------------------------------
// Copies that join or change a shape: concat, broadcast_to, and those nobody calls.

Value Lowerer::concatOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
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
LOWERING(Concat, &Lowerer::concatOp)

/// broadcast_to and reshape(x, shape).
Value Lowerer::newShapeOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
  if (!tensorArg(b, "x", x) || !shapeArg(b, "shape", attrs.newShape))
    return {};
  return op1(b.prim->kind, {x}, attrs, e, scope);
}
LOWERING(BroadcastTo, &Lowerer::newShapeOp)
NO_LOWERING(Contiguous, "the lowering's and the autodiff's dense copy for a kernel (op1, dense)")
NO_LOWERING(Fill, "step assembly's: the loss gradient's seed")

// ---------------------------------------------------------------------------------------------
// Views: reshape (above), transpose, split; slice is the operator x[...].

LOWERING(Reshape, &Lowerer::newShapeOp)

Value Lowerer::transposeOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
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
LOWERING(Transpose, &Lowerer::transposeOp)

/// split(x, parts, dim): returns every part.
Value Lowerer::splitOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
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
LOWERING_ALL(Split, &Lowerer::splitOp)
NO_LOWERING(Slice, "an operator, not a call: slice() in frontend/LowerEvaluate.cpp appends it")

} // namespace lowering
} // namespace tally
