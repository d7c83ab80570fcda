// Semantic analysis: declarations by name and constant evaluation with units.
//
// 1. addModule records each block, plan and target by name (duplicates are errors).
// 2. eval folds a constant expression: integers stay exact int64 (checked for overflow),
//    anything else is a double; units combine by dimension (+/- need equal dimensions,
//    * and / need one side plain); a wrong combination is a unit-mismatch.
// The rest of Sema reads declarations with these: frontend/SemaTargets.cpp (user targets,
// the catalogue lookup), SemaPlans.cpp (resolvePlan: a train/infer declaration's settings,
// budgets and command-line overrides into a Plan), SemaParallel.cpp (its target setting:
// devices and parallel degrees) and SemaCheckpoint.cpp (its checkpoint policy).
#include "frontend/Sema.h"
#include "support/Suggest.h"
#include "support/Format.h"

#include <cmath>

namespace tally {

ConstValue ConstValue::integer(int64_t v, llvm::SMRange r) {
  ConstValue c;
  c.kind = Number;
  c.number = static_cast<double>(v);
  c.isInteger = true;
  c.intValue = v;
  c.range = r;
  return c;
}

ConstValue ConstValue::real(double v, UnitDim d, llvm::SMRange r) {
  ConstValue c;
  c.kind = Number;
  c.number = v;
  c.dim = d;
  c.range = r;
  if (d == UnitDim::None && std::isfinite(v) && std::floor(v) == v && std::fabs(v) < 9.2e18) {
    c.isInteger = true;
    c.intValue = static_cast<int64_t>(v);
  }
  return c;
}

std::string ConstValue::describe() const {
  switch (kind) {
  case Invalid: return "an invalid value";
  case Number: return dim == UnitDim::None ? "a number" : tally::describe(dim).str();
  case Bool: return "a boolean";
  case Word: return "'" + text + "'";
  case String: return "a string";
  case Tuple: return "a tuple";
  case Record: return "a record";
  case Call: return "a call of '" + text + "'";
  case Device: return "a device count";
  }
  return "a value";
}

DiagBuilder Sema::suggest(DiagKind kind, llvm::SMRange at, std::string message,
                          llvm::StringRef name, const std::vector<std::string> &candidates) {
  std::string close = closestName(name, candidates);
  auto b = diags.report(kind, at.Start, message + didYouMean(close));
  b.range(at);
  if (!close.empty())
    b.fixit(at, close);
  return b;
}

void Sema::unknownChoice(llvm::SMRange r, llvm::StringRef what, llvm::StringRef plural,
                         llvm::StringRef name, const std::vector<std::string> &candidates) {
  suggest(DiagKind::UnknownName, r, "unknown " + what.str() + " '" + name.str() + "'", name,
          candidates)
      .note(llvm::SMLoc(), "the " + plural.str() + " are: " + choiceList(candidates));
}

void Sema::unknownName(llvm::SMRange r, llvm::StringRef what, llvm::StringRef name,
                       const std::vector<std::string> &candidates) {
  suggest(DiagKind::UnknownName, r, "unknown " + what.str() + " '" + name.str() + "'", name,
          candidates);
}

void Sema::addModule(std::unique_ptr<Module> m, Program &p) {
  bool isStd = p.modules.empty();
  for (auto &b : m->blocks) {
    b->fromStdlib = isStd;
    auto it = p.blocks.find(b->name);
    if (it != p.blocks.end() && !it->second->fromStdlib) {
      diags.report(DiagKind::DuplicateName, b->nameRange.Start,
                   "block '" + b->name + "' is defined twice")
          .range(b->nameRange)
          .note(it->second->nameRange.Start, "first defined here");
      continue;
    }
    p.blocks[b->name] = b.get();
  }
  for (auto &pl : m->plans) {
    auto it = p.plans.find(pl->name);
    if (it != p.plans.end()) {
      diags.report(DiagKind::DuplicateName, pl->nameRange.Start,
                   "plan '" + pl->name + "' is defined twice")
          .range(pl->nameRange)
          .note(it->second->nameRange.Start, "first defined here");
      continue;
    }
    p.plans[pl->name] = pl.get();
    p.planOrder.push_back(pl.get());
  }
  for (auto &t : m->targets) {
    auto it = p.targets.find(t->name);
    if (it != p.targets.end() || findTarget(t->name)) {
      auto b = diags.report(DiagKind::DuplicateName, t->nameRange.Start,
                            "target '" + t->name + "' is already defined" +
                                (it == p.targets.end() ? " in the built-in catalogue" : ""));
      b.range(t->nameRange);
      if (it != p.targets.end())
        b.note(it->second->nameRange.Start, "first defined here");
      continue;
    }
    p.targets[t->name] = t.get();
  }
  p.modules.push_back(std::move(m));
}

// ---- constant evaluation ------------------------------------------------------------------

/// The exact value of a plain integer literal, read from its source text (the AST keeps a
/// double, exact only below 2^53); nullopt when it does not fit in int64.
static std::optional<int64_t> exactInteger(const Expr &e) {
  // A command-line value (--batch) has no source range: its digits are its text.
  llvm::StringRef text = e.range.isValid()
                             ? llvm::StringRef(e.range.Start.getPointer(),
                                               e.range.End.getPointer() - e.range.Start.getPointer())
                             : llvm::StringRef(e.text);
  size_t first = text.find_first_of("0123456789"); // skips the '(' of a parenthesised literal
  if (first == llvm::StringRef::npos)
    return std::nullopt;
  std::string digits;
  for (char c : text.substr(first)) {
    if (c == '_')
      continue;
    if (c < '0' || c > '9')
      break;
    digits += c;
  }
  uint64_t u = 0;
  if (llvm::StringRef(digits).getAsInteger(10, u) || u > static_cast<uint64_t>(INT64_MAX))
    return std::nullopt;
  return static_cast<int64_t>(u);
}

ConstValue Sema::number(const Expr &e) {
  UnitInfo info{UnitDim::None, 1.0};
  if (!e.suffix.empty() && !e.unit.empty()) {
    diags.report(DiagKind::UnknownUnit, e.unitRange.Start,
                 "a number can carry one unit, not '" + e.suffix + "' and '" + e.unit + "'")
        .range(e.unitRange);
    return {};
  }
  if (!e.suffix.empty() || !e.unit.empty()) {
    bool glued = !e.suffix.empty();
    llvm::StringRef word = glued ? e.suffix : e.unit;
    auto found = glued ? lookupSuffix(word) : lookupUnit(word);
    if (!found) {
      std::string close = closestUnit(word);
      auto b = diags.report(DiagKind::UnknownUnit, e.unitRange.Start,
                            "unknown unit '" + word.str() + "'" + didYouMean(close));
      b.range(e.unitRange);
      if (!close.empty())
        b.fixit(e.unitRange, close);
      return {};
    }
    info = *found;
  }
  double v = e.number * info.scale;
  if (!std::isfinite(v)) {
    diags.report(DiagKind::Overflow, e.range.Start, "number is too large").range(e.range);
    return {};
  }
  if (e.isInteger && info.dim == UnitDim::None && info.scale == 1.0 && e.number >= 0x1p53) {
    // Past 2^53 a double is not exact: read the digits again from the source as int64.
    auto exact = exactInteger(e);
    if (!exact) {
      diags.report(DiagKind::Overflow, e.range.Start, "integer does not fit in 64 bits")
          .range(e.range);
      return {};
    }
    return ConstValue::integer(*exact, e.range);
  }
  return ConstValue::real(v, info.dim, e.range);
}

ConstValue Sema::arith(const Expr &e, const ConstValue &a, const ConstValue &b) {
  const std::string &op = e.text;
  if (a.kind != ConstValue::Number || b.kind != ConstValue::Number) {
    const ConstValue &bad = a.kind != ConstValue::Number ? a : b;
    diags.report(DiagKind::TypeMismatch, e.opLoc,
                 "operator '" + op + "' needs numbers, not " + bad.describe())
        .range(bad.range);
    return {};
  }
  UnitDim dim = UnitDim::None;
  if (op == "+" || op == "-") {
    if (a.dim != b.dim) {
      diags.report(DiagKind::UnitMismatch, e.opLoc,
                   "cannot " + std::string(op == "+" ? "add " : "subtract ") +
                       describe(b.dim).str() + (op == "+" ? " to " : " from ") +
                       describe(a.dim).str())
          .range(a.range)
          .range(b.range);
      return {};
    }
    dim = a.dim;
  } else if (op == "*") {
    if (a.dim != UnitDim::None && b.dim != UnitDim::None && a.dim != UnitDim::Ratio &&
        b.dim != UnitDim::Ratio) {
      diags.report(DiagKind::UnitMismatch, e.opLoc,
                   "cannot multiply " + describe(a.dim).str() + " by " + describe(b.dim).str())
          .range(a.range)
          .range(b.range);
      return {};
    }
    dim = a.dim == UnitDim::None || a.dim == UnitDim::Ratio ? b.dim : a.dim;
    if (a.dim == UnitDim::Ratio && b.dim == UnitDim::Ratio)
      dim = UnitDim::Ratio;
  } else if (op == "/") {
    if (b.number == 0) {
      const Expr *divisor = e.args.size() == 2 ? e.args[1].get() : nullptr;
      std::string what =
          divisor && divisor->kind == ExprKind::Name ? ": '" + divisor->text + "' is 0" : "";
      diags.report(DiagKind::DivisionByZero, e.opLoc, "division by zero" + what)
          .range(b.range);
      return {};
    }
    if (a.dim == b.dim)
      dim = UnitDim::None;
    else if (b.dim == UnitDim::None)
      dim = a.dim;
    else {
      diags.report(DiagKind::UnitMismatch, e.opLoc,
                   "cannot divide " + describe(a.dim).str() + " by " + describe(b.dim).str())
          .range(a.range)
          .range(b.range);
      return {};
    }
  } else {
    diags.report(DiagKind::TypeMismatch, e.opLoc,
                 "operator '" + op + "' is for tensors, not constants")
        .range(e.range);
    return {};
  }
  llvm::SMRange r = e.range;
  if (a.isInteger && b.isInteger && dim == UnitDim::None) {
    int64_t out = 0;
    bool overflow = false;
    if (op == "+")
      overflow = __builtin_add_overflow(a.intValue, b.intValue, &out);
    else if (op == "-")
      overflow = __builtin_sub_overflow(a.intValue, b.intValue, &out);
    else if (op == "*")
      overflow = __builtin_mul_overflow(a.intValue, b.intValue, &out);
    else if (b.intValue == -1) // INT64_MIN / -1 traps: negate with a check instead
      overflow = __builtin_sub_overflow(int64_t(0), a.intValue, &out);
    else if (a.intValue % b.intValue == 0)
      out = a.intValue / b.intValue;
    else
      return ConstValue::real(a.number / b.number, dim, r);
    if (overflow) {
      diags.report(DiagKind::Overflow, e.opLoc,
                   "integer overflow: " + std::to_string(a.intValue) + " " + op + " " +
                       std::to_string(b.intValue) + " does not fit in 64 bits")
          .range(r);
      return {};
    }
    return ConstValue::integer(out, r);
  }
  double v = op == "+" ? a.number + b.number
             : op == "-" ? a.number - b.number
             : op == "*" ? a.number * b.number
                         : a.number / b.number;
  if (!std::isfinite(v)) {
    diags.report(DiagKind::Overflow, e.opLoc, "result is too large").range(r);
    return {};
  }
  return ConstValue::real(v, dim, r);
}

ConstValue Sema::eval(const Expr &e, const ConstEnv &env) {
  switch (e.kind) {
  case ExprKind::Number:
    return number(e);
  case ExprKind::Name: {
    auto it = env.find(e.text);
    if (it != env.end()) {
      ConstValue v = it->second;
      v.range = e.range;
      return v;
    }
    ConstValue v;
    v.range = e.range;
    if (e.text == "true" || e.text == "false") {
      v.kind = ConstValue::Bool;
      v.boolean = e.text == "true";
    } else {
      v.kind = ConstValue::Word;
      v.text = e.text;
    }
    return v;
  }
  case ExprKind::String: {
    ConstValue v;
    v.kind = ConstValue::String;
    v.text = e.text;
    v.range = e.range;
    return v;
  }
  case ExprKind::Neg: {
    ConstValue v = eval(*e.args[0], env);
    if (v.kind == ConstValue::Invalid)
      return v;
    if (v.kind != ConstValue::Number) {
      diags.report(DiagKind::TypeMismatch, e.opLoc, "cannot negate " + v.describe())
          .range(e.range);
      return {};
    }
    if (v.isInteger && v.intValue != INT64_MIN)
      return ConstValue::integer(-v.intValue, e.range);
    return ConstValue::real(-v.number, v.dim, e.range);
  }
  case ExprKind::Binary: {
    ConstValue a = eval(*e.args[0], env);
    ConstValue b = eval(*e.args[1], env);
    if (a.kind == ConstValue::Invalid || b.kind == ConstValue::Invalid)
      return {};
    return arith(e, a, b);
  }
  case ExprKind::Tuple:
  case ExprKind::List:
  case ExprKind::Record:
  case ExprKind::Call: {
    ConstValue v;
    v.kind = e.kind == ExprKind::Record ? ConstValue::Record
             : e.kind == ExprKind::Call ? ConstValue::Call
                                        : ConstValue::Tuple;
    v.range = e.range;
    if (e.kind == ExprKind::Call) {
      if (e.lhs->kind != ExprKind::Name) {
        diags.report(DiagKind::TypeMismatch, e.range.Start, "expected the name of what is called")
            .range(e.lhs->range);
        return {};
      }
      v.text = e.lhs->text;
      v.nameRange = e.lhs->range;
    }
    for (size_t i = 0; i < e.args.size(); ++i) {
      ConstValue a = eval(*e.args[i], env);
      if (a.kind == ConstValue::Invalid)
        return {};
      v.elems.push_back(std::move(a));
      v.ranges.push_back(e.args[i]->range);
      bool named = i < e.argNames.size() && !e.argNames[i].empty() && i < e.argNameRanges.size();
      v.nameRanges.push_back(named ? e.argNameRanges[i] : e.args[i]->range);
      if (i < e.argNames.size())
        v.names.push_back(e.argNames[i]);
      if (i < e.placements.size())
        v.placements.push_back(e.placements[i]);
    }
    for (size_t i = 0; e.kind == ExprKind::Record && i < v.placements.size(); ++i)
      if (!v.placements[i].empty() && v.placements[i] != "host" && v.placements[i] != "device") {
        diags.report(DiagKind::InvalidValue, v.ranges[i].Start,
                     "a tensor class lives 'on host' or 'on device', not on '" +
                         v.placements[i] + "'")
            .range(v.ranges[i]);
        return {};
      }
    return v;
  }
  case ExprKind::Device: {
    ConstValue v;
    v.kind = ConstValue::Device;
    v.range = e.range;
    v.text = e.text;
    v.number = e.number;
    v.isInteger = e.isInteger && e.suffix.empty();
    if (v.isInteger && e.number >= 0x1p53) {
      // Past 2^53 the double is not exact (and 2^63 does not convert to int64 at all): the
      // count is read again from its digits, and one past INT64_MAX is an overflow.
      std::optional<int64_t> exact = exactInteger(e);
      if (!exact) {
        diags.report(DiagKind::Overflow, e.range.Start, "the device count does not fit in 64 bits")
            .range(e.range);
        return {};
      }
      v.intValue = *exact;
    } else if (v.isInteger) {
      v.intValue = static_cast<int64_t>(e.number); // exact: below 2^53
    }
    v.nameRange = {e.opLoc, llvm::SMLoc::getFromPointer(e.opLoc.getPointer() + e.text.size())};
    if (e.lhs) {
      ConstValue rec = eval(*e.lhs, env);
      if (rec.kind == ConstValue::Invalid)
        return {};
      v.elems.push_back(std::move(rec));
    }
    return v;
  }
  case ExprKind::Member:
  case ExprKind::Index:
  case ExprKind::Slice:
  case ExprKind::Repeat:
    diags.report(DiagKind::TypeMismatch, e.range.Start, "expected a constant here")
        .range(e.range);
    return {};
  }
  return {};
}

std::optional<int64_t> Sema::positiveInt(const ConstValue &v, const char *what) {
  if (v.kind != ConstValue::Number || v.dim != UnitDim::None) {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 std::string(what) + " must be a plain number, not " + v.describe())
        .range(v.range);
    return std::nullopt;
  }
  if (!v.isInteger) {
    diags.report(DiagKind::NotInteger, v.range.Start,
                 std::string(what) + " must be a whole number, but it is " +
                     significant(v.number))
        .range(v.range);
    return std::nullopt;
  }
  if (v.intValue <= 0) {
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 std::string(what) + " must be positive, but it is " +
                     std::to_string(v.intValue))
        .range(v.range);
    return std::nullopt;
  }
  return v.intValue;
}

} // namespace tally
