// The counting rules of ir/OpRules.cpp written out as formulas with the op's sizes substituted,
// for `tally explain`. Each function below mirrors one rule of docs/counting.md; its value is
// computed from the same numbers it prints, and tests/unit/test_explain.cpp checks that value
// against ir/OpRules.cpp for every op kind, so a change to a rule that is not made here too
// fails a test instead of printing a wrong derivation.
//
// Layout: a tiny expression builder (Term: symbolic text, substituted text and value built
// together), helpers that name dimensions and element counts, then one function per quantity
// (forward FLOPs, bytes read, bytes written, gradient FLOPs), each a switch over the op kinds.
#include "ir/OpFormulas.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace tally {

std::string formatFormulaNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Terms: a symbolic text, the same with numbers, and the value, built side by side so the three
// cannot disagree.

struct Term {
  std::string sym, sub;
  double val = 0;
  bool sum = false; ///< a sum: parenthesise it inside a product
};

std::string wrap(const std::string &s, bool sum) { return sum ? "(" + s + ")" : s; }

Term lit(double v) { return {formatFormulaNumber(v), formatFormulaNumber(v), v}; }
Term var(const std::string &name, double v) { return {name, formatFormulaNumber(v), v}; }

Term operator*(const Term &a, const Term &b) {
  return {wrap(a.sym, a.sum) + "·" + wrap(b.sym, b.sum),
          wrap(a.sub, a.sum) + " · " + wrap(b.sub, b.sum), a.val * b.val};
}
Term operator+(const Term &a, const Term &b) {
  return {a.sym + " + " + b.sym, a.sub + " + " + b.sub, a.val + b.val, true};
}

bool identChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

/// True when `text` mentions `name` as a whole word ("S" in "4·S·dh", not in "s_kv").
bool names(const std::string &text, const std::string &name) {
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    size_t end = at + name.size();
    bool before = at == 0 || !identChar(text[at - 1]);
    bool after = end >= text.size() || !identChar(text[end]);
    if (before && after)
      return true;
  }
  return false;
}

/// Builds one Formula: the quantities it names, then its expression.
class Builder {
public:
  Builder(const Graph &g, const Op &op) : g(g), op(op) {}

  /// Names a quantity built from other terms ("S = b·h·s·s_kv = 16 · 12 · 1024 · 1024") and
  /// returns it as a variable.
  Term quantity(const std::string &name, const Term &t) {
    f.where.push_back({name, t.sym, t.sub, t.val});
    return var(name, t.val);
  }
  /// Names one dimension ("K = 768", "M = seq = 1024").
  Term dim(const std::string &name, const Dim &d) {
    f.where.push_back({name, d.sym ? g.symbols[d.sym] : "", "", static_cast<double>(d.size)});
    return var(name, static_cast<double>(d.size));
  }
  /// The product of dimensions [from, to) of a shape: names where they have one ("batch·seq"),
  /// numbers otherwise; 1 for none.
  Term product(const Shape &s, size_t from, size_t to) const {
    if (from >= to)
      return lit(1);
    Term t;
    for (size_t i = from; i < to; ++i) {
      Term d = s[i].sym ? var(g.symbols[s[i].sym], static_cast<double>(s[i].size))
                        : lit(static_cast<double>(s[i].size));
      t = i == from ? d : t * d;
    }
    return t;
  }
  /// n: the element count of the op's first output.
  Term n() {
    if (!haveN) {
      const Shape &s = g.tensors[op.outputs[0]].shape;
      nTerm = quantity("n", product(s, 0, s.size()));
      haveN = true;
    }
    return nTerm;
  }
  /// numel of input i, named "numel(in<i>)".
  Term numelIn(unsigned i) {
    const Shape &s = g.tensors[op.inputs[i]].shape;
    return quantity("numel(in" + std::to_string(i) + ")", product(s, 0, s.size()));
  }
  /// bytes(in<i>) or bytes(out<i>): the element count times the dtype's size, written out.
  Term bytesOf(TensorId t, const std::string &label) const {
    const Tensor &x = g.tensors[t];
    Term count = product(x.shape, 0, x.shape.size());
    Term size = lit(static_cast<double>(tally::bytesOf(x.dtype)));
    Term b = count * size;
    return {"bytes(" + label + ")", b.sub, b.val};
  }
  /// Rows of a tensor reduced along its last dimension: numel / last, the product of the other
  /// dimensions (0 for an empty tensor).
  Term rows(const Shape &s, const std::string &name = "rows") {
    if (s.empty() || s.back().size == 0)
      return quantity(name, lit(0));
    return quantity(name, product(s, 0, s.size() - 1));
  }

  /// Finishes the formula, keeping only the quantities it names (directly, or through another
  /// kept quantity: S names b, h, s and s_kv).
  Formula done(const Term &t, std::string note = "") {
    f.symbolic = t.sym;
    f.substituted = t.sub;
    f.value = t.val;
    f.note = std::move(note);
    std::vector<bool> keep(f.where.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < f.where.size(); ++i) {
        if (keep[i])
          continue;
        bool used = names(f.symbolic, f.where[i].name);
        for (size_t j = 0; j < f.where.size() && !used; ++j)
          used = keep[j] && names(f.where[j].symbolic, f.where[i].name);
        if (used)
          keep[i] = changed = true;
      }
    }
    std::vector<FormulaQuantity> kept;
    for (size_t i = 0; i < f.where.size(); ++i)
      if (keep[i])
        kept.push_back(f.where[i]);
    f.where = std::move(kept);
    return std::move(f);
  }
  Formula zero(std::string note) { return done(lit(0), std::move(note)); }

  const Graph &g;
  const Op &op;

private:
  Formula f;
  Term nTerm;
  bool haveN = false;
};

const Tensor &input(const Graph &g, const Op &op, unsigned i) { return g.tensors[op.inputs[i]]; }

/// Per-element FLOPs of the unary ops: {forward, gradient}, as in ir/OpRules.cpp's unaryCost.
struct PerElement {
  double fwd, grad;
};
PerElement unaryPerElement(OpKind k) {
  switch (k) {
  case OpKind::Neg: return {1, 1};
  case OpKind::Relu: return {1, 1};
  case OpKind::Gelu: return {8, 12};
  case OpKind::Silu: return {4, 6};
  case OpKind::Tanh: return {4, 3};
  case OpKind::Sigmoid: return {4, 3};
  case OpKind::Exp: return {1, 1};
  case OpKind::Dropout: return {1, 1};
  case OpKind::Rope: return {3, 3};
  default: return {0, 0};
  }
}

// ---------------------------------------------------------------------------------------------
// Matmul: 2·M·N·K·batch.

Term matmulTerm(Builder &b) {
  const Shape &a = input(b.g, b.op, 0).shape, &w = input(b.g, b.op, 1).shape;
  const Shape &c = b.g.tensors[b.op.outputs[0]].shape;
  bool hasM = a.size() >= 2, hasN = w.size() >= 2;
  size_t batchDims = c.size() - (hasM ? 1 : 0) - (hasN ? 1 : 0);
  Term t = lit(2);
  if (hasM)
    t = t * b.dim("M", c[batchDims]);
  if (hasN)
    t = t * b.dim("N", c.back());
  t = t * b.dim("K", a.back());
  if (batchDims > 0)
    t = t * b.quantity("batch", b.product(c, 0, batchDims));
  return t;
}

// ---------------------------------------------------------------------------------------------
// Attention: S = b·h·s·s_kv scores of h heads of size dh.

struct AttentionTerms {
  Term S, dh, b, h, s;
  double per; ///< FLOPs per score outside the matmuls: 5, or 6 with dropout
};

AttentionTerms attentionTerms(Builder &bld) {
  const Shape &q = input(bld.g, bld.op, 0).shape, &k = input(bld.g, bld.op, 1).shape;
  AttentionTerms t;
  t.b = bld.dim("b", q[0]);
  t.s = bld.dim("s", q[1]);
  Term skv = bld.dim("s_kv", k[1]);
  t.h = bld.quantity("h", lit(static_cast<double>(bld.op.attrs.heads)));
  Term d = lit(static_cast<double>(q[2].size));
  double dh = static_cast<double>(q[2].size) / static_cast<double>(bld.op.attrs.heads);
  t.dh = bld.quantity("dh", Term{"d / h", d.sub + " / " + t.h.sub, dh});
  t.S = bld.quantity("S", t.b * t.h * t.s * skv);
  t.per = 5 + (bld.op.attrs.p > 0 ? 1 : 0);
  return t;
}

std::string causalNote(const Graph &g, const Op &op) {
  const Shape &q = input(g, op, 0).shape, &k = input(g, op, 1).shape;
  if (!op.attrs.causal)
    return "";
  if (!op.attrs.fused)
    return "causal, unfused: the dense score matrix is computed, then masked; model FLOPs "
           "count all s·s_kv scores";
  if (q[1].size != k[1].size)
    return "causal with s != s_kv: executed FLOPs are the dense count";
  std::string s = formatFormulaNumber(static_cast<double>(q[1].size));
  return "model FLOPs count all s·s_kv scores (Narayanan et al.); the causal flash kernel "
         "executes the lower triangle, (s + 1)/(2s) = (" + s + " + 1)/(2 · " + s + ") of them";
}

// ---------------------------------------------------------------------------------------------
// Bytes: the default is every input read once and every output written once.

Term sumBytes(Builder &b, const llvm::SmallVector<TensorId, 3> &ts, const char *prefix) {
  Term t = lit(0);
  for (unsigned i = 0; i < ts.size(); ++i) {
    Term x = b.bytesOf(ts[i], prefix + std::to_string(i));
    t = i == 0 ? x : t + x;
  }
  return t;
}

bool isView(OpKind k) { return opClass(k) == OpClass::View; }

// ---------------------------------------------------------------------------------------------
// MoE: T tokens of width d, k experts each of E, hidden width H; R routed rows.

struct MoeTerms {
  Term R, d, H;
};

MoeTerms moeTerms(Builder &b) {
  const Shape &x = input(b.g, b.op, 0).shape, &w = input(b.g, b.op, 3).shape;
  MoeTerms m;
  m.d = b.dim("d", x.back());
  m.H = b.dim("H", w[2]);
  Term T = b.rows(x, "T");
  Term k = b.dim("k", input(b.g, b.op, 1).shape.back());
  Term slots = T * k;
  if (b.op.attrs.capacity <= 0) {
    m.R = b.quantity("R", slots);
    return m;
  }
  double E = static_cast<double>(w[0].size);
  double C = std::ceil(b.op.attrs.capacity * slots.val / E);
  m.R = b.quantity("R", Term{"min(T·k, E·⌈cf·T·k / E⌉) with E = " + formatFormulaNumber(E) +
                                 ", cf = " + formatFormulaNumber(b.op.attrs.capacity),
                             "", std::min(slots.val, E * C)});
  return m;
}

} // namespace

Formula describeForward(const Graph &g, const Op &op) {
  Builder b(g, op);
  switch (op.kind) {
  case OpKind::Matmul:
    return b.done(matmulTerm(b), "a multiply-add counts 2 FLOPs");
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div:
    return b.done(b.n(), "one FLOP per output element");
  case OpKind::Neg:
  case OpKind::Relu:
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Exp:
  case OpKind::Dropout:
  case OpKind::Rope:
    return b.done(lit(unaryPerElement(op.kind).fwd) * b.n(), "FLOPs per output element × n");
  case OpKind::Softmax:
    return b.done(lit(5) * b.n(), "max, subtract, exp, sum, divide per element");
  case OpKind::LayerNorm:
    return b.done(lit(8) * b.n(), "mean, variance, normalise, scale and shift per element");
  case OpKind::RmsNorm:
    return b.done(lit(5) * b.n(), "square, mean, rsqrt-scale and weight per element");
  case OpKind::Attention: {
    AttentionTerms t = attentionTerms(b);
    Term f = lit(4) * t.S * t.dh + lit(t.per) * t.S;
    std::string note = "Q·Kᵀ and P·V are 2·S·dh each; scale and softmax 5 per score" +
                       std::string(t.per > 5 ? ", dropout 1" : "");
    std::string causal = causalNote(g, op);
    return b.done(f, causal.empty() ? note : note + "; " + causal);
  }
  case OpKind::Embedding:
    return b.zero("a gather: no arithmetic");
  case OpKind::Sum:
    return b.done(b.numelIn(0), "one add per input element");
  case OpKind::Mean:
    return b.done(b.numelIn(0) + b.n(), "one add per input element, one divide per output");
  case OpKind::CrossEntropy: {
    const Shape &logits = input(g, op, 0).shape;
    Term N = b.rows(logits, "N");
    Term V = b.dim("V", logits.back());
    return b.done(lit(5) * N * V + N, "max, subtract, exp, sum, log per logit; one add per row for the mean");
  }
  case OpKind::Positions:
  case OpKind::NextTokens:
  case OpKind::Concat:
    return b.zero("data movement: no arithmetic");
  case OpKind::Split:
  case OpKind::Reshape:
  case OpKind::Transpose:
    return b.zero("a view: no arithmetic, no data moves");
  case OpKind::TopK:
    return b.done(b.numelIn(0), "one comparison per element (a running top-k list)");
  case OpKind::Gather:
    return b.zero("a gather: no arithmetic");
  case OpKind::Moe: {
    MoeTerms m = moeTerms(b);
    return b.done(lit(6) * m.R * m.d * m.H + lit(5) * m.R * m.H + lit(2) * m.R * m.d,
                  "per routed row: gate, up and down matmuls (2·d·H each), silu and the product "
                  "(5 per hidden element), the gate weight and the sum into y (2 per output "
                  "element); the router is its own matmul");
  }
  default:
    break;
  }
  return b.zero("");
}

Formula describeBytesRead(const Graph &g, const Op &op) {
  Builder b(g, op);
  if (isView(op.kind))
    return b.zero("a view shares its input's storage");
  switch (op.kind) {
  case OpKind::Embedding: {
    Term ids = b.bytesOf(op.inputs[0], "in0");
    Term rowsRead = b.n() * lit(static_cast<double>(bytesOf(input(g, op, 1).dtype)));
    return b.done(ids + rowsRead, "the ids, and only the gathered rows of the table: n elements");
  }
  case OpKind::Gather: {
    Term ids = b.bytesOf(op.inputs[1], "in1");
    Term read = b.n() * lit(static_cast<double>(bytesOf(input(g, op, 0).dtype)));
    return b.done(ids + read, "the indices, and only the gathered elements: n of them");
  }
  case OpKind::Attention: {
    Term t = sumBytes(b, op.inputs, "in");
    if (op.attrs.fused)
      return b.done(t, "q, k and v once each; the scores stay on chip (flash)");
    AttentionTerms a = attentionTerms(b);
    double m = op.attrs.p > 0 ? 3 : 2;
    Term act = lit(static_cast<double>(bytesOf(g.activationDtype)));
    return b.done(t + lit(m) * a.S * act,
                  "unfused: the score matrix, the probabilities" +
                      std::string(m > 2 ? " and the dropped probabilities" : "") +
                      " are each read once by the next kernel");
  }
  default:
    break;
  }
  if (op.inputs.empty())
    return b.zero("no inputs");
  return b.done(sumBytes(b, op.inputs, "in"),
                op.attrs.hasScalar ? "the constant operand costs nothing" : "each input read once");
}

Formula describeBytesWritten(const Graph &g, const Op &op) {
  Builder b(g, op);
  if (isView(op.kind))
    return b.zero("a view shares its input's storage");
  Term t = sumBytes(b, op.outputs, "out");
  switch (op.kind) {
  case OpKind::Dropout:
    return b.done(t, "the output, and the mask (out1): one byte per element");
  case OpKind::LayerNorm:
    return b.done(t, "the output, and the row statistics: mean and rstd in fp32 (out1, out2)");
  case OpKind::RmsNorm:
    return b.done(t, "the output, and the row statistics: rstd in fp32 (out1)");
  case OpKind::Attention: {
    if (op.attrs.fused)
      return b.done(t, "the output, and the logsumexp per query row in fp32 (out1)");
    AttentionTerms a = attentionTerms(b);
    double m = op.attrs.p > 0 ? 3 : 2;
    Term act = lit(static_cast<double>(bytesOf(g.activationDtype)));
    Term w = b.bytesOf(op.outputs[0], "out0") + lit(m) * a.S * act;
    if (op.attrs.p > 0)
      w = w + a.S;
    return b.done(w, "unfused: the output, the scores, the probabilities" +
                         std::string(op.attrs.p > 0
                                         ? ", the dropped probabilities and the 1-byte dropout mask"
                                         : ""));
  }
  case OpKind::CrossEntropy:
    return b.done(t, "the fp32 loss, and the logsumexp per row in fp32 (out1)");
  default:
    return b.done(t, "each output written once");
  }
}

Formula describeGrad(const Graph &g, const Op &op, unsigned i) {
  Builder b(g, op);
  switch (op.kind) {
  case OpKind::Matmul:
    return b.done(matmulTerm(b), i == 0 ? "dA = dC·Bᵀ: a matmul of the forward's size"
                                        : "dB = Aᵀ·dC: a matmul of the forward's size");
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div: {
    Term n = b.n();
    bool sub = op.kind == OpKind::Sub, mul = op.kind == OpKind::Mul, div = op.kind == OpKind::Div;
    if (op.attrs.hasScalar) {
      if (mul)
        return b.done(n, "g·c");
      if (div)
        return op.attrs.scalarOnLeft ? b.done(lit(3) * n, "c/x: -g·y²/c with y = c/x")
                                     : b.done(n, "x/c: g/c");
      if (sub && op.attrs.scalarOnLeft)
        return b.done(n, "c - x: the negated output gradient");
      return b.zero("x ± c: the output gradient itself");
    }
    Term local = lit(0);
    std::string note;
    if (sub && i == 1)
      local = n, note = "the negation -g";
    else if (mul)
      local = n, note = "g times the other operand";
    else if (div)
      local = i == 0 ? n : lit(3) * n, note = i == 0 ? "g/b" : "-g·a/b²";
    else
      note = "the output gradient itself";
    bool broadcast = numel(input(g, op, i).shape) != n.val;
    if (!broadcast)
      return b.done(local, note);
    std::string bcast = "this input was broadcast: its gradient also sums the output gradient, +n";
    if (local.val == 0 && local.sym == "0")
      return b.done(n, bcast);
    return b.done(local + n, note + "; " + bcast);
  }
  case OpKind::Neg:
  case OpKind::Relu:
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Exp:
  case OpKind::Dropout:
  case OpKind::Rope:
    return b.done(lit(unaryPerElement(op.kind).grad) * b.n(), "FLOPs per element × n");
  case OpKind::Softmax:
    return b.done(lit(4) * b.n(), "y·(g - Σ g·y) per element");
  case OpKind::LayerNorm:
  case OpKind::RmsNorm:
    if (i == 0)
      return b.done(lit(op.kind == OpKind::LayerNorm ? 12 : 8) * b.n(), "the input gradient");
    return b.done(b.n(), i == 1 ? "the weight: Σ over rows of g·x̂" : "the bias: Σ over rows of g");
  case OpKind::Attention: {
    AttentionTerms t = attentionTerms(b);
    if (i == 0)
      return b.done(lit(4) * t.S * t.dh + lit(t.per - 1) * t.S,
                    "dP = dO·Vᵀ and dQ = dS·K (2·S·dh each), the softmax backward (4 per score)" +
                        std::string(t.per > 5 ? ", dropout (1 per score)" : "") +
                        "; dK and dV reuse dS");
    return b.done(lit(2) * t.S * t.dh, i == 1 ? "dK = dSᵀ·Q" : "dV = Pᵀ·dO");
  }
  case OpKind::Embedding:
    if (i == 1)
      return b.done(b.n(), "a scatter-add of the output gradient into the gathered rows");
    return b.zero("integer ids have no gradient");
  case OpKind::Sum:
    return b.zero("the gradient is broadcast: no arithmetic");
  case OpKind::Mean:
    return b.done(b.numelIn(0), "broadcast and divide by the count");
  case OpKind::CrossEntropy:
    if (i == 0)
      return b.done(lit(3) * b.numelIn(0), "exp(x - lse), minus the one-hot label, divided by N");
    return b.zero("integer labels have no gradient");
  case OpKind::Positions:
  case OpKind::NextTokens:
    return b.zero("integer outputs have no gradient");
  case OpKind::Concat:
  case OpKind::Split:
  case OpKind::Reshape:
  case OpKind::Transpose:
    return b.zero("the gradient is a view of the output gradient");
  case OpKind::TopK:
    return b.done(b.n(), "the values' gradient scattered into a zeroed gradient: one add each");
  case OpKind::Gather:
    if (i == 0)
      return b.done(b.n(), "a scatter-add of the output gradient at the indices");
    return b.zero("integer indices have no gradient");
  case OpKind::Moe: {
    if (i == 2)
      return b.zero("integer expert indices have no gradient");
    MoeTerms m = moeTerms(b);
    if (i == 0)
      return b.done(lit(6) * m.R * m.d * m.H + lit(12) * m.R * m.H + lit(2) * m.R * m.d,
                    "gate × dy per row, dh = d(out)·w_downᵀ, the SwiGLU backward (12 per hidden "
                    "element), dx = dg·w_gateᵀ + du·w_upᵀ, the sum of each token's k rows");
    if (i == 1)
      return b.done(lit(2) * m.R * m.d, "a dot product of dy with each expert output");
    return b.done(lit(2) * m.R * m.d * m.H, "the weight's gradient: one matmul per expert, "
                                            "over its routed rows");
  }
  default:
    break;
  }
  return b.zero("");
}

} // namespace tally
