// Terms and the Explainer context of ir/Formula.h: how a counting rule of ir/ops/ prints as a
// formula. Nothing here knows an op kind; the rules themselves are in ir/ops/.
#include "ir/Formula.h"

#include "support/Format.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tally {

std::string formatFormulaNumber(double v) {
  return isExactInteger(v, 9007199254740992.0) ? integerText(v) : significant(v);
}

namespace {

std::string wrap(const std::string &s, bool sum) { return sum ? "(" + s + ")" : s; }

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

/// A named variable: its name, and its value as the substituted text, or the quantity's own
/// substituted text when six digits would not give the value back (a share such as 32 / 96).
Term var(const std::string &name, const Term &t) {
  std::string value = formatFormulaNumber(t.val);
  bool exact = std::strtod(value.c_str(), nullptr) == t.val;
  return {name, exact || t.sub.empty() ? value : "(" + t.sub + ")", t.val};
}

} // namespace

Term operator*(const Term &a, const Term &b) {
  return {wrap(a.sym, a.sum) + "·" + wrap(b.sym, b.sum),
          wrap(a.sub, a.sum) + " · " + wrap(b.sub, b.sum), a.val * b.val};
}
Term operator+(const Term &a, const Term &b) {
  return {a.sym + " + " + b.sym, a.sub + " + " + b.sub, a.val + b.val, true};
}
Term operator/(const Term &a, const Term &b) {
  return {wrap(a.sym, a.sum) + " / " + wrap(b.sym, b.sum),
          wrap(a.sub, a.sum) + " / " + wrap(b.sub, b.sum), a.val / b.val};
}

Term Explainer::lit(double v) { return {formatFormulaNumber(v), formatFormulaNumber(v), v}; }

Term Explainer::dim(const char *name, const Dim &d) {
  double v = static_cast<double>(d.size);
  f.where.push_back({name, d.sym ? g.symbols[d.sym] : "", "", v});
  return {name, formatFormulaNumber(v), v};
}

Term Explainer::quantity(const std::string &name, const Term &t) {
  f.where.push_back({name, t.sym, t.sub, t.val});
  return var(name, t);
}

Term Explainer::named(const char *name, const Term &t) { return {name, t.sub, t.val, t.sum}; }

Term Explainer::product(const Shape &s, size_t from, size_t to) const {
  if (from >= to)
    return lit(1);
  Term t;
  for (size_t i = from; i < to; ++i) {
    double v = static_cast<double>(s[i].size);
    Term d = s[i].sym ? Term{g.symbols[s[i].sym], formatFormulaNumber(v), v} : lit(v);
    t = i == from ? d : t * d;
  }
  return t;
}

Term Explainer::n() {
  if (!haveN) {
    const Shape &s = g.tensors[op.outputs[0]].shape;
    nTerm = quantity("n", product(s, 0, s.size()));
    haveN = true;
  }
  return nTerm;
}

Term Explainer::numelIn(unsigned i) {
  const Shape &s = g.tensors[op.inputs[i]].shape;
  return quantity("numel(in" + std::to_string(i) + ")", product(s, 0, s.size()));
}

Term Explainer::bytesOf(TensorId t, const char *prefix, unsigned i) const {
  const Tensor &x = g.tensors[t];
  Term b = product(x.shape, 0, x.shape.size()) * lit(tally::storageBytes(x.dtype));
  return {"bytes(" + std::string(prefix) + std::to_string(i) + ")", b.sub, b.val};
}

Term Explainer::rows(const Shape &s, const char *name) {
  if (s.empty() || s.back().size == 0)
    return quantity(name, lit(0));
  return quantity(name, product(s, 0, s.size() - 1));
}

Formula Explainer::done(const Term &t) {
  f.symbolic = t.sym;
  f.substituted = t.sub;
  f.value = t.val;
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

} // namespace tally
