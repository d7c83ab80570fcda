// The per-op table: for every op kind in ir/Ops.def, how its output shapes follow from its
// inputs, what its forward pass costs (FLOPs, bytes), what each input's gradient costs, and what
// the backward keeps from the forward. docs/counting.md states the same rules as formulas; keep
// the two in step.
//
// Each count is written once. An op family's forward FLOPs, bytes read, bytes written and
// per-input gradient FLOPs are the static function templates of one `...Counts` struct, over a
// counting context (ir/Formula.h): run on doubles (`Count`) they are the table's `forward` and
// `gradFlops`, which the passes call for every op; run on terms (`Explainer`) they are its
// `explain`, the formula, substituted text and note `tally explain` prints. What explain does
// not derive (executed and matmul FLOPs, transcendentals) is each struct's `finish`.
//
// Layout: shared helpers and the Counts machinery first, then per op family its shape rule,
// its Counts and what its backward keeps (matmul, binary elementwise, unary elementwise,
// normalisation, attention, data, reductions, views, convolution, the ops autodiff adds, mixture
// of experts), then the table itself, built from ir/Ops.def so a kind without a rule does not
// compile.
// The functions assume the op was built by lowering: the right number of inputs for `forward`,
// `gradFlops` and `saved`, and outputs already created from `infer`'s results. `infer` checks
// everything itself and reports bad shapes as a ShapeError.
#include "ir/OpRules.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace tally {

namespace {

// ---------------------------------------------------------------------------------------------
// Shared helpers.

const Tensor &in(const Graph &g, const Op &op, unsigned i) { return g.tensors[op.inputs[i]]; }
const Tensor &out0(const Graph &g, const Op &op) { return g.tensors[op.outputs[0]]; }
double outNumel(const Graph &g, const Op &op) { return numel(out0(g, op).shape); }

bool need(llvm::ArrayRef<bool> needGrad, unsigned i) { return i < needGrad.size() && needGrad[i]; }
bool anyNeed(llvm::ArrayRef<bool> needGrad) {
  return std::any_of(needGrad.begin(), needGrad.end(), [](bool b) { return b; });
}

bool fail(ShapeError &err, ShapeErrorKind kind, std::string message) {
  err.kind = kind;
  err.message = std::move(message);
  return false;
}

bool expectInputs(const Op &op, size_t lo, size_t hi, ShapeError &err) {
  size_t n = op.inputs.size();
  if (n >= lo && n <= hi)
    return true;
  std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
  return fail(err, ShapeErrorKind::Invalid,
              opName(op.kind).str() + " expects " + want + " inputs, got " + std::to_string(n));
}

/// Float results are stored at the plan's activation dtype; integer-only arithmetic keeps its type.
Dtype resultDtype(const Graph &g, Dtype operand) {
  return isFloat(operand) ? g.activationDtype : operand;
}

/// Keeps `t` (an input or output of the op) unless it is already kept by this op (x * x).
void keep(const Graph &g, std::vector<SavedTensor> &out, TensorId t, const char *what) {
  for (const SavedTensor &s : out)
    if (s.tensor == t)
      return;
  out.push_back({t, what, g.bytes(t)});
}

/// Rows of a tensor reduced along its last dimension (normalisations, softmax over the vocab).
double rowsOf(const Shape &s) {
  return s.empty() || s.back().size == 0 ? 0 : numel(s) / static_cast<double>(s.back().size);
}

double executedDefault(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad) {
  double f = 0;
  for (unsigned i = 0; i < op.inputs.size(); ++i)
    if (need(needGrad, i))
      f += ruleFor(op.kind).gradFlops(g, op, i);
  return f;
}

void savesNothing(const Graph &, const Op &, llvm::ArrayRef<bool>, std::vector<SavedTensor> &) {}

using InferFn = bool (*)(const Graph &, const Op &, llvm::SmallVectorImpl<TensorType> &,
                         ShapeError &);

/// Runs an op's shape rule, then rejects any result whose element count overflows int64, so no
/// pass downstream ever sees an overflowed shape.
template <InferFn F>
bool inferChecked(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  outs.clear();
  err = ShapeError();
  for (TensorId t : op.inputs)
    if (t >= g.tensors.size())
      return fail(err, ShapeErrorKind::Invalid, opName(op.kind).str() + " reads an unknown tensor");
  if (!F(g, op, outs, err))
    return false;
  for (const TensorType &t : outs)
    if (!checkedNumel(t.shape))
      return fail(err, ShapeErrorKind::Overflow,
                  "the result of " + opName(op.kind).str() + ", " + Graph::formatSizes(t.shape) +
                      ", has more elements than fit in a 64-bit integer");
  return true;
}

// ---------------------------------------------------------------------------------------------
// Counts. Each op family's counting rules are one struct of static function templates over a
// counting context C (ir/Formula.h): flops(c), read(c), written(c) and grad(c, i), each setting
// the note `tally explain` prints, and finish(g, op, cost) for what explain does not derive
// (executed and matmul FLOPs, transcendental evaluations). forwardOf, gradOf and explainOf turn
// one family into the table's forward, gradFlops and explain entries. A note that is more than
// a literal is built under `if constexpr (C::kExplains)`, so the passes build no strings.

/// bytes(<prefix>0) + bytes(<prefix>1) + ...: each tensor of `ts` moved once; 0 for none.
template <class C> Num<C> sumBytes(C &c, llvm::ArrayRef<TensorId> ts, const char *prefix) {
  if (ts.empty())
    return c.lit(0);
  Num<C> t = c.bytesOf(ts[0], prefix, 0);
  for (unsigned i = 1; i < ts.size(); ++i)
    t = t + c.bytesOf(ts[i], prefix, i);
  return t;
}

/// What most kernels move (every input read once, every output written once) and no gradient.
struct BaseCounts {
  template <class C> static Num<C> read(C &c) {
    if (c.op.inputs.empty()) {
      c.note("no inputs");
      return c.lit(0);
    }
    c.note(c.op.attrs->hasScalar ? "the constant operand costs nothing" : "each input read once");
    return sumBytes(c, c.op.inputs, "in");
  }
  template <class C> static Num<C> written(C &c) {
    c.note("each output written once");
    return sumBytes(c, c.op.outputs, "out");
  }
  template <class C> static Num<C> grad(C &c, unsigned) { return c.lit(0); }
  static void finish(const Graph &, const Op &, ForwardCost &) {}
};

template <class K> ForwardCost forwardOf(const Graph &g, const Op &op) {
  Count c(g, op);
  ForwardCost r;
  r.flops = r.executedFlops = K::flops(c);
  r.bytesRead = K::read(c);
  r.bytesWritten = K::written(c);
  K::finish(g, op, r);
  return r;
}

template <class K> double gradOf(const Graph &g, const Op &op, unsigned i) {
  Count c(g, op);
  return K::grad(c, i);
}

template <class K> Formula explainOf(const Graph &g, const Op &op, Counted what, unsigned i) {
  Explainer e(g, op);
  switch (what) {
  case Counted::ForwardFlops: return e.done(K::flops(e));
  case Counted::BytesRead: return e.done(K::read(e));
  case Counted::BytesWritten: return e.done(K::written(e));
  case Counted::GradFlops: return e.done(K::grad(e, i));
  }
  return e.done(Explainer::lit(0));
}

// ---------------------------------------------------------------------------------------------
// Matmul: A [..., M, K] @ B [..., K, N] (batch dims broadcast); a 1-D A is [K] (no M), a 1-D B
// is [K] (no N), as in numpy.

bool inferMatmul(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Shape &a = in(g, op, 0).shape, &b = in(g, op, 1).shape;
  auto both = [&] { return g.formatShape(a) + " @ " + g.formatShape(b); }; // failures only
  if (a.empty() || b.empty())
    return fail(err, ShapeErrorKind::Matmul, "matmul needs operands of rank 1 or more: " + both());
  const Dim &ka = a.back();
  const Dim &kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka.size != kb.size)
    return fail(err, ShapeErrorKind::Matmul, "matmul inner dimensions differ: " + both());
  Shape batchA(a.begin(), a.end() - std::min<size_t>(a.size(), 2));
  Shape batchB(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  Shape shape;
  if (!broadcastShapes(batchA, batchB, shape))
    return fail(err, ShapeErrorKind::Matmul,
                "matmul batch dimensions cannot be broadcast: " + both());
  if (a.size() >= 2)
    shape.push_back(a[a.size() - 2]);
  if (b.size() >= 2)
    shape.push_back(b.back());
  outs.push_back({shape, g.activationDtype});
  return true;
}

struct MatmulCounts : BaseCounts {
  /// 2·M·N·K·batch (no M for a 1-D A, no N for a 1-D B).
  template <class C> static Num<C> product(C &c) {
    const Shape &a = in(c.g, c.op, 0).shape, &w = in(c.g, c.op, 1).shape;
    const Shape &out = out0(c.g, c.op).shape;
    bool hasM = a.size() >= 2, hasN = w.size() >= 2;
    size_t batchDims = out.size() - (hasM ? 1 : 0) - (hasN ? 1 : 0);
    Num<C> t = c.lit(2);
    if (hasM)
      t = t * c.dim("M", out[batchDims]);
    if (hasN)
      t = t * c.dim("N", out.back());
    t = t * c.dim("K", a.back());
    if (batchDims > 0)
      t = t * c.quantity("batch", c.product(out, 0, batchDims));
    return t;
  }
  template <class C> static Num<C> flops(C &c) {
    c.note("a multiply-add counts 2 FLOPs");
    return product(c);
  }
  /// dA = dC·Bᵀ and dB = Aᵀ·dC are each a matmul of the same size as the forward.
  template <class C> static Num<C> grad(C &c, unsigned i) {
    c.note(i == 0 ? "dA = dC·Bᵀ: a matmul of the forward's size"
                  : "dB = Aᵀ·dC: a matmul of the forward's size");
    return product(c);
  }
  static void finish(const Graph &, const Op &, ForwardCost &r) { r.matmulFlops = r.flops; }
};

void savedMatmul(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                 std::vector<SavedTensor> &out) {
  if (need(needGrad, 1))
    keep(g, out, op.inputs[0], "input");
  if (need(needGrad, 0))
    keep(g, out, op.inputs[1], "input");
}

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

enum class Keeps { Nothing, Input, Output };
struct UnaryCost {
  double fwd, grad; ///< FLOPs per element
  Keeps keeps;
  /// Transcendental evaluations per element of the runtime's forward and gradient
  /// (codegen/runtime/common/tally_math.h): gelu is erf (both forms: the tanh form's tanh is
  /// one expf), its gradient erf + exp; silu and sigmoid one exp; tanh one tanhf; the
  /// gradients of tanh, sigmoid and exp read the output and evaluate none.
  double transFwd = 0, transGrad = 0;
};

UnaryCost unaryCost(OpKind k) {
  switch (k) {
  case OpKind::Neg: return {1, 1, Keeps::Nothing};
  case OpKind::Relu: return {1, 1, Keeps::Output};
  case OpKind::Gelu: return {8, 12, Keeps::Input, 1, 2};
  case OpKind::Silu: return {4, 6, Keeps::Input, 1, 1};
  case OpKind::Tanh: return {4, 3, Keeps::Output, 1, 0};
  case OpKind::Sigmoid: return {4, 3, Keeps::Output, 1, 0};
  case OpKind::Exp: return {1, 1, Keeps::Output, 1, 0};
  case OpKind::Dropout: return {1, 1, Keeps::Nothing}; // keeps its mask: see savedDropout
  case OpKind::Rope: return {3, 3, Keeps::Nothing};
  default: return {0, 0, Keeps::Nothing};
  }
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
  case Keeps::Input: keep(g, out, op.inputs[0], "input"); break;
  case Keeps::Output: keep(g, out, op.outputs[0], "output"); break;
  case Keeps::Nothing: break;
  }
}

void savedDropout(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                  std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.outputs[1], "dropout mask");
}

// ---------------------------------------------------------------------------------------------
// Softmax over one axis; layer norm and RMS norm over the last axis.

bool inferSoftmax(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "softmax dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  outs.push_back({x.shape, g.activationDtype});
  return true;
}

struct SoftmaxCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("max, subtract, exp, sum, divide per element");
    return c.lit(5) * c.n();
  }
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note("y·(g - Σ g·y) per element");
    return c.lit(4) * c.n();
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    r.transcendentals = 2 * outNumel(g, op); // the runtime evaluates exp for the sum, then again
  }
};

void savedSoftmax(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                  std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.outputs[0], "output");
}

bool isLayerNorm(const Op &op) { return op.kind == OpKind::LayerNorm; }

bool inferNorm(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
               ShapeError &err) {
  if (!expectInputs(op, 2, isLayerNorm(op) ? 3 : 2, err))
    return false;
  const Shape &x = in(g, op, 0).shape;
  if (x.empty())
    return fail(err, ShapeErrorKind::Invalid, opName(op.kind).str() + " needs a tensor of rank 1 or more, got []");
  for (unsigned i = 1; i < op.inputs.size(); ++i) {
    const Shape &w = in(g, op, i).shape;
    if (w.size() != 1 || w[0].size != x.back().size)
      return fail(err, ShapeErrorKind::Mismatch,
                  opName(op.kind).str() + (i == 1 ? " weight " : " bias ") + g.formatShape(w) +
                      " does not match the last dimension of " + g.formatShape(x));
  }
  // The row statistics the backward reads, fp32 per row: (y, mean, rstd) for layer norm,
  // (y, rstd) for RMS norm.
  Shape rows(x.begin(), x.end() - 1);
  outs.push_back({x, g.activationDtype});
  if (isLayerNorm(op))
    outs.push_back({rows, Dtype::F32});
  outs.push_back({rows, Dtype::F32});
  return true;
}

struct NormCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    if (isLayerNorm(c.op)) {
      c.note("mean, variance, normalise, scale and shift per element");
      return c.lit(8) * c.n();
    }
    c.note("square, mean, rsqrt-scale and weight per element");
    return c.lit(5) * c.n();
  }
  template <class C> static Num<C> written(C &c) {
    c.note(isLayerNorm(c.op)
               ? "the output, and the row statistics: mean and rstd in fp32 (out1, out2)"
               : "the output, and the row statistics: rstd in fp32 (out1)");
    return sumBytes(c, c.op.outputs, "out");
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i == 0) {
      c.note("the input gradient");
      return c.lit(isLayerNorm(c.op) ? 12 : 8) * c.n();
    }
    c.note(i == 1 ? "the weight: Σ over rows of g·x̂" : "the bias: Σ over rows of g");
    return c.n();
  }
};

void savedNorm(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
               std::vector<SavedTensor> &out) {
  if (!anyNeed(needGrad))
    return;
  keep(g, out, op.inputs[0], "input");
  for (size_t i = 1; i < op.outputs.size(); ++i)
    keep(g, out, op.outputs[i], "row statistics");
  if (need(needGrad, 0))
    keep(g, out, op.inputs[1], "weight"); // dx scales by the weight (a parameter, already resident)
}

// ---------------------------------------------------------------------------------------------
// Attention: q [b, s, d], k and v [b, s_kv, d_kv], h query heads of size dh = d/h, kvHeads
// key/value heads (d_kv = kvHeads·dh). S = b·h·s·s_kv is the number of attention scores.

/// The attention sizes: b, s, s_kv, h, dh = d / h, and S = b·h·s·s_kv scores.
template <class C> struct AttnTerms {
  Num<C> b, s, skv, h, dh, S;
};

template <class C> AttnTerms<C> attentionTerms(C &c) {
  const Shape &q = in(c.g, c.op, 0).shape, &k = in(c.g, c.op, 1).shape;
  AttnTerms<C> t;
  t.b = c.dim("b", q[0]);
  t.s = c.dim("s", q[1]);
  t.skv = c.dim("s_kv", k[1]);
  t.h = c.quantity("h", c.lit(static_cast<double>(c.op.attrs->heads)));
  t.dh = c.quantity("dh", c.named("d", c.lit(static_cast<double>(q[2].size))) / t.h);
  t.S = c.quantity("S", t.b * t.h * t.s * t.skv);
  return t;
}

using AttnDims = AttnTerms<Count>;
AttnDims attnDims(const Graph &g, const Op &op) {
  Count c(g, op);
  return attentionTerms(c);
}

/// The share of the score matrix a causal flash kernel computes: the lower triangle with its
/// diagonal, (s+1)/(2s). Unfused attention computes the dense matrix and then masks it.
double causalFraction(const Graph &g, const Op &op) {
  AttnDims d = attnDims(g, op);
  if (!op.attrs->causal || !op.attrs->fused || d.s != d.skv || d.s == 0)
    return 1;
  return (d.s + 1) / (2 * d.s);
}

bool inferAttention(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, op.attrs->hasMask ? 4 : 3, op.attrs->hasMask ? 4 : 3, err))
    return false;
  const Shape &q = in(g, op, 0).shape, &k = in(g, op, 1).shape, &v = in(g, op, 2).shape;
  auto all = [&] { // failures only
    return g.formatShape(q) + ", " + g.formatShape(k) + ", " + g.formatShape(v);
  };
  if (q.size() != 3 || k.size() != 3 || v.size() != 3)
    return fail(err, ShapeErrorKind::Invalid,
                "attention expects q [batch, seq, d] and k, v [batch, seq_kv, d_kv], got " + all());
  if (k[0].size != q[0].size || v[0].size != q[0].size || k[1].size != v[1].size ||
      k[2].size != v[2].size)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention q, k and v disagree: " + all() +
                    " (batch must match, and k and v must have the same shape)");
  int64_t h = op.attrs->heads, kvh = op.attrs->kvHeads ? op.attrs->kvHeads : op.attrs->heads;
  if (h <= 0 || kvh <= 0)
    return fail(err, ShapeErrorKind::Invalid,
                "attention needs heads > 0 and kv_heads > 0, got heads = " + std::to_string(h) +
                    ", kv_heads = " + std::to_string(kvh));
  if (q[2].size % h != 0)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention width " + std::to_string(q[2].size) + " of " + g.formatShape(q) +
                    " is not divisible by heads = " + std::to_string(h));
  if (h % kvh != 0)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention heads = " + std::to_string(h) + " is not a multiple of kv_heads = " +
                    std::to_string(kvh));
  int64_t dh = q[2].size / h;
  if (k[2].size != kvh * dh)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention key/value width " + std::to_string(k[2].size) + " of " +
                    g.formatShape(k) + " should be kv_heads × head size = " + std::to_string(kvh) +
                    " × " + std::to_string(dh) + " = " + std::to_string(kvh * dh));
  if (!(op.attrs->p >= 0 && op.attrs->p < 1))
    return fail(err, ShapeErrorKind::Invalid,
                "attention dropout must be in [0, 1), got " + std::to_string(op.attrs->p));
  if (op.attrs->hasMask) { // a padding mask: which keys each sequence of the batch has
    const Tensor &m = in(g, op, 3);
    if (isFloat(m.dtype) || m.shape.size() != 2 || m.shape[0].size != q[0].size ||
        m.shape[1].size != k[1].size)
      return fail(err, ShapeErrorKind::Mismatch,
                  "attention mask must be integers or booleans of shape [batch, seq_kv] = " +
                      g.formatShape(Shape{q[0], k[1]}) + ", got " + nameOf(m.dtype).str() +
                      g.formatShape(m.shape));
  }
  // What the backward reads besides q, k, v and o: the logsumexp of each query row (fp32
  // [b, h, s]) when fused; the probabilities [b, h, s, s_kv] when materialised, with the
  // dropout mask and the dropped probabilities when p > 0.
  outs.push_back({q, g.activationDtype});
  if (op.attrs->fused) {
    outs.push_back({Shape{q[0], Dim{h, 0}, q[1]}, Dtype::F32});
  } else {
    Shape scores{q[0], Dim{h, 0}, q[1], k[1]};
    if (!checkedNumel(scores))
      return fail(err, ShapeErrorKind::Overflow, "the attention score matrix " +
                                                     Graph::formatSizes(scores) +
                                                     " has more elements than fit in a 64-bit integer");
    outs.push_back({scores, g.activationDtype});
    if (op.attrs->p > 0) {
      outs.push_back({scores, Dtype::U8});
      outs.push_back({scores, g.activationDtype});
    }
  }
  return true;
}

/// Per-score FLOPs outside the matmuls: scale and softmax (5), and dropout (1) when p > 0.
double attnPerScore(const Op &op) { return 5 + (op.attrs->p > 0 ? 1 : 0); }
/// ALiBi adds slope_h·(j − i) to each score in the kernel: a multiply and an add per score
/// (the distance is index arithmetic, like the causal mask, and costs no FLOPs). The bias
/// has no parameters and no gradient; flash attention recomputes it in the backward.
double alibiPerScore(const Op &op) { return op.attrs->alibi ? 2 : 0; }

/// explain's remark on a causal op: model FLOPs count the dense score matrix.
std::string causalNote(const Graph &g, const Op &op) {
  const Shape &q = in(g, op, 0).shape, &k = in(g, op, 1).shape;
  if (!op.attrs->causal)
    return "";
  if (!op.attrs->fused)
    return "causal, unfused: the dense score matrix is computed, then masked; model FLOPs "
           "count all s·s_kv scores";
  if (q[1].size != k[1].size)
    return "causal with s != s_kv: executed FLOPs are the dense count";
  std::string s = formatFormulaNumber(static_cast<double>(q[1].size));
  return "model FLOPs count all s·s_kv scores (Narayanan et al.); the causal flash kernel "
         "executes the lower triangle, (s + 1)/(2s) = (" + s + " + 1)/(2 · " + s + ") of them";
}

struct AttentionCounts : BaseCounts {
  /// QKᵀ and P·V, 2·S·dh each: the part done as matrix products.
  template <class C> static Num<C> products(C &c, const AttnTerms<C> &t) {
    return c.lit(4) * t.S * t.dh;
  }
  /// The products, then per score: scale and softmax (5), dropout (1) when p > 0, the ALiBi
  /// bias (2) when asked.
  template <class C> static Num<C> flops(C &c) {
    AttnTerms<C> t = attentionTerms(c);
    const Op &op = c.op;
    if constexpr (C::kExplains) {
      std::string note = "Q·Kᵀ and P·V are 2·S·dh each; scale and softmax 5 per score" +
                         std::string(op.attrs->p > 0 ? ", dropout 1" : "") +
                         std::string(op.attrs->alibi ? ", the ALiBi bias 2" : "");
      std::string causal = causalNote(c.g, op);
      c.note(causal.empty() ? note : note + "; " + causal);
    }
    return products(c, t) + c.lit(attnPerScore(op) + alibiPerScore(op)) * t.S;
  }
  /// Unfused, the score matrices (scores, probabilities, and the dropped probabilities with
  /// dropout) are each written by one kernel and read by the next.
  template <class C> static Num<C> matrices(C &c, const AttnTerms<C> &t) {
    return c.lit(c.op.attrs->p > 0 ? 3 : 2) * t.S *
           c.lit(static_cast<double>(bytesOf(c.g.activationDtype)));
  }
  template <class C> static Num<C> read(C &c) {
    Num<C> qkv = sumBytes(c, c.op.inputs, "in");
    if (c.op.attrs->fused) {
      c.note("q, k and v once each; the scores stay on chip (flash)");
      return qkv;
    }
    c.note(c.op.attrs->p > 0 ? "unfused: the score matrix, the probabilities and the dropped "
                              "probabilities are each read once by the next kernel"
                            : "unfused: the score matrix, the probabilities are each read once "
                              "by the next kernel");
    AttnTerms<C> t = attentionTerms(c);
    return qkv + matrices(c, t);
  }
  template <class C> static Num<C> written(C &c) {
    if (c.op.attrs->fused) {
      c.note("the output, and the logsumexp per query row in fp32 (out1)");
      return sumBytes(c, c.op.outputs, "out");
    }
    AttnTerms<C> t = attentionTerms(c);
    Num<C> w = c.bytesOf(c.op.outputs[0], "out", 0) + matrices(c, t);
    if (c.op.attrs->p <= 0) {
      c.note("unfused: the output, the scores, the probabilities");
      return w;
    }
    c.note("unfused: the output, the scores, the probabilities, the dropped probabilities and "
           "the 1-byte dropout mask");
    return w + t.S;
  }
  /// dQ: dP = dO·Vᵀ (2·S·dh), dropout backward (S when p > 0), softmax backward (4·S), dS·K
  /// (2·S·dh). dK = dSᵀ·Q and dV = Pᵀ·dO (2·S·dh each) reuse dS from dQ's count.
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i >= 3) {
      c.note("the padding mask is data: no gradient");
      return c.lit(0);
    }
    AttnTerms<C> t = attentionTerms(c);
    if (i == 0) {
      c.note(c.op.attrs->p > 0 ? "dP = dO·Vᵀ and dQ = dS·K (2·S·dh each), the softmax backward "
                                "(4 per score), dropout (1 per score); dK and dV reuse dS"
                              : "dP = dO·Vᵀ and dQ = dS·K (2·S·dh each), the softmax backward "
                                "(4 per score); dK and dV reuse dS");
      return c.lit(4) * t.S * t.dh + c.lit(attnPerScore(c.op) - 1) * t.S;
    }
    c.note(i == 1 ? "dK = dSᵀ·Q" : "dV = Pᵀ·dO");
    return c.lit(2) * t.S * t.dh;
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    AttnDims d = attentionTerms(c);
    r.matmulFlops = products(c, d);
    r.executedFlops = r.flops * causalFraction(g, op);
    r.transcendentals = d.S * causalFraction(g, op); // one exp per computed score
  }
};

double gradAttention(const Graph &g, const Op &op, unsigned i) {
  return gradOf<AttentionCounts>(g, op, i);
}

double executedBackwardAttention(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad) {
  if (!anyNeed(needGrad))
    return 0;
  AttnDims d = attnDims(g, op);
  double S = d.S;
  double f = 0;
  for (unsigned i = 0; i < 3; ++i)
    if (need(needGrad, i))
      f += gradAttention(g, op, i);
  // dK needs dS even when q needs no gradient: count dP and the softmax backward once there.
  if (!need(needGrad, 0) && need(needGrad, 1))
    f += 2 * S * d.dh + (attnPerScore(op) - 1) * S;
  // Flash attention recomputes the scores, the softmax and the dropout mask from q, k and the
  // saved logsumexp.
  if (op.attrs->fused)
    f += 2 * S * d.dh + (attnPerScore(op) + alibiPerScore(op)) * S;
  return f * causalFraction(g, op);
}

void savedAttention(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                    std::vector<SavedTensor> &out) {
  if (!anyNeed(needGrad))
    return;
  keep(g, out, op.inputs[0], "query");
  keep(g, out, op.inputs[1], "key");
  keep(g, out, op.inputs[2], "value");
  if (op.attrs->hasMask)
    keep(g, out, op.inputs[3], "padding mask");
  if (op.attrs->fused) {
    keep(g, out, op.outputs[0], "output");
    keep(g, out, op.outputs[1], "logsumexp");
    return;
  }
  keep(g, out, op.outputs[1], "attention probabilities");
  if (op.attrs->p > 0) {
    keep(g, out, op.outputs[2], "attention dropout mask");
    keep(g, out, op.outputs[3], "dropped probabilities");
  }
}

// ---------------------------------------------------------------------------------------------
// Embedding: ids [...] (integers) gather rows of weight [V, d].

bool inferEmbedding(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Tensor &ids = in(g, op, 0), &w = in(g, op, 1);
  if (!isInteger(ids.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "embedding ids must be integers, got " + nameOf(ids.dtype).str() +
                    g.formatShape(ids.shape));
  if (w.shape.size() != 2)
    return fail(err, ShapeErrorKind::Invalid,
                "embedding weight must be [vocab, d], got " + g.formatShape(w.shape));
  Shape shape = ids.shape;
  shape.push_back(w.shape[1]);
  outs.push_back({shape, g.activationDtype});
  return true;
}

/// A gather (embedding, gather): n elements of the table input read at the integer indices
/// of the index input. No arithmetic; reads the indices and only the gathered elements; the
/// table's gradient is a scatter-add of the output gradient, the indices have none. `Words`
/// says which input is which and what explain notes.
template <class Words> struct GatherLikeCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("a gather: no arithmetic");
    return c.lit(0);
  }
  template <class C> static Num<C> read(C &c) {
    c.note(Words::read);
    return c.bytesOf(c.op.inputs[Words::index], "in", Words::index) +
           c.n() * c.lit(static_cast<double>(bytesOf(in(c.g, c.op, Words::table).dtype)));
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i != Words::table) {
      c.note(Words::noGrad);
      return c.lit(0);
    }
    c.note(Words::grad);
    return c.n();
  }
};

/// Embedding: the ids (input 0) pick rows of the table (input 1).
struct EmbeddingWords {
  static constexpr unsigned index = 0, table = 1;
  static constexpr const char *read = "the ids, and only the gathered rows of the table: n elements";
  static constexpr const char *noGrad = "integer ids have no gradient";
  static constexpr const char *grad = "a scatter-add of the output gradient into the gathered rows";
};
using EmbeddingCounts = GatherLikeCounts<EmbeddingWords>;

void savedEmbedding(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                    std::vector<SavedTensor> &out) {
  if (need(needGrad, 1))
    keep(g, out, op.inputs[0], "ids");
}

// ---------------------------------------------------------------------------------------------
// Reductions: sum and mean, over everything or one axis.

bool inferReduce(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  Dtype dt = op.kind == OpKind::Mean ? g.activationDtype : resultDtype(g, x.dtype);
  if (op.attrs->reduceAll) {
    outs.push_back({Shape(), dt});
    return true;
  }
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                opName(op.kind).str() + " dim " + std::to_string(op.attrs->dim) +
                    " is out of range for " + g.formatShape(x.shape));
  Shape shape = x.shape;
  if (op.attrs->keepDim)
    shape[axis] = Dim{1, 0};
  else
    shape.erase(shape.begin() + axis);
  outs.push_back({shape, dt});
  return true;
}

struct ReduceCounts : BaseCounts {
  /// One add per input element; mean also divides each output by the count.
  template <class C> static Num<C> flops(C &c) {
    if (c.op.kind == OpKind::Mean) {
      c.note("one add per input element, one divide per output");
      return c.numelIn(0) + c.n();
    }
    c.note("one add per input element");
    return c.numelIn(0);
  }
  /// sum: the gradient is broadcast, no arithmetic; mean: broadcast and divide by the count.
  template <class C> static Num<C> grad(C &c, unsigned) {
    if (c.op.kind == OpKind::Mean) {
      c.note("broadcast and divide by the count");
      return c.numelIn(0);
    }
    c.note("the gradient is broadcast: no arithmetic");
    return c.lit(0);
  }
};

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

// ---------------------------------------------------------------------------------------------
// Index generation and concatenation: no arithmetic, only data movement.

bool inferPositions(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, 0, 0, err))
    return false;
  const Shape &s = op.attrs->newShape;
  if (s.size() != 1 || s[0].size < 0)
    return fail(err, ShapeErrorKind::Invalid,
                "positions needs a length, got shape " + g.formatShape(s));
  outs.push_back({s, Dtype::I32});
  return true;
}

bool inferNextTokens(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &t = in(g, op, 0);
  if (!isInteger(t.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "next_tokens needs integer tokens, got " + nameOf(t.dtype).str() +
                    g.formatShape(t.shape));
  outs.push_back({t.shape, Dtype::I32});
  return true;
}

bool inferConcat(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 1, SIZE_MAX, err))
    return false;
  const Tensor &first = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, first.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "concat dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(first.shape));
  Shape shape = first.shape;
  bool floating = false;
  for (unsigned i = 0; i < op.inputs.size(); ++i) {
    const Tensor &t = in(g, op, i);
    floating |= isFloat(t.dtype);
    bool same = t.shape.size() == shape.size();
    for (size_t j = 0; same && j < shape.size(); ++j)
      same = j == axis || t.shape[j].size == shape[j].size;
    if (!same)
      return fail(err, ShapeErrorKind::Mismatch,
                  "concat along dim " + std::to_string(op.attrs->dim) + " needs equal other dimensions: " +
                      g.formatShape(first.shape) + " and " + g.formatShape(t.shape));
    if (i > 0) {
      if (__builtin_add_overflow(shape[axis].size, t.shape[axis].size, &shape[axis].size))
        return fail(err, ShapeErrorKind::Overflow, "concat result is too large along dim " +
                                                       std::to_string(op.attrs->dim));
      shape[axis].sym = 0;
    }
  }
  outs.push_back({shape, floating ? g.activationDtype : first.dtype});
  return true;
}

/// positions, next_tokens, concat: data movement, no arithmetic; integers or a view of the
/// output gradient as gradient.
struct DataCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("data movement: no arithmetic");
    return c.lit(0);
  }
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note(c.op.kind == OpKind::Concat ? "the gradient is a view of the output gradient"
                                       : "integer outputs have no gradient");
    return c.lit(0);
  }
};


/// broadcast_to(x, shape): numpy's rule, x's dims aligned from the right, each equal to the
/// target's or 1; a copy (a class token [1, 1, d] brought to [batch, 1, d] for concat).
bool inferBroadcastTo(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                      ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  Shape shape = op.attrs->newShape;
  bool ok = shape.size() >= x.shape.size();
  size_t lead = ok ? shape.size() - x.shape.size() : 0;
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    ok = shape[i].size >= 1;
    if (ok && i >= lead) {
      const Dim &d = x.shape[i - lead];
      ok = d.size == shape[i].size || d.size == 1;
      if (d.size == shape[i].size)
        shape[i] = d; // keeps its name
    }
  }
  if (!ok)
    return fail(err, ShapeErrorKind::Broadcast,
                "cannot broadcast " + g.formatShape(x.shape) + " to " + g.formatShape(op.attrs->newShape));
  outs.push_back({shape, resultDtype(g, x.dtype)});
  return true;
}

/// A copy; the gradient sums the output gradient over the broadcast dims, one add per output
/// element.
struct BroadcastToCounts : DataCounts {
  template <class C> static Num<C> grad(C &c, unsigned) {
    Num<C> n = c.n();
    if (C::value(n) == numel(in(c.g, c.op, 0).shape)) {
      c.note("nothing was broadcast: the output gradient itself");
      return c.lit(0);
    }
    c.note("the output gradient summed over the broadcast dimensions: one add per element");
    return n;
  }
};

// ---------------------------------------------------------------------------------------------
// Views: split, reshape, transpose share their input's storage. They keep its dtype.

bool inferSplit(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "split dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  int64_t parts = op.attrs->parts;
  if (parts <= 0 || x.shape[axis].size % parts != 0)
    return fail(err, ShapeErrorKind::Mismatch,
                "cannot split dimension " + std::to_string(x.shape[axis].size) + " of " +
                    g.formatShape(x.shape) + " into " + std::to_string(parts) + " equal parts");
  Shape shape = x.shape;
  if (parts != 1)
    shape[axis] = Dim{x.shape[axis].size / parts, 0};
  for (int64_t i = 0; i < parts; ++i)
    outs.push_back({shape, x.dtype});
  return true;
}

bool inferReshape(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  Shape shape = op.attrs->newShape;
  // Failures only: formatting both shapes for every reshape was most of its cost.
  auto both = [&] { return g.formatShape(x.shape) + " to " + g.formatShape(shape); };
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i].size == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
      continue;
    }
    if (shape[i].size < 0)
      return fail(err, ShapeErrorKind::Invalid,
                  "cannot reshape " + both() + ": only one dimension may be -1, and none negative");
    if (__builtin_mul_overflow(known, shape[i].size, &known))
      return fail(err, ShapeErrorKind::Overflow,
                  "cannot reshape " + both() + ": too many elements");
  }
  std::optional<int64_t> total = checkedNumel(x.shape);
  if (!total)
    return fail(err, ShapeErrorKind::Overflow, "cannot reshape " + both() + ": too many elements");
  if (inferred >= 0) {
    if (known == 0 || *total % known != 0)
      return fail(err, ShapeErrorKind::Mismatch,
                  "cannot reshape " + both() + ": " + std::to_string(*total) +
                      " elements do not divide into the other dimensions");
    shape[inferred] = Dim{*total / known, 0};
  } else if (known != *total) {
    return fail(err, ShapeErrorKind::Mismatch,
                "cannot reshape " + both() + ": " + std::to_string(*total) + " elements, not " +
                    std::to_string(known));
  }
  outs.push_back({shape, x.dtype});
  return true;
}

bool inferTranspose(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t a, b;
  if (!normalizeAxis(op.attrs->transposeA, x.shape.size(), a) ||
      !normalizeAxis(op.attrs->transposeB, x.shape.size(), b))
    return fail(err, ShapeErrorKind::Invalid,
                "transpose axes " + std::to_string(op.attrs->transposeA) + " and " +
                    std::to_string(op.attrs->transposeB) + " are out of range for " +
                    g.formatShape(x.shape));
  Shape shape = x.shape;
  std::swap(shape[a], shape[b]);
  outs.push_back({shape, x.dtype});
  return true;
}

/// slice: `x[:, 0]`, `x[:, 1:]`, `x[::2]`. attrs.slices covers the leading axes; each keeps
/// `count` indices from `start` every `step`, and an integer subscript (drop) removes its axis.
bool inferSlice(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  const auto &sl = op.attrs->slices;
  if (sl.size() > x.shape.size())
    return fail(err, ShapeErrorKind::Invalid,
                std::to_string(sl.size()) + " subscripts for " + g.formatShape(x.shape) +
                    ", a tensor of rank " + std::to_string(x.shape.size()));
  Shape shape;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (i >= sl.size()) {
      shape.push_back(x.shape[i]);
      continue;
    }
    const SliceDim &d = sl[i];
    int64_t n = x.shape[i].size, span = 0, last = 0;
    bool bad = d.step <= 0 || d.start < 0 || d.count <= 0 || (d.drop && d.count != 1) ||
               __builtin_mul_overflow(d.count - 1, d.step, &span) ||
               __builtin_add_overflow(d.start, span, &last) || last >= n;
    if (bad)
      return fail(err, ShapeErrorKind::Invalid,
                  "subscript " + std::to_string(i) + " selects outside dimension " +
                      std::to_string(n) + " of " + g.formatShape(x.shape));
    if (!d.drop)
      shape.push_back(Dim{d.count, d.count == n ? x.shape[i].sym : 0});
  }
  outs.push_back({shape, x.dtype});
  return true;
}

struct ViewCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("a view: no arithmetic, no data moves");
    return c.lit(0);
  }
  template <class C> static Num<C> read(C &c) {
    c.note("a view shares its input's storage");
    return c.lit(0);
  }
  template <class C> static Num<C> written(C &c) { return read(c); }
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note("the gradient is a view of the output gradient");
    return c.lit(0);
  }
};

// ---------------------------------------------------------------------------------------------
// Convolution and pooling, NCHW: x [N, C, H, W]; conv2d's weight is [Cout, Cin, kh, kw] and
// its optional bias [Cout] (PyTorch's layout). Each spatial output size is
// floor((H + 2·pad − k) / stride) + 1.

/// The output extent of a window sliding over `n` with `k`, `stride`, `pad`; 0 when none fits.
int64_t windowOut(int64_t n, int64_t k, int64_t stride, int64_t pad) {
  int64_t padded = 0;
  if (stride <= 0 || k <= 0 || pad < 0 || __builtin_mul_overflow(pad, 2, &padded) ||
      __builtin_add_overflow(n, padded, &padded) || padded < k)
    return 0;
  return (padded - k) / stride + 1;
}

bool inferConv2d(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 2, 3, err))
    return false;
  const Shape &x = in(g, op, 0).shape, &w = in(g, op, 1).shape;
  auto both = [&] { return g.formatShape(x) + " and weight " + g.formatShape(w); }; // failures only
  if (x.size() != 4 || w.size() != 4)
    return fail(err, ShapeErrorKind::Invalid,
                "conv2d expects x [batch, channels, height, width] and weight [out, in, kh, kw], got " +
                    both());
  if (w[1].size != x[1].size)
    return fail(err, ShapeErrorKind::Mismatch,
                "conv2d weight has " + std::to_string(w[1].size) + " input channels, x has " +
                    std::to_string(x[1].size) + ": " + both());
  if (op.inputs.size() == 3) {
    const Shape &b = in(g, op, 2).shape;
    if (b.size() != 1 || b[0].size != w[0].size)
      return fail(err, ShapeErrorKind::Mismatch,
                  "conv2d bias " + g.formatShape(b) + " should be [" + std::to_string(w[0].size) +
                      "], one per output channel");
  }
  int64_t ho = windowOut(x[2].size, w[2].size, op.attrs->strides[0], op.attrs->pads[0]);
  int64_t wo = windowOut(x[3].size, w[3].size, op.attrs->strides[1], op.attrs->pads[1]);
  if (ho <= 0 || wo <= 0)
    return fail(err, ShapeErrorKind::Invalid,
                "conv2d kernel " + std::to_string(w[2].size) + "x" + std::to_string(w[3].size) +
                    " does not fit in " + g.formatShape(x) + " with padding " +
                    std::to_string(op.attrs->pads[0]) + ", " + std::to_string(op.attrs->pads[1]));
  outs.push_back({Shape{x[0], w[0], Dim{ho, 0}, Dim{wo, 0}}, g.activationDtype});
  return true;
}

struct Conv2dCounts : BaseCounts {
  /// 2·n·Cin·kh·kw: n = N·Cout·Hout·Wout output points, each a dot product of Cin·kh·kw.
  template <class C> static Num<C> conv(C &c) {
    const Shape &w = in(c.g, c.op, 1).shape;
    Num<C> t = c.lit(2) * c.n(); // one term at a time: the named quantities list in this order
    t = t * c.dim("Cin", w[1]);
    t = t * c.dim("kh", w[2]);
    return t * c.dim("kw", w[3]);
  }
  template <class C> static Num<C> flops(C &c) {
    if (c.op.inputs.size() < 3) {
      c.note("each output point is a dot product of Cin·kh·kw; a multiply-add counts 2 FLOPs");
      return conv(c);
    }
    c.note("each output point is a dot product of Cin·kh·kw (a multiply-add counts 2 FLOPs), "
           "plus its bias");
    return conv(c) + c.n();
  }
  /// dx (a transposed convolution) and dw (a correlation of x with dy) cost what the forward
  /// does; the bias's gradient sums dy over N, H, W.
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i == 2) {
      c.note("the bias: Σ of the output gradient over N, H and W");
      return c.n();
    }
    c.note(i == 0 ? "dx: a transposed convolution of the forward's size"
                  : "dw: a correlation of x with dy, of the forward's size");
    return conv(c);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    r.matmulFlops = conv(c);
  }
};

void savedConv2d(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                 std::vector<SavedTensor> &out) {
  if (need(needGrad, 1))
    keep(g, out, op.inputs[0], "input");
  if (need(needGrad, 0))
    keep(g, out, op.inputs[1], "weight");
}

/// max_pool2d and avg_pool2d over (kh, kw) windows; max also returns the int32 index of each
/// window's maximum, which its backward reads.
bool inferPool(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
               ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  const OpAttrs &a = op.attrs;
  std::string name = opName(op.kind).str();
  if (x.shape.size() != 4)
    return fail(err, ShapeErrorKind::Invalid,
                name + " expects x [batch, channels, height, width], got " + g.formatShape(x.shape));
  for (int i = 0; i < 2; ++i)
    if (a.window[i] <= 0 || a.strides[i] <= 0 || a.pads[i] < 0 || a.pads[i] > a.window[i] / 2)
      return fail(err, ShapeErrorKind::Invalid,
                  name + " needs a positive window and stride, and padding at most half the "
                         "window, got window " + std::to_string(a.window[i]) + ", stride " +
                      std::to_string(a.strides[i]) + ", padding " + std::to_string(a.pads[i]));
  int64_t ho = windowOut(x.shape[2].size, a.window[0], a.strides[0], a.pads[0]);
  int64_t wo = windowOut(x.shape[3].size, a.window[1], a.strides[1], a.pads[1]);
  if (ho <= 0 || wo <= 0)
    return fail(err, ShapeErrorKind::Invalid,
                name + " window " + std::to_string(a.window[0]) + "x" + std::to_string(a.window[1]) +
                    " does not fit in " + g.formatShape(x.shape));
  Shape shape{x.shape[0], x.shape[1], Dim{ho, 0}, Dim{wo, 0}};
  outs.push_back({shape, resultDtype(g, x.dtype)});
  if (op.kind == OpKind::MaxPool2d)
    outs.push_back({shape, Dtype::I32});
  return true;
}

struct PoolCounts : BaseCounts {
  /// w = kh·kw, the window's elements.
  template <class C> static Num<C> window(C &c) {
    return c.quantity("w", c.named("kh", c.lit(static_cast<double>(c.op.attrs->window[0]))) *
                               c.named("kw", c.lit(static_cast<double>(c.op.attrs->window[1]))));
  }
  /// One comparison (max) or add (avg, whose last add is the division) per window element.
  template <class C> static Num<C> flops(C &c) {
    c.note(c.op.kind == OpKind::MaxPool2d ? "one comparison per window element"
                                          : "one add per window element (the last one divides)");
    Num<C> w = window(c);
    return w * c.n();
  }
  template <class C> static Num<C> written(C &c) {
    if (c.op.kind != OpKind::MaxPool2d)
      return BaseCounts::written(c);
    c.note("the output, and the int32 index of each window's maximum (out1)");
    return sumBytes(c, c.op.outputs, "out");
  }
  /// max: each output gradient added at its argmax (windows may overlap); avg: each output
  /// gradient divided by the window and added to every element of its window.
  template <class C> static Num<C> grad(C &c, unsigned) {
    if (c.op.kind == OpKind::MaxPool2d || c.op.attrs->of == OpKind::MaxPool2d) {
      c.note("each output gradient added at its window's maximum");
      return c.n();
    }
    c.note("each output gradient divided by the window, then added to each of its elements");
    Num<C> w = window(c);
    return (w + c.lit(1)) * c.n();
  }
};

void savedPool(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
               std::vector<SavedTensor> &out) {
  if (need(needGrad, 0) && op.kind == OpKind::MaxPool2d)
    keep(g, out, op.outputs[1], "argmax indices");
}

// ---------------------------------------------------------------------------------------------
// Ops that autodiff and step assembly add (passes/Backward.cpp). Their outputs are created by
// the builder (gradients are written in place, summed when a tensor has several readers), so
// `infer` returns the types the outputs must have and the verifier compares them. Their FLOPs
// are the gradient FLOPs of the forward op they differentiate (docs/counting.md), so the sum
// over backward ops equals the per-input gradient formulas above exactly.

/// The types of the ops' existing outputs: for ops whose results are given, not derived.
bool inferGiven(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                ShapeError &) {
  for (TensorId t : op.outputs)
    outs.push_back({g.tensors[t].shape, g.tensors[t].dtype});
  return true;
}

bool inferContiguous(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  outs.push_back({in(g, op, 0).shape, in(g, op, 0).dtype});
  return true;
}

/// reduce_to and expand: the target shape is an attribute (the shape of the gradient's tensor).
bool inferToShape(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  outs.push_back({op.attrs->newShape, in(g, op, 0).dtype});
  return true;
}

/// contiguous, fill: a copy or a constant written, no arithmetic.
struct CopyCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note(c.op.kind == OpKind::Fill ? "writes a constant: no arithmetic" : "a copy: no arithmetic");
    return c.lit(0);
  }
};

/// Summing the output gradient over broadcast dimensions: one add per element read.
struct ReduceToCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("one add per element read: the sum over the broadcast dimensions");
    return c.numelIn(0);
  }
};

/// The gradient of sum/mean: a broadcast, and for mean one multiply per element.
struct ExpandCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    if (!c.op.attrs->hasScalar) {
      c.note("a broadcast: no arithmetic");
      return c.lit(0);
    }
    c.note("a broadcast and one multiply per element (by 1 / count)");
    return c.n();
  }
};

/// The gradient of the last input, the output gradient being the last input.
bool inferLikeLast(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                   ShapeError &err) {
  if (!expectInputs(op, 1, 6, err))
    return false;
  const Tensor &dy = in(g, op, static_cast<unsigned>(op.inputs.size() - 1));
  outs.push_back({dy.shape, dy.dtype});
  return true;
}

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
struct SoftmaxBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("y·(g - Σ g·y) per element");
    return c.lit(4) * c.n();
  }
};

bool gradWanted(const Op &op, unsigned i) { return (op.attrs->gradMask >> i) & 1; }

/// A sum of the terms a gradient mask asks for: `add` appends one; `total` is 0 for none.
template <class C> struct Terms {
  C &c;
  Num<C> sum{};
  bool any = false;
  void add(const Num<C> &t) {
    sum = any ? sum + t : t;
    any = true;
  }
  Num<C> total() const { return any ? sum : c.lit(0); }
};

/// layer_norm_backward(x, w, mean, rstd, dy) and rms_norm_backward(x, w, rstd, dy): the
/// gradients of x, the weight and the bias that gradMask asks for, in that order.
bool inferNormBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                       ShapeError &err) {
  bool ln = op.kind == OpKind::LayerNormBackward;
  if (!expectInputs(op, ln ? 5 : 4, ln ? 5 : 4, err))
    return false;
  const Tensor &x = in(g, op, 0), &w = in(g, op, 1);
  if (gradWanted(op, 0))
    outs.push_back({x.shape, in(g, op, ln ? 4 : 3).dtype});
  for (unsigned i = 1; i <= (ln ? 2u : 1u); ++i)
    if (gradWanted(op, i))
      outs.push_back({w.shape, w.dtype});
  return true;
}

struct NormBackwardCounts : BaseCounts {
  /// dx (12 per element for layer norm, 8 for RMS norm), the weight's and the bias's sums over
  /// rows (1 per element each), as gradMask asks.
  template <class C> static Num<C> flops(C &c) {
    Num<C> n = c.numelIn(0);
    Terms<C> t{c};
    if (gradWanted(c.op, 0))
      t.add(c.lit(c.op.kind == OpKind::LayerNormBackward ? 12 : 8) * n);
    if (gradWanted(c.op, 1))
      t.add(n);
    if (gradWanted(c.op, 2))
      t.add(n);
    c.note("the input gradient, then Σ over rows for the weight and the bias, as asked");
    return t.total();
  }
};

/// attention_backward(q, k, v, o, lse, dO) when fused, (q, k, v, P[, mask, dropped], dO)
/// when not: dq, dk, dv as gradMask asks. A padding mask comes right after v.
bool inferAttentionBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                            ShapeError &err) {
  if (!expectInputs(op, 5, 8, err))
    return false;
  for (unsigned i = 0; i < 3; ++i)
    if (gradWanted(op, i))
      outs.push_back({in(g, op, i).shape, g.tensors[op.inputs.back()].dtype});
  return true;
}

llvm::SmallVector<bool, 3> maskBits(const Op &op, unsigned n) {
  llvm::SmallVector<bool, 3> v;
  for (unsigned i = 0; i < n; ++i)
    v.push_back(gradWanted(op, i));
  return v;
}

/// Bytes: q, k, v, o, dO and what the forward saved, read once, and dq, dk, dv written —
/// all a flash kernel moves. A materialised backward also moves the score-sized matrices
/// between its kernels (the forward's counting convention): dP = dO·Vᵀ written (1), the
/// softmax backward reading P and dP and writing dS (3), dS read for dQ and dK (2) and P read
/// for dV (1); with dropout, dP read and rewritten through the mask (2, + the mask's S bytes)
/// and the dropped probabilities read for dV instead of P.
struct AttentionBackwardCounts : BaseCounts {
  /// The gradients gradMask asks for, as the forward op's rule counts them.
  template <class C> static Num<C> flops(C &c) {
    Terms<C> t{c};
    for (unsigned i = 0; i < 3; ++i)
      if (gradWanted(c.op, i))
        t.add(AttentionCounts::grad(c, i));
    c.note("dq, dk and dv as asked, each as the attention rule counts it");
    return t.total();
  }
  /// S·act bytes of the score-sized matrices a materialised backward moves.
  template <class C> static Num<C> scoreBytes(C &c, double matrices) {
    AttnTerms<C> t = attentionTerms(c);
    return c.lit(matrices) * t.S * c.lit(static_cast<double>(bytesOf(c.g.activationDtype)));
  }
  template <class C> static Num<C> read(C &c) {
    const Op &op = c.op;
    if (op.attrs->fused) {
      c.note("q, k, v, o, the logsumexp and dO once each (flash)");
      return sumBytes(c, op.inputs, "in");
    }
    // Every input once except the saved matrices (P, and with dropout the mask and the dropped
    // P), which are counted among the score-sized reads below.
    size_t firstSaved = op.attrs->hasMask ? 4 : 3;
    Terms<C> t{c};
    for (unsigned i = 0; i < op.inputs.size(); ++i)
      if (i < firstSaved || i + 1 == op.inputs.size())
        t.add(c.bytesOf(op.inputs[i], "in", i));
    bool drop = op.attrs->p > 0;
    c.note(drop ? "unfused: P and dP read by the softmax backward, dS for dQ and dK, the dropped "
                  "P for dV, dP through the mask (read twice) and the 1-byte mask"
                : "unfused: P and dP read by the softmax backward, dS for dQ and dK, P for dV");
    Num<C> r = t.total() + scoreBytes(c, drop ? 6 : 5);
    if (!drop)
      return r;
    return r + attentionTerms(c).S;
  }
  template <class C> static Num<C> written(C &c) {
    Num<C> w = sumBytes(c, c.op.outputs, "out");
    if (c.op.attrs->fused) {
      c.note("dq, dk and dv as asked");
      return w;
    }
    c.note("dq, dk, dv, and the score-sized dP and dS (and with dropout dP after the mask)");
    return w + scoreBytes(c, c.op.attrs->p > 0 ? 3 : 2);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    llvm::SmallVector<bool, 3> need = maskBits(op, 3);
    r.executedFlops = executedBackwardAttention(g, op, need);
    AttnDims d = attnDims(g, op);
    r.matmulFlops = 0;
    for (unsigned i = 0; i < 3; ++i) // the products of each gradient: 4·S·dh for dq, 2·S·dh else
      if (need[i])
        r.matmulFlops += (i == 0 ? 4 : 2) * d.S * d.dh;
    // Flash attention recomputes P = exp(s − lse): an exp per computed score; materialised
    // attention reads the saved P.
    if (op.attrs->fused && anyNeed(need))
      r.transcendentals = d.S * causalFraction(g, op);
  }
};

/// conv2d_backward(x, w, dy): dx, dw, db as gradMask asks, in that order.
bool inferConv2dBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                         ShapeError &err) {
  if (!expectInputs(op, 3, 3, err))
    return false;
  Dtype dt = in(g, op, 2).dtype;
  if (gradWanted(op, 0))
    outs.push_back({in(g, op, 0).shape, dt});
  if (gradWanted(op, 1))
    outs.push_back({in(g, op, 1).shape, in(g, op, 1).dtype});
  if (gradWanted(op, 2))
    outs.push_back({Shape{in(g, op, 1).shape[0]}, in(g, op, 1).dtype});
  return true;
}

struct Conv2dBackwardCounts : BaseCounts {
  /// The forward's count from dy's shape (the forward output) and the weight: 2·n_dy·Cin·kh·kw.
  template <class C> static Num<C> conv(C &c) {
    const Shape &w = in(c.g, c.op, 1).shape;
    Num<C> t = c.lit(2) * c.numelIn(2);
    t = t * c.dim("Cin", w[1]);
    t = t * c.dim("kh", w[2]);
    return t * c.dim("kw", w[3]);
  }
  template <class C> static Num<C> flops(C &c) {
    Terms<C> t{c};
    if (gradWanted(c.op, 0))
      t.add(conv(c));
    if (gradWanted(c.op, 1))
      t.add(conv(c));
    if (gradWanted(c.op, 2))
      t.add(c.numelIn(2));
    c.note("dx and dw the forward's size each, the bias Σ of dy over N, H and W, as asked");
    return t.total();
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    double f = conv(c);
    r.matmulFlops = (gradWanted(op, 0) ? f : 0) + (gradWanted(op, 1) ? f : 0);
  }
};

/// pool2d_backward([indices,] dy): dx at attrs.newShape (x's shape); attrs.of is the pool.
bool inferPoolBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                       ShapeError &err) {
  if (!expectInputs(op, 1, 2, err))
    return false;
  outs.push_back({op.attrs->newShape, g.tensors[op.inputs.back()].dtype});
  return true;
}

struct PoolBackwardCounts : BaseCounts {
  /// max: one add per output gradient (at its argmax); avg: a divide and w adds per output
  /// gradient. attrs.of is the pool.
  template <class C> static Num<C> flops(C &c) {
    Num<C> dy = c.numelIn(static_cast<unsigned>(c.op.inputs.size() - 1));
    if (c.op.attrs->of == OpKind::MaxPool2d) {
      c.note("each output gradient added at its window's maximum");
      return dy;
    }
    c.note("each output gradient divided by the window, then added to each of its elements");
    return (PoolCounts::window(c) + c.lit(1)) * dy;
  }
};

bool inferEmbeddingBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                            ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  outs.push_back({op.attrs->newShape, in(g, op, 1).dtype});
  return true;
}

/// embedding_backward(ids, dy): the weight's gradient [vocab, d] (newShape), a scatter-add.
struct EmbeddingBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("a scatter-add: one add per element of dy");
    return c.numelIn(1);
  }
};

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

/// sum_squares(g...): Σ g² in fp32 over the gradients (the overflow check of loss scaling).
bool inferSumSquares(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &) {
  outs.push_back({Shape(), Dtype::F32});
  return true;
}
struct SumSquaresCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    Terms<C> t{c};
    for (unsigned i = 0; i < c.op.inputs.size(); ++i)
      t.add(c.lit(2) * c.numelIn(i));
    c.note("a square and an add per gradient element");
    return t.total();
  }
};


/// zero_grad writes every gradient once.
struct ZeroGradCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("writes in place: no arithmetic counted");
    return c.lit(0);
  }
  template <class C> static Num<C> read(C &c) {
    c.note("reads nothing");
    return c.lit(0);
  }
  template <class C> static Num<C> written(C &c) {
    c.note("each gradient written once");
    return sumBytes(c, c.op.outputs, "out");
  }
};

/// optimizer_update(grads…) → params, in place: attrs.scalar FLOPs per parameter (the
/// optimizer's count, passes/Backward.cpp). Bytes: the gradients and parameters read, the
/// parameters written; the fp32 master copy and state traffic are priced by StepTime's
/// optimizer time from the precision policy.
struct OptimizerUpdateCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    Terms<C> params{c};
    for (TensorId t : c.op.outputs)
      params.add(c.product(c.g.tensors[t].shape, 0, c.g.tensors[t].shape.size()));
    c.note("the optimizer's FLOPs per parameter × the parameters");
    return c.lit(c.op.attrs->scalar) * c.quantity("P", params.total());
  }
  template <class C> static Num<C> read(C &c) {
    c.note("the gradients and the parameters");
    Terms<C> t{c};
    for (unsigned i = 0; i < c.op.inputs.size(); ++i)
      t.add(c.bytesOf(c.op.inputs[i], "in", i));
    for (unsigned i = 0; i < c.op.outputs.size(); ++i)
      t.add(c.bytesOf(c.op.outputs[i], "out", i));
    return t.total();
  }
  template <class C> static Num<C> written(C &c) {
    c.note("the parameters, in place");
    return sumBytes(c, c.op.outputs, "out");
  }
};

// ---------------------------------------------------------------------------------------------
// Mixture of experts: topk, gather, moe and their backward ops (scatter_add, moe_backward).
//
// moe(x [..., d], gates [..., k], indices [..., k], w_gate [E, d, H], w_up [E, d, H],
// w_down [E, H, d]) runs each token's k chosen experts, bias-free SwiGLU
// down(silu(x·gate) * x·up), and sums their outputs weighted by the gates. T = numel(x) / d
// tokens give T·k routed slots. With a capacity factor cf > 0 each expert takes at most
// C = ⌈cf·T·k / E⌉ tokens and its buffers hold C rows: the kernels run E·C rows (padded),
// the model FLOPs count R = min(T·k, E·C) rows (balanced routing; the rest are dropped).
// Outputs: y [..., d], then what the backward reads, [Rb, H] ×3 and [Rb, d] with Rb the rows
// the buffers hold: the gate and up pre-activations, the hidden silu(g)·u, the expert outputs
// before the gate weight (for the gates' gradient).

/// The sizes the counts use: d, H, and R = min(T·k, E·C) the routed rows the model counts
/// (T·k without a capacity), with T = numel(x) / d tokens and k of the E experts each; Rb the
/// rows the kernels run and the buffers hold (T·k, or E·C with a capacity).
template <class C> struct MoeTerms {
  Num<C> R, d, H;
  double Rb = 0;
};

template <class C> MoeTerms<C> moeTerms(C &c) {
  const Shape &x = in(c.g, c.op, 0).shape, &w = in(c.g, c.op, 3).shape;
  MoeTerms<C> m;
  m.d = c.dim("d", x.back());
  m.H = c.dim("H", w[2]);
  Num<C> T = c.rows(x, "T");
  Num<C> k = c.dim("k", in(c.g, c.op, 1).shape.back());
  Num<C> slots = T * k;
  double cf = c.op.attrs->capacity;
  if (cf <= 0) {
    m.Rb = C::value(slots);
    m.R = c.quantity("R", slots);
    return m;
  }
  double E = static_cast<double>(w[0].size);
  m.Rb = E * std::ceil(cf * C::value(T) * C::value(k) / E);
  double R = std::min(C::value(slots), m.Rb);
  if constexpr (C::kExplains)
    m.R = c.quantity("R", Term{"min(T·k, E·⌈cf·T·k / E⌉) with E = " + formatFormulaNumber(E) +
                                   ", cf = " + formatFormulaNumber(cf),
                               "", R});
  else
    m.R = R;
  return m;
}

using MoeDims = MoeTerms<Count>;
MoeDims moeDims(const Graph &g, const Op &op) {
  Count c(g, op);
  return moeTerms(c);
}

/// Rows of the expert buffers from the tokens, top-k, experts and capacity factor; nullopt when
/// past int64.
std::optional<int64_t> moeBufferRows(int64_t T, int64_t k, int64_t E, double capacity) {
  int64_t slots;
  if (__builtin_mul_overflow(T, k, &slots))
    return std::nullopt;
  if (capacity <= 0)
    return slots;
  double c = std::ceil(capacity * static_cast<double>(slots) / static_cast<double>(E));
  int64_t rows;
  if (!(c < 9.0e18) || __builtin_mul_overflow(static_cast<int64_t>(c), E, &rows))
    return std::nullopt;
  return rows;
}

bool inferMoe(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
              ShapeError &err) {
  if (!expectInputs(op, 6, 6, err))
    return false;
  const Tensor &x = in(g, op, 0), &gates = in(g, op, 1), &idx = in(g, op, 2);
  const Shape &wg = in(g, op, 3).shape, &wu = in(g, op, 4).shape, &wd = in(g, op, 5).shape;
  if (x.shape.empty() || !isFloat(x.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "moe needs float tokens [..., d], got " + g.formatShape(x.shape));
  if (!isInteger(idx.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "moe indices must be integers (the experts topk chose), got " +
                    nameOf(idx.dtype).str() + g.formatShape(idx.shape));
  bool same = gates.shape.size() == x.shape.size() && idx.shape.size() == x.shape.size();
  for (size_t i = 0; same && i + 1 < x.shape.size(); ++i)
    same = gates.shape[i].size == x.shape[i].size && idx.shape[i].size == x.shape[i].size;
  same = same && gates.shape.back().size == idx.shape.back().size && gates.shape.back().size > 0;
  if (!same)
    return fail(err, ShapeErrorKind::Mismatch,
                "moe gates " + g.formatShape(gates.shape) + " and indices " +
                    g.formatShape(idx.shape) + " must be [..., top_k] over the tokens of " +
                    g.formatShape(x.shape));
  int64_t d = x.shape.back().size;
  bool weights = wg.size() == 3 && wu.size() == 3 && wd.size() == 3 && wg[1].size == d &&
                 wu[0].size == wg[0].size && wu[1].size == d && wu[2].size == wg[2].size &&
                 wd[0].size == wg[0].size && wd[1].size == wg[2].size && wd[2].size == d;
  if (!weights)
    return fail(err, ShapeErrorKind::Mismatch,
                "moe expert weights must be w_gate, w_up [experts, d, hidden] and w_down "
                "[experts, hidden, d] with d = " + std::to_string(d) + ", got " +
                    g.formatShape(wg) + ", " + g.formatShape(wu) + ", " + g.formatShape(wd));
  int64_t E = wg[0].size, k = gates.shape.back().size;
  if (E <= 0 || k > E)
    return fail(err, ShapeErrorKind::Invalid,
                "moe routes each token to top_k = " + std::to_string(k) + " of " +
                    std::to_string(E) + " experts: top_k must be at most the experts");
  if (!(op.attrs->capacity >= 0))
    return fail(err, ShapeErrorKind::Invalid, "moe capacity_factor must be 0 (no cap) or positive");
  std::optional<int64_t> tokens = checkedNumel(x.shape);
  std::optional<int64_t> rows = tokens ? moeBufferRows(*tokens / d, k, E, op.attrs->capacity)
                                       : std::nullopt;
  if (!rows)
    return fail(err, ShapeErrorKind::Overflow,
                "the routed tokens of moe are more than fit in a 64-bit integer");
  Dim R{*rows, 0};
  outs.push_back({x.shape, g.activationDtype});
  for (int i = 0; i < 3; ++i)
    outs.push_back({Shape{R, wg[2]}, g.activationDtype});
  outs.push_back({Shape{R, x.shape.back()}, g.activationDtype});
  return true;
}

/// 3 matmuls of 2·d·H per routed row, silu (4) and the product (1) per hidden element, and the
/// gate weight and the sum into y (2) per output element of each row.
template <class C> Num<C> moeMatmuls(C &c, const MoeTerms<C> &m, const Num<C> &rows) {
  return c.lit(6) * rows * m.d * m.H;
}
template <class C> Num<C> moeForwardFlops(C &c, const MoeTerms<C> &m, const Num<C> &rows) {
  return moeMatmuls(c, m, rows) + c.lit(5) * rows * m.H + c.lit(2) * rows * m.d;
}

/// dx: the gate times dy per row (R·d), dh = d(out)·w_downᵀ (2·R·H·d), the SwiGLU backward
/// (12 per hidden element: silu and its derivative, two products), dx_r = dg·w_gateᵀ +
/// du·w_upᵀ (4·R·d·H) and the sum of each token's k rows (R·d). gates: a dot product of dy
/// with each expert output (2·R·d). Each weight: one matmul of 2·R·d·H.
template <class C>
Num<C> moeGradFlops(C &c, const MoeTerms<C> &m, const Num<C> &rows, unsigned i) {
  switch (i) {
  case 0:
    c.note("gate × dy per row, dh = d(out)·w_downᵀ, the SwiGLU backward (12 per hidden "
           "element), dx = dg·w_gateᵀ + du·w_upᵀ, the sum of each token's k rows");
    return c.lit(6) * rows * m.d * m.H + c.lit(12) * rows * m.H + c.lit(2) * rows * m.d;
  case 1:
    c.note("a dot product of dy with each expert output");
    return c.lit(2) * rows * m.d;
  case 3:
  case 4:
  case 5:
    c.note("the weight's gradient: one matmul per expert, over its routed rows");
    return c.lit(2) * rows * m.d * m.H;
  default:
    c.note("integer expert indices have no gradient");
    return c.lit(0);
  }
}

double moeGrad(const Graph &g, const Op &op, const MoeDims &m, double rows, unsigned i) {
  Count c(g, op);
  return moeGradFlops(c, m, rows, i);
}

struct MoeCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    MoeTerms<C> m = moeTerms(c);
    c.note("per routed row: gate, up and down matmuls (2·d·H each), silu and the product "
           "(5 per hidden element), the gate weight and the sum into y (2 per output "
           "element); the router is its own matmul");
    return moeForwardFlops(c, m, m.R);
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i == 2) {
      c.note("integer expert indices have no gradient");
      return c.lit(0);
    }
    MoeTerms<C> m = moeTerms(c);
    return moeGradFlops(c, m, m.R, i);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    MoeDims m = moeTerms(c);
    r.executedFlops = moeForwardFlops(c, m, m.Rb);
    r.matmulFlops = moeMatmuls(c, m, m.R);
  }
};

/// The executed count runs the buffers' rows; without dx the weights' gradients still need
/// d(out) (and dg, du for w_gate and w_up), which dx's count otherwise holds.
double executedBackwardMoe(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad) {
  MoeDims m = moeDims(g, op);
  double f = 0;
  for (unsigned i = 0; i < 6; ++i)
    if (need(needGrad, i))
      f += moeGrad(g, op, m, m.Rb, i);
  if (!need(needGrad, 0) && (need(needGrad, 3) || need(needGrad, 4)))
    f += m.Rb * m.d + 2 * m.Rb * m.d * m.H + 12 * m.Rb * m.H;
  else if (!need(needGrad, 0) && need(needGrad, 5))
    f += m.Rb * m.d;
  return f;
}

void savedMoe(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
              std::vector<SavedTensor> &out) {
  if (!anyNeed(needGrad))
    return;
  bool chain = need(needGrad, 0) || need(needGrad, 3) || need(needGrad, 4);
  if (need(needGrad, 3) || need(needGrad, 4))
    keep(g, out, op.inputs[0], "input");
  keep(g, out, op.inputs[1], "gates");
  keep(g, out, op.inputs[2], "expert indices");
  if (chain) {
    keep(g, out, op.outputs[1], "expert gate pre-activations");
    keep(g, out, op.outputs[2], "expert up pre-activations");
  }
  if (need(needGrad, 5))
    keep(g, out, op.outputs[3], "expert hidden");
  if (need(needGrad, 1))
    keep(g, out, op.outputs[4], "expert outputs");
}

/// moe_backward(x, gates, indices, w_gate, w_up, w_down, g, u, h, out_e, dy): the gradients
/// of x, gates, w_gate, w_up and w_down that gradMask asks for, in that order.
bool inferMoeBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                      ShapeError &err) {
  if (!expectInputs(op, 11, 11, err))
    return false;
  for (unsigned i : {0u, 1u, 3u, 4u, 5u})
    if (gradWanted(op, i))
      outs.push_back({in(g, op, i).shape, i < 3 ? in(g, op, 10).dtype : in(g, op, i).dtype});
  return true;
}

struct MoeBackwardCounts : BaseCounts {
  /// The gradients gradMask asks for, as the forward op's rule counts them.
  template <class C> static Num<C> flops(C &c) {
    MoeTerms<C> m = moeTerms(c);
    Terms<C> t{c};
    for (unsigned i = 0; i < 6; ++i)
      if (gradWanted(c.op, i))
        t.add(moeGradFlops(c, m, m.R, i));
    c.note("dx, the gates, w_gate, w_up and w_down as asked, each as the moe rule counts it");
    return t.total();
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    MoeDims m = moeDims(g, op);
    auto need = maskBits(op, 6);
    r.matmulFlops = 0;
    for (unsigned i = 0; i < 6; ++i)
      if (need[i])
        r.matmulFlops += i == 0 ? 6 * m.R * m.d * m.H : i >= 3 ? 2 * m.R * m.d * m.H : 0;
    r.executedFlops = executedBackwardMoe(g, op, need);
  }
};

/// topk(x, k, dim): (the k largest values along dim, their i32 indices). One comparison per
/// element (a running top-k list, as softmax's max counts one per element).
bool inferTopK(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
               ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "topk dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  if (op.attrs->k <= 0 || op.attrs->k > x.shape[axis].size)
    return fail(err, ShapeErrorKind::Invalid,
                "topk k = " + std::to_string(op.attrs->k) + " must be between 1 and " +
                    std::to_string(x.shape[axis].size) + ", the size of dim " +
                    std::to_string(op.attrs->dim) + " of " + g.formatShape(x.shape));
  Shape shape = x.shape;
  shape[axis] = Dim{op.attrs->k, 0};
  outs.push_back({shape, resultDtype(g, x.dtype)});
  outs.push_back({shape, Dtype::I32});
  return true;
}

struct TopKCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("one comparison per element (a running top-k list)");
    return c.numelIn(0);
  }
  /// The values' gradient scattered into a zeroed gradient of x: one add per value.
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note("the values' gradient scattered into a zeroed gradient: one add each");
    return c.n();
  }
};

void savedTopK(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
               std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.outputs[1], "indices");
}

/// gather(x, indices, dim): out[i][j] = x[i][indices[i][j]] along dim (torch.gather); indices
/// have x's rank and at most its size in every other dimension.
bool inferGather(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Tensor &x = in(g, op, 0), &idx = in(g, op, 1);
  if (!isInteger(idx.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "gather indices must be integers, got " + nameOf(idx.dtype).str() +
                    g.formatShape(idx.shape));
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "gather dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  bool fits = idx.shape.size() == x.shape.size();
  for (size_t i = 0; fits && i < x.shape.size(); ++i)
    fits = i == axis || idx.shape[i].size <= x.shape[i].size;
  if (!fits)
    return fail(err, ShapeErrorKind::Mismatch,
                "gather indices " + g.formatShape(idx.shape) + " must have the rank of " +
                    g.formatShape(x.shape) + " and be no larger outside dim " +
                    std::to_string(op.attrs->dim));
  outs.push_back({idx.shape, x.dtype});
  return true;
}

/// Gather: the indices (input 1) pick elements of x (input 0).
struct GatherWords {
  static constexpr unsigned index = 1, table = 0;
  static constexpr const char *read = "the indices, and only the gathered elements: n of them";
  static constexpr const char *noGrad = "integer indices have no gradient";
  static constexpr const char *grad = "a scatter-add of the output gradient at the indices";
};
using GatherCounts = GatherLikeCounts<GatherWords>;

void savedGather(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                 std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.inputs[1], "indices");
}

/// scatter_add(indices, dy): a gradient of shape newShape, dy added at the indices along dim
/// (zero elsewhere unless it accumulates): the backward of topk and gather, one add per element.
bool inferScatterAdd(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  outs.push_back({op.attrs->newShape, in(g, op, 1).dtype});
  return true;
}
struct ScatterAddCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("one add per element of dy");
    return c.numelIn(1);
  }
};

// ---------------------------------------------------------------------------------------------
// The table: one entry per kind, named rule<ID> so that ir/Ops.def can index them below.

#define RULE(ID, INFER, COUNTS, EXEC, SAVED)                                                     \
  const OpRule rule##ID = {&inferChecked<INFER>, &forwardOf<COUNTS>, &gradOf<COUNTS>, EXEC, SAVED,  \
                           &explainOf<COUNTS>};

RULE(Matmul, inferMatmul, MatmulCounts, executedDefault, savedMatmul)
RULE(Add, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Sub, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Mul, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Div, inferBinary, BinaryCounts, executedDefault, savedBinary)
RULE(Neg, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Relu, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Gelu, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Silu, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Tanh, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Sigmoid, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Exp, inferUnary, UnaryCounts, executedDefault, savedUnary)
RULE(Dropout, inferDropout, UnaryCounts, executedDefault, savedDropout)
RULE(Rope, inferRope, UnaryCounts, executedDefault, savedUnary)
RULE(Softmax, inferSoftmax, SoftmaxCounts, executedDefault, savedSoftmax)
RULE(LayerNorm, inferNorm, NormCounts, executedDefault, savedNorm)
RULE(RmsNorm, inferNorm, NormCounts, executedDefault, savedNorm)
RULE(Attention, inferAttention, AttentionCounts, executedBackwardAttention, savedAttention)
RULE(Embedding, inferEmbedding, EmbeddingCounts, executedDefault, savedEmbedding)
RULE(Sum, inferReduce, ReduceCounts, executedDefault, savesNothing)
RULE(Mean, inferReduce, ReduceCounts, executedDefault, savesNothing)
RULE(CrossEntropy, inferCrossEntropy, CrossEntropyCounts, executedDefault, savedCrossEntropy)
RULE(Positions, inferPositions, DataCounts, executedDefault, savesNothing)
RULE(NextTokens, inferNextTokens, DataCounts, executedDefault, savesNothing)
RULE(Concat, inferConcat, DataCounts, executedDefault, savesNothing)
RULE(Split, inferSplit, ViewCounts, executedDefault, savesNothing)
RULE(Reshape, inferReshape, ViewCounts, executedDefault, savesNothing)
RULE(Transpose, inferTranspose, ViewCounts, executedDefault, savesNothing)
RULE(TopK, inferTopK, TopKCounts, executedDefault, savedTopK)
RULE(Gather, inferGather, GatherCounts, executedDefault, savedGather)
RULE(Moe, inferMoe, MoeCounts, executedBackwardMoe, savedMoe)
RULE(Slice, inferSlice, ViewCounts, executedDefault, savesNothing)
RULE(Conv2d, inferConv2d, Conv2dCounts, executedDefault, savedConv2d)
RULE(MaxPool2d, inferPool, PoolCounts, executedDefault, savedPool)
RULE(AvgPool2d, inferPool, PoolCounts, executedDefault, savedPool)
RULE(BroadcastTo, inferBroadcastTo, BroadcastToCounts, executedDefault, savesNothing)
RULE(Contiguous, inferContiguous, CopyCounts, executedDefault, savesNothing)
RULE(ReduceTo, inferToShape, ReduceToCounts, executedDefault, savesNothing)
RULE(Expand, inferToShape, ExpandCounts, executedDefault, savesNothing)
RULE(Fill, inferGiven, CopyCounts, executedDefault, savesNothing)
RULE(UnaryBackward, inferLikeLast, UnaryBackwardCounts, executedDefault, savesNothing)
RULE(DivBackward, inferLikeLast, DivBackwardCounts, executedDefault, savesNothing)
RULE(SoftmaxBackward, inferLikeLast, SoftmaxBackwardCounts, executedDefault, savesNothing)
RULE(LayerNormBackward, inferNormBackward, NormBackwardCounts, executedDefault, savesNothing)
RULE(RmsNormBackward, inferNormBackward, NormBackwardCounts, executedDefault, savesNothing)
RULE(AttentionBackward, inferAttentionBackward, AttentionBackwardCounts, executedDefault, savesNothing)
RULE(EmbeddingBackward, inferEmbeddingBackward, EmbeddingBackwardCounts, executedDefault, savesNothing)
RULE(CrossEntropyBackward, inferCrossEntropyBackward, CrossEntropyBackwardCounts, executedDefault, savesNothing)
RULE(Conv2dBackward, inferConv2dBackward, Conv2dBackwardCounts, executedDefault, savesNothing)
RULE(PoolBackward, inferPoolBackward, PoolBackwardCounts, executedDefault, savesNothing)
RULE(ZeroGrad, inferGiven, ZeroGradCounts, executedDefault, savesNothing)
RULE(SumSquares, inferSumSquares, SumSquaresCounts, executedDefault, savesNothing)
RULE(Scale, inferGiven, ZeroGradCounts, executedDefault, savesNothing)
RULE(OptimizerUpdate, inferGiven, OptimizerUpdateCounts, executedDefault, savesNothing)
RULE(ScatterAdd, inferScatterAdd, ScatterAddCounts, executedDefault, savesNothing)
RULE(MoeBackward, inferMoeBackward, MoeBackwardCounts, executedDefault, savesNothing)
#undef RULE

const OpRule *const kRules[] = {
#define OP(ID, NAME, CLASS) &rule##ID,
#include "ir/Ops.def"
};

} // namespace

const OpRule &ruleFor(OpKind k) { return *kRules[static_cast<unsigned>(k)]; }

Formula describeForward(const Graph &g, const Op &op) {
  return ruleFor(op.kind).explain(g, op, Counted::ForwardFlops, 0);
}
Formula describeBytesRead(const Graph &g, const Op &op) {
  return ruleFor(op.kind).explain(g, op, Counted::BytesRead, 0);
}
Formula describeBytesWritten(const Graph &g, const Op &op) {
  return ruleFor(op.kind).explain(g, op, Counted::BytesWritten, 0);
}
Formula describeGrad(const Graph &g, const Op &op, unsigned i) {
  return ruleFor(op.kind).explain(g, op, Counted::GradFlops, i);
}

bool broadcastShapes(const Shape &a, const Shape &b, Shape &out) {
  size_t rank = std::max(a.size(), b.size());
  Shape result(rank);
  for (size_t i = 0; i < rank; ++i) {
    // Align from the right: a missing leading dim behaves as size 1.
    Dim da = i < a.size() ? a[a.size() - 1 - i] : Dim{1, 0};
    Dim db = i < b.size() ? b[b.size() - 1 - i] : Dim{1, 0};
    Dim &r = result[rank - 1 - i];
    if (da.size == db.size)
      r = Dim{da.size, da.sym ? da.sym : db.sym};
    else if (da.size == 1)
      r = db;
    else if (db.size == 1)
      r = da;
    else
      return false;
  }
  out = std::move(result);
  return true;
}

bool acceptsLayout(const Graph &g, const Op &op, unsigned i) {
  const Tensor &t = g.tensors[op.inputs[i]];
  const Shape &s = t.shape;
  size_t r = s.size();
  if (opClass(op.kind) == OpClass::View || op.kind == OpKind::Contiguous || r == 0)
    return true;
  const llvm::SmallVector<int64_t, 4> st = stridesOf(s, t.layout);
  if (op.kind == OpKind::Matmul) {
    if (r == 1)
      return st[0] == 1 || s[0].size == 1;
    // One of the last two dimensions has unit stride (a transposed operand is fine), and
    // the batch dimensions collapse into one batch stride.
    bool rowOrCol = st[r - 1] == 1 || s[r - 1].size == 1 || st[r - 2] == 1 || s[r - 2].size == 1;
    for (size_t k = 0; k + 3 < r; ++k)
      if (s[k].size > 1 && st[k] != st[k + 1] * s[k + 1].size)
        return false;
    return rowOrCol;
  }
  if ((op.kind == OpKind::Attention || op.kind == OpKind::AttentionBackward) && i < 3 && r == 3)
    // Rows of q, k and v may be strided (the parts of a fused qkv projection); each row dense.
    return (st[2] == 1 || s[2].size == 1) && (s[0].size == 1 || st[0] == st[1] * s[1].size);
  return isDense(s, t.layout);
}

bool normalizeAxis(int64_t axis, size_t rank, size_t &out) {
  int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r)
    return false;
  out = static_cast<size_t>(axis < 0 ? axis + r : axis);
  return true;
}

} // namespace tally

namespace tally {

std::string verifyOpTypes(const Graph &g, OpId from) {
  for (OpId o = from; o < g.ops.size(); ++o) {
    const Op &op = g.ops[o];
    // An op whose rule takes its outputs as given (fill, zero_grad, the optimizer update over
    // every parameter) has nothing to compare: its output shapes are verifyGraph's to check.
    // Listing a 120,000-parameter update's outputs was a tenth of a 10,000-layer check's
    // page faults.
    if (ruleFor(op.kind).infer == &inferChecked<&inferGiven>)
      continue;
    llvm::SmallVector<TensorType, 3> outs;
    ShapeError err;
    if (!ruleFor(op.kind).infer(g, op, outs, err))
      return "op " + g.opPath(op) + ": " + err.message;
    if (outs.size() != op.outputs.size())
      return "op " + g.opPath(op) + " has " + std::to_string(op.outputs.size()) + " outputs, its rule " +
             std::to_string(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      const Tensor &t = g.tensors[op.outputs[i]];
      // A gradient may be written at another shape with the same elements (a [1, d] bias
      // summed from [d]); the dtype of a gradient is the gradient's (bf16 into an fp32 region).
      if (numel(t.shape) != numel(outs[i].shape))
        return "op " + g.opPath(op) + " output " + std::to_string(i) + " is " +
               Graph::formatSizes(t.shape) + ", its rule gives " + Graph::formatSizes(outs[i].shape);
      if (t.role != TensorRole::Gradient && op.phase == Phase::Forward && t.dtype != outs[i].dtype)
        return "op " + g.opPath(op) + " output " + std::to_string(i) + " has dtype " +
               nameOf(t.dtype).str() + ", its rule gives " + nameOf(outs[i].dtype).str();
    }
  }
  return "";
}

} // namespace tally
