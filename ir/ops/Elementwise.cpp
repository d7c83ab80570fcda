// The elementwise family's rules: the binary ops (add, sub, mul, div, with numpy broadcasting
// or a constant operand), the unary ops (neg, relu, gelu, silu, tanh, sigmoid, exp, dropout,
// rope, with their FLOPs and transcendentals per element), and their backward ops
// (unary_backward, div_backward). docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

#include <cstdint>

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Binary elementwise: add, sub, mul, div with numpy broadcasting, or one tensor and a constant.

bool inferBinary(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (op.attrs->hasScalar) {
    if (!expectInputs(op, 1, 1, err))
      return false;
    const Tensor &a = in(g, op, 0);
    outs.push_back({a.shape, resultDtype(g, a.dtype)});
    return true;
  }
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Tensor &a = in(g, op, 0), &b = in(g, op, 1);
  Shape shape;
  if (!broadcastShapes(a.shape, b.shape, shape))
    return fail(err, ShapeErrorKind::Broadcast,
                "cannot broadcast " + g.formatShape(a.shape) + " and " + g.formatShape(b.shape) +
                    " for " + opName(op.kind).str());
  bool floating = isFloat(a.dtype) || isFloat(b.dtype);
  outs.push_back({shape, floating ? g.activationDtype : a.dtype});
  return true;
}

struct BinaryCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("one FLOP per output element");
    return c.n();
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    const Op &op = c.op;
    Num<C> n = c.n();
    bool sub = op.kind == OpKind::Sub, mul = op.kind == OpKind::Mul, div = op.kind == OpKind::Div;
    if (op.attrs->hasScalar) {
      if (mul) {
        c.note("g·c");
        return n;
      }
      if (div) {
        if (op.attrs->scalarOnLeft) {
          c.note("c/x: -g·y²/c with y = c/x");
          return c.lit(3) * n;
        }
        c.note("x/c: g/c");
        return n;
      }
      if (sub && op.attrs->scalarOnLeft) {
        c.note("c - x: the negated output gradient");
        return n;
      }
      c.note("x ± c: the output gradient itself");
      return c.lit(0);
    }
    // The local derivative: -g, g·other, g/b or -g·a/b², or none (g itself).
    bool local = true;
    const char *what = "the output gradient itself";
    Num<C> f = n;
    if (sub && i == 1)
      what = "the negation -g";
    else if (mul)
      what = "g times the other operand";
    else if (div && i == 0)
      what = "g/b";
    else if (div)
      what = "-g·a/b²", f = c.lit(3) * n;
    else
      local = false;
    // An input smaller than the output was broadcast: its gradient sums the output gradient
    // over the broadcast dimensions, one add per output element.
    bool broadcast = numel(in(c.g, op, i).shape) != C::value(n);
    const char *bcast = "this input was broadcast: its gradient also sums the output gradient, +n";
    if (!broadcast) {
      c.note(what);
      return local ? f : c.lit(0);
    }
    if (!local) {
      c.note(bcast);
      return n;
    }
    if constexpr (C::kExplains)
      c.note(std::string(what) + "; " + bcast);
    return f + n;
  }
};

void savedBinary(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                 std::vector<SavedTensor> &out) {
  if (op.attrs->hasScalar) {
    if (op.kind == OpKind::Div && op.attrs->scalarOnLeft && need(needGrad, 0))
      keep(g, out, op.outputs[0], "output");
    return;
  }
  if (op.kind == OpKind::Mul) {
    if (need(needGrad, 0))
      keep(g, out, op.inputs[1], "input");
    if (need(needGrad, 1))
      keep(g, out, op.inputs[0], "input");
  } else if (op.kind == OpKind::Div) {
    if (need(needGrad, 0) || need(needGrad, 1))
      keep(g, out, op.inputs[1], "input");
    if (need(needGrad, 1))
      keep(g, out, op.inputs[0], "input");
  }
}

// ---------------------------------------------------------------------------------------------
// Unary elementwise: neg, relu, gelu, silu, tanh, sigmoid, exp, dropout, rope.

/// The costs of a one-tensor elementwise op: a pure unary kind's row of ir/ops/Unary.def, or
/// dropout's and rope's own (dropout keeps its mask: see savedDropout).
struct UnaryCost {
  double fwd, grad; ///< FLOPs per element
  GradReads keeps;
  double transFwd = 0, transGrad = 0; ///< transcendental evaluations per element
};

UnaryCost unaryCost(OpKind k) {
  if (const UnaryDef *u = unaryDef(k))
    return {u->fwdFlops, u->gradFlops, u->reads, u->fwdExps, u->gradExps};
  if (k == OpKind::Dropout)
    return {1, 1, GradReads::Nothing};
  if (k == OpKind::Rope)
    return {3, 3, GradReads::Nothing};
  return {0, 0, GradReads::Nothing};
}

bool inferUnary(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  outs.push_back({x.shape, resultDtype(g, x.dtype)});
  return true;
}

int64_t ropeRotated(const Graph &g, const Op &op);

bool inferRope(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
               ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Shape &x = in(g, op, 0).shape;
  if (x.empty() || x.back().size % 2 != 0)
    return fail(err, ShapeErrorKind::Invalid,
                "rope needs an even last dimension: " + g.formatShape(x));
  if (!(op.attrs->fraction > 0 && op.attrs->fraction <= 1))
    return fail(err, ShapeErrorKind::Invalid,
                "rope fraction must be in (0, 1], got " + std::to_string(op.attrs->fraction));
  if (ropeRotated(g, op) == 0)
    return fail(err, ShapeErrorKind::Invalid,
                "rope fraction " + std::to_string(op.attrs->fraction) +
                    " rotates an odd or zero number of each head's dims in " + g.formatShape(x));
  return inferUnary(g, op, outs, err);
}

/// Dropout returns (y, mask): the mask, one byte per element, is what the backward reads.
bool inferDropout(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  if (!(op.attrs->p >= 0 && op.attrs->p < 1))
    return fail(err, ShapeErrorKind::Invalid,
                "dropout probability must be in [0, 1), got " + std::to_string(op.attrs->p));
  if (!inferUnary(g, op, outs, err))
    return false;
  outs.push_back({outs[0].shape, Dtype::U8});
  return true;
}

/// Partial rotary (NeoX rotary_pct): of each head's hd dims the first floor(hd·fraction) are
/// rotated, the rest pass through. 0 when that count is odd or zero (infer reports it).
int64_t ropeHeadDim(const Graph &g, const Op &op) {
  const Shape &x = in(g, op, 0).shape;
  return op.attrs->headDim > 0 ? op.attrs->headDim : (x.empty() ? 0 : x.back().size);
}
int64_t ropeRotated(const Graph &g, const Op &op) {
  int64_t hd = ropeHeadDim(g, op);
  if (op.attrs->fraction >= 1)
    return hd;
  auto rot = static_cast<int64_t>(static_cast<double>(hd) * op.attrs->fraction);
  return rot > 0 && rot % 2 == 0 ? rot : 0;
}

/// r = rotated / hd, the share of the elements a partial rope rotates (only asked when
/// fraction < 1).
template <class C> Num<C> ropeShareOf(C &c) {
  int64_t hd = ropeHeadDim(c.g, c.op);
  if (hd <= 0)
    return c.lit(0);
  return c.quantity("r", c.named("rotated", c.lit(static_cast<double>(ropeRotated(c.g, c.op)))) /
                             c.named("hd", c.lit(static_cast<double>(hd))));
}

/// The cos and sin rope's kernel evaluates: one pair per rotated pair of each row of the last
/// dimension (the angle depends on the position and the pair, not the head: rt_rows.h).
double ropeTranscendentals(const Graph &g, const Op &op) {
  const Shape &x = in(g, op, 0).shape;
  double width = x.empty() ? 0 : static_cast<double>(x.back().size);
  return width > 0 ? outNumel(g, op) / width * static_cast<double>(ropeRotated(g, op)) : 0;
}

/// FLOPs per element × n. Rope: 3 FLOPs per rotated element (two products and a sum); a
/// pass-through element of a partial rope costs none but is still read and written (the output
/// is a new tensor), so bytes are unchanged. Dropout also writes its mask (its second output),
/// one byte per element.
struct UnaryCounts : BaseCounts {
  template <class C> static Num<C> perElement(C &c, double per, const char *note) {
    if (c.op.kind == OpKind::Rope && c.op.attrs->fraction < 1) {
      c.note("FLOPs per rotated element × n × r, the share of each head's dims rope rotates");
      Num<C> n = c.n();
      return c.lit(per) * n * ropeShareOf(c);
    }
    c.note(note);
    return c.lit(per) * c.n();
  }
  template <class C> static Num<C> flops(C &c) {
    return perElement(c, unaryCost(c.op.kind).fwd, "FLOPs per output element × n");
  }
  template <class C> static Num<C> written(C &c) {
    if (c.op.kind != OpKind::Dropout)
      return BaseCounts::written(c);
    c.note("the output, and the mask (out1): one byte per element");
    return sumBytes(c, c.op.outputs, "out");
  }
  template <class C> static Num<C> grad(C &c, unsigned) {
    return perElement(c, unaryCost(c.op.kind).grad, "FLOPs per element × n");
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    r.transcendentals = op.kind == OpKind::Rope ? ropeTranscendentals(g, op)
                                                : unaryCost(op.kind).transFwd * outNumel(g, op);
  }
};

void savedUnary(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                std::vector<SavedTensor> &out) {
  if (!need(needGrad, 0))
    return;
  switch (unaryCost(op.kind).keeps) {
  case GradReads::Input: keep(g, out, op.inputs[0], "input"); break;
  case GradReads::Output: keep(g, out, op.outputs[0], "output"); break;
  case GradReads::Nothing: break;
  }
}

void savedDropout(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                  std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.outputs[1], "dropout mask");
}

// ---------------------------------------------------------------------------------------------
// The backward ops of the elementwise family.

/// The gradient of a unary op (attrs.of): its gradient FLOPs per element × n.
struct UnaryBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    double per = unaryCost(c.op.attrs->of).grad;
    if (c.op.attrs->of == OpKind::Rope && c.op.attrs->fraction < 1) {
      c.note("the forward op's gradient FLOPs per rotated element × n × r");
      Num<C> n = c.n();
      return c.lit(per) * n * ropeShareOf(c);
    }
    c.note("the forward op's gradient FLOPs per element × n");
    return c.lit(per) * c.n();
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    // rope's backward is rope by −θ (its cos and sin again); the others per their gradient.
    r.transcendentals = op.attrs->of == OpKind::Rope
                            ? ropeTranscendentals(g, op)
                            : unaryCost(op.attrs->of).transGrad * outNumel(g, op);
  }
};
struct DivBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("-g·a/b² per element");
    return c.lit(3) * c.n();
  }
};

// Dropout's probability and the differentiated kind of a unary gradient, as --emit=ir prints
// them (explain words dropout's).
void printDropout(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {p = " << significant(op.attrs->p) << "}";
}
std::string describeDropout(const Graph &, const Op &op) {
  return "p = " + formatFormulaNumber(op.attrs->p);
}
void printUnaryBackward(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {of = " << opName(op.attrs->of) << "}";
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE(Add, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Sub, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Mul, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Div, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Neg, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Relu, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Gelu, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(GeluTanh, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Silu, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Tanh, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Sigmoid, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Exp, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE_ATTRS(Dropout, inferDropout, UnaryCounts, executedDefault, savedDropout, &printDropout, &describeDropout)
RULE(Rope, inferRope, UnaryCounts, executedDefault, savedUnary)
RULE_ATTRS(UnaryBackward, inferLikeLast, UnaryBackwardCounts, executedDefault, savesNothing, &printUnaryBackward, nullptr)
RULE(DivBackward, inferLikeLast, DivBackwardCounts, executedDefault, savesNothing)

} // namespace tally::oprules
