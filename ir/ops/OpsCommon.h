// What the op families' rules (ir/ops/*.cpp) share, private to ir/: the helpers every shape
// rule and saved-tensor rule uses, the Counts machinery that turns one family's counting
// templates into the table's forward, gradFlops and explain entries, the pieces the backward
// ops of several families share, and the RULE macro each family file ends with.
//
// Each count is written once. An op family's forward FLOPs, bytes read, bytes written and
// per-input gradient FLOPs are the static function templates of one `...Counts` struct, over a
// counting context (ir/Formula.h): run on doubles (`Count`) they are the table's `forward` and
// `gradFlops`, which the passes call for every op; run on terms (`Explainer`) they are its
// `explain`, the formula, substituted text and note `tally explain` prints. What explain does
// not derive (executed and matmul FLOPs, transcendentals) is each struct's `finish`.
//
// A family's file (ir/ops/<Family>.cpp) holds, for each of its op kinds and their backward ops,
// the shape rule (`infer...`), the Counts struct and what the backward keeps (`saved...`), in
// an anonymous namespace, and ends with one RULE line per kind naming them. A new op kind is
// one line in ir/Ops.def and its rules and RULE line in its family's file (or a new file here).
#pragma once

#include "ir/OpRules.h"
#include "support/Format.h"

#include <cstdio>

#include <algorithm>
#include <string>
#include <vector>

namespace tally::oprules {

// ---------------------------------------------------------------------------------------------
// Shared helpers.

inline const Tensor &in(const Graph &g, const Op &op, unsigned i) {
  return g.tensors[op.inputs[i]];
}
inline const Tensor &out0(const Graph &g, const Op &op) { return g.tensors[op.outputs[0]]; }
inline double outNumel(const Graph &g, const Op &op) { return numel(out0(g, op).shape); }

/// ir/ops/Norm.cpp: what an eager rms_norm's backward holds while it runs beyond the walk's
/// buffers (backwardScratch); 0 for any other op.
double eagerNormScratch(const Graph &g, const Op &op);

inline bool need(llvm::ArrayRef<bool> needGrad, unsigned i) {
  return i < needGrad.size() && needGrad[i];
}
inline bool anyNeed(llvm::ArrayRef<bool> needGrad) {
  return std::any_of(needGrad.begin(), needGrad.end(), [](bool b) { return b; });
}

inline bool fail(ShapeError &err, ShapeErrorKind kind, std::string message) {
  err.kind = kind;
  err.message = std::move(message);
  return false;
}

inline bool expectInputs(const Op &op, size_t lo, size_t hi, ShapeError &err) {
  size_t n = op.inputs.size();
  if (n >= lo && n <= hi)
    return true;
  std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
  return fail(err, ShapeErrorKind::Invalid,
              opName(op.kind).str() + " expects " + want + " inputs, got " + std::to_string(n));
}

/// Float results are stored at the plan's activation dtype; integer-only arithmetic keeps its type.
inline Dtype resultDtype(const Graph &g, Dtype operand) {
  return isFloat(operand) ? g.activationDtype : operand;
}

/// Keeps `t` (an input or output of the op) unless it is already kept by this op (x * x).
inline void keep(const Graph &g, std::vector<SavedTensor> &out, TensorId t, const char *what) {
  for (const SavedTensor &s : out)
    if (s.tensor == t)
      return;
  out.push_back({t, what, g.bytes(t)});
}

/// Rows of a tensor reduced along its last dimension (normalisations, softmax over the vocab).
inline double rowsOf(const Shape &s) {
  return s.empty() || s.back().size == 0 ? 0 : numel(s) / static_cast<double>(s.back().size);
}

inline double executedDefault(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad) {
  double f = 0;
  for (unsigned i = 0; i < op.inputs.size(); ++i)
    if (need(needGrad, i))
      f += ruleFor(op.kind).gradFlops(g, op, i);
  return f;
}

inline void savesNothing(const Graph &, const Op &, llvm::ArrayRef<bool>,
                         std::vector<SavedTensor> &) {}

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
// Ops that autodiff and step assembly add (passes/Backward.cpp). Their outputs are created by
// the builder (gradients are written in place, summed when a tensor has several readers), so
// `infer` returns the types the outputs must have and the verifier compares them. Their FLOPs
// are the gradient FLOPs of the forward op they differentiate (docs/counting.md), so the sum
// over backward ops equals the per-input gradient formulas of the forward ops exactly. Each
// backward op's rule lives in its forward op's family file; what several of them share is here.

/// The types of the ops' existing outputs: for ops whose results are given, not derived.
inline bool inferGiven(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                       ShapeError &) {
  for (TensorId t : op.outputs)
    outs.push_back({g.tensors[t].shape, g.tensors[t].dtype});
  return true;
}

/// The gradient of the last input, the output gradient being the last input.
inline bool inferLikeLast(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                          ShapeError &err) {
  if (!expectInputs(op, 1, 6, err))
    return false;
  const Tensor &dy = in(g, op, static_cast<unsigned>(op.inputs.size() - 1));
  outs.push_back({dy.shape, dy.dtype});
  return true;
}

inline bool gradWanted(const Op &op, unsigned i) { return (op.attrs->gradMask >> i) & 1; }

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

inline llvm::SmallVector<bool, 3> maskBits(const Op &op, unsigned n) {
  llvm::SmallVector<bool, 3> v;
  for (unsigned i = 0; i < n; ++i)
    v.push_back(gradWanted(op, i));
  return v;
}

// ---------------------------------------------------------------------------------------------
// Attributes as --emit=ir prints them and explain words them (OpRule::printAttrs,
// describeAttrs), shared by the families whose ops take one axis.

/// printf's "%g" of one number (explain's way with epsilons).
inline std::string formatG(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
inline void printDim(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {dim = " << op.attrs->dim << "}";
}
inline std::string describeDim(const Graph &, const Op &op) {
  return "dim = " + std::to_string(op.attrs->dim);
}

// ---------------------------------------------------------------------------------------------
// The table. Every kind of ir/Ops.def has one entry, rule<ID>, defined by the RULE line of its
// family's file; ir/OpRules.cpp indexes them by kind. A kind without a RULE line does not link,
// a RULE line for a kind ir/Ops.def does not list does not compile, and a kind with two does
// not link.

#define OP(ID, NAME, CLASS) extern const OpRule rule##ID;
#include "ir/Ops.def"

/// RULE_ATTRS also names how `--emit=ir` prints the kind's attributes and how `tally explain`
/// words them (OpRule::printAttrs, describeAttrs).
#define RULE_ATTRS(ID, INFER, COUNTS, EXEC, SAVED, PRINT, DESCRIBE)                               \
  static_assert(static_cast<unsigned>(OpKind::ID) < kOpKinds);                                   \
  const OpRule rule##ID = {&inferChecked<INFER>, &forwardOf<COUNTS>, &gradOf<COUNTS>, EXEC, SAVED,  \
                           &explainOf<COUNTS>, PRINT, DESCRIBE};
#define RULE(ID, INFER, COUNTS, EXEC, SAVED)                                                     \
  RULE_ATTRS(ID, INFER, COUNTS, EXEC, SAVED, nullptr, nullptr)

} // namespace tally::oprules
