// The number types the counting rules of ir/ops/ are written over. Each rule (forward
// FLOPs, bytes read, bytes written, one input's gradient FLOPs) is one function template over a
// counting context C, written once:
//
//   template <class C> Num<C> flops(C &c) { c.note("..."); return c.lit(2) * c.dim("M", m) * ...; }
//
// instantiated twice. With `Count` the number is a double and names and notes cost nothing:
// that is what the passes run, millions of times. With `Explainer` the number is a `Term`, the
// symbolic text, the same with the op's sizes substituted, and the value, built side by side,
// and the context collects the named quantities and the note: that is what `tally explain`
// prints. The two are the same code, so they cannot disagree; tests/unit/test_explain.cpp still
// evaluates every substituted text, for every op kind, against the value the passes use.
#pragma once

#include "ir/Graph.h"

#include <string>
#include <vector>

namespace tally {

/// A named quantity a formula uses: a dimension ("K = 768") or a product of them
/// ("S = b·h·s·s_kv = 16 · 12 · 1024 · 1024 = 201326592").
struct FormulaQuantity {
  std::string name;         ///< "M", "n", "S"
  std::string symbolic;     ///< how it is formed ("b·h·s·s_kv"), or the dimension's name ("seq"); may be ""
  std::string substituted;  ///< the same with numbers ("16 · 12 · 1024 · 1024"); "" for a plain dimension
  double value = 0;
};

/// One counting rule applied to one op: the symbolic formula, the same formula with the values
/// substituted, and its value (computed from exactly the numbers shown).
struct Formula {
  std::string symbolic;     ///< "2·M·N·K", "4·S·dh + 5·S", "bytes(in0) + bytes(in1)"
  std::string substituted;  ///< "2 · 1024 · 1024 · 1024": numbers, `·`, `+`, `/` and parentheses only
  double value = 0;         ///< the value of `substituted`
  std::vector<FormulaQuantity> where; ///< the quantities `symbolic` names, in order of use
  std::string note;         ///< a remark on the convention ("a view: no data moves"); may be ""
};

/// Which count of an op a formula derives.
enum class Counted : uint8_t {
  ForwardFlops, ///< ForwardCost::flops
  BytesRead,    ///< ForwardCost::bytesRead
  BytesWritten, ///< ForwardCost::bytesWritten
  GradFlops,    ///< OpRule::gradFlops of one input
};

/// A count as the formulas print it: an exact integer ("2147483648") when it is one below 2^53,
/// otherwise six significant digits ("0.000976562", "1.5e+20").
std::string formatFormulaNumber(double v);

/// A formula's number for `tally explain`: a symbolic text, the same with numbers, and the
/// value, built side by side so the three cannot disagree.
struct Term {
  std::string sym, sub;
  double val = 0;
  bool sum = false; ///< a sum: parenthesised inside a product or a quotient
};
Term operator*(const Term &a, const Term &b);
Term operator+(const Term &a, const Term &b);
Term operator/(const Term &a, const Term &b);

/// The number type of a counting context.
template <class C> using Num = typename C::Num;

/// Runs a rule as arithmetic on doubles: what the passes use. Every name is dropped unread.
class Count {
public:
  using Num = double;
  static constexpr bool kExplains = false;
  Count(const Graph &g, const Op &op) : g(g), op(op) {}

  static double lit(double v) { return v; }
  static double value(double v) { return v; }
  static double dim(const char *, const Dim &d) { return static_cast<double>(d.size); }
  static double quantity(const char *, double v) { return v; }
  /// A number shown under a name of its own inside a larger quantity ("d" in "d / h").
  static double named(const char *, double v) { return v; }
  double product(const Shape &s, size_t from, size_t to) const {
    double t = 1;
    for (size_t i = from; i < to; ++i)
      t *= static_cast<double>(s[i].size);
    return t;
  }
  double n() const { return numel(g.tensors[op.outputs[0]].shape); }
  double numelIn(unsigned i) const { return numel(g.tensors[op.inputs[i]].shape); }
  double bytesOf(TensorId t, const char *, unsigned) const { return g.bytes(t); }
  double rows(const Shape &s, const char *) const {
    return s.empty() || s.back().size == 0 ? 0 : product(s, 0, s.size() - 1);
  }
  static void note(const char *) {}

  const Graph &g;
  const Op &op;
};

/// Runs a rule as a formula for `tally explain`: every number a Term, every named quantity
/// and the note collected, `done` turning the result into a Formula.
class Explainer {
public:
  using Num = Term;
  static constexpr bool kExplains = true;
  Explainer(const Graph &g, const Op &op) : g(g), op(op) {}

  static Term lit(double v);
  static double value(const Term &t) { return t.val; }
  /// Names one dimension ("K = 768", "M = seq = 1024").
  Term dim(const char *name, const Dim &d);
  /// Names a quantity built from other terms ("S = b·h·s·s_kv = 16 · 12 · 1024 · 1024") and
  /// returns it as a variable.
  Term quantity(const std::string &name, const Term &t);
  static Term named(const char *name, const Term &t);
  /// The product of dimensions [from, to) of a shape: names where they have one ("batch·seq"),
  /// numbers otherwise; 1 for none.
  Term product(const Shape &s, size_t from, size_t to) const;
  /// n: the element count of the op's first output.
  Term n();
  /// numel of input i, named "numel(in<i>)".
  Term numelIn(unsigned i);
  /// bytes(<prefix><i>): the tensor's element count times its dtype's size, written out.
  Term bytesOf(TensorId t, const char *prefix, unsigned i) const;
  /// Rows of a tensor reduced along its last dimension: the product of the other dimensions
  /// (0 for an empty tensor), named `name`.
  Term rows(const Shape &s, const char *name);
  void note(std::string text) { f.note = std::move(text); }

  /// The formula of `t`, keeping only the quantities it names (directly, or through another
  /// kept quantity: S names b, h, s and s_kv).
  Formula done(const Term &t);

  const Graph &g;
  const Op &op;

private:
  Formula f;
  Term nTerm;
  bool haveN = false;
};

} // namespace tally
