// Lowering of the elementwise family (ir/ops/Elementwise.cpp): the pure unary kinds, one table
// entry per row of ir/ops/Unary.def, so a new unary primitive needs no code here; the binary
// kinds, one entry per row of ir/ops/Binary.def (operators, not calls); rope, dropout and the
// backward ops of the family. frontend/LowerOps.cpp indexes the entries.
#include "frontend/Lowerer.h"

#include "support/Format.h"

namespace tally {
namespace lowering {

/// A primitive of one tensor `x` and nothing else: the pure unary kinds (relu, gelu, silu,
/// tanh, sigmoid, exp) and next_tokens.
Value Lowerer::oneTensorOp(const Bound &b, const Expr &e, Scope &scope) {
  TensorId x = kNone;
  if (!tensorArg(b, "x", x))
    return {};
  return op1(b.prim->kind, {x}, OpAttrs(), e, scope);
}

/// rope(x, fraction, head): fraction < 1 is partial rotary (NeoX rotary_pct); head > 0 fixes
/// the head size (else the attention that reads it sets it: setRopeHeadDims).
Value Lowerer::ropeOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
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
  auto head = intArg(b, "head");
  if (!head)
    return {};
  if (*head != 0) {
    int64_t w = g.tensors[x].shape.empty() ? 0 : g.tensors[x].shape.back().size;
    if (*head < 0 || *head % 2 != 0 || w % *head != 0) {
      const Value &v = b.values[slot(b, "head")];
      auto d = diags.report(DiagKind::InvalidValue, v.range.Start,
                            "'head' of rope is the head size whose pairs of dims it turns: an "
                            "even number dividing the width " +
                                std::to_string(w) + ", or 0 for the attention's, not " +
                                std::to_string(*head));
      d.range(v.range);
      context(d);
      return {};
    }
    attrs.headDim = *head;
  }
  return op1(OpKind::Rope, {x}, attrs, e, scope);
}

/// dropout(x, p).
Value Lowerer::dropoutOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
  if (!tensorArg(b, "x", x))
    return {};
  auto p = probability(b, "p");
  if (!p)
    return {};
  attrs.p = *p;
  return op1(OpKind::Dropout, {x}, attrs, e, scope);
}

// The pure unary kinds: a call of one takes one tensor (neg has no primitive: `-x` appends it,
// frontend/LowerEvaluate.cpp).
#define UNARY(ID, FWD, GRAD, READS, FWD_EXPS, GRAD_EXPS, RUNTIME) LOWERING(ID, &Lowerer::oneTensorOp)
#include "ir/ops/Unary.def"
// The binary kinds are operators (`a + b`, `a - b`, `a * b`, `a / b`), not calls.
#define BINARY(ID, RUNTIME)                                                                        \
  NO_LOWERING(ID, "an operator, not a call: binary() in frontend/LowerEvaluate.cpp appends it")
#include "ir/ops/Binary.def"
LOWERING(Rope, &Lowerer::ropeOp)
LOWERING(Dropout, &Lowerer::dropoutOp)
NO_LOWERING(UnaryBackward, "the autodiff's: a unary op's gradient")
NO_LOWERING(DivBackward, "the autodiff's: a division's gradient")

} // namespace lowering
} // namespace tally
