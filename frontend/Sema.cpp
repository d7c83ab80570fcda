// Semantic analysis: declarations by name, constant evaluation with units, and plan
// resolution.
//
// 1. addModule records each block, plan and target by name (duplicates are errors).
// 2. eval folds a constant expression: integers stay exact int64 (checked for overflow),
//    anything else is a double; units combine by dimension (+/- need equal dimensions,
//    * and / need one side plain); a wrong combination is a unit-mismatch.
// 3. resolvePlan evaluates each setting of a train/infer declaration, checks its kind and
//    unit, applies command-line overrides, and fills a Plan (precision policy, optimizer,
//    devices and parallel degrees, budgets).
#include "frontend/Sema.h"
#include "support/Suggest.h"
#include "support/Format.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
  llvm::StringRef text(e.range.Start.getPointer(),
                       e.range.End.getPointer() - e.range.Start.getPointer());
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

// ---- targets ------------------------------------------------------------------------------

/// `matmul_curve { fp32 = [(FLOPs, efficiency), ...], bf16 = [...] }` (written by `tally
/// calibrate`): per dtype, points with strictly increasing FLOPs per call and efficiencies in
/// (0, 1].
bool Sema::matmulCurves(const ConstValue &rec, Target &t) {
  bool ok = true;
  for (size_t i = 0; i < rec.elems.size(); ++i) {
    std::optional<Dtype> dt = parseDtype(rec.names[i]);
    if (!dt) {
      diags.report(DiagKind::UnknownDtype, rec.nameRanges[i].Start,
                   "unknown dtype '" + rec.names[i] + "' in matmul_curve")
          .range(rec.nameRanges[i]);
      ok = false;
      continue;
    }
    MatmulCurve curve;
    curve.dtype = *dt;
    if (!curvePoints(rec.elems[i], rec.ranges[i], "a matmul curve", curve.points)) {
      ok = false;
      continue;
    }
    t.matmulCurves.push_back(std::move(curve));
  }
  return ok;
}

bool Sema::curvePoints(const ConstValue &list, llvm::SMRange r, const char *what,
                       std::vector<CurvePoint> &points) {
  bool good = list.kind == ConstValue::Tuple && !list.elems.empty();
  for (size_t j = 0; good && j < list.elems.size(); ++j) {
    const ConstValue &p = list.elems[j];
    good = p.kind == ConstValue::Tuple && p.elems.size() == 2 &&
           p.elems[0].kind == ConstValue::Number && p.elems[1].kind == ConstValue::Number &&
           (p.elems[0].dim == UnitDim::None || p.elems[0].dim == UnitDim::Flops) &&
           (p.elems[1].dim == UnitDim::None || p.elems[1].dim == UnitDim::Ratio);
    if (!good)
      break;
    CurvePoint pt{p.elems[0].number, p.elems[1].number};
    good = pt.flops > 0 && pt.efficiency > 0 && pt.efficiency <= 1 &&
           (points.empty() || pt.flops > points.back().flops);
    points.push_back(pt);
  }
  if (!good)
    diags.report(DiagKind::InvalidValue, r.Start,
                 std::string(what) + " is a list of (FLOPs per call, efficiency) pairs with the "
                 "FLOPs increasing and each efficiency in (0, 1]")
        .range(r);
  return good;
}

std::optional<Target> Sema::userTarget(const TargetDecl &d) {
  Target t;
  t.name = d.name;
  t.description = "user-defined target " + d.name;
  t.source = "declared in the input file";
  ConstEnv env;
  bool ok = true;
  auto need = [&](const ConstValue &v, UnitDim dim, const std::string &key) -> double {
    if (v.kind != ConstValue::Number || v.dim != dim) {
      diags.report(DiagKind::UnitMismatch, v.range.Start,
                   "'" + key + "' must be " + describe(dim).str() + ", not " + v.describe())
          .range(v.range);
      ok = false;
      return 0;
    }
    if (v.number <= 0) {
      diags.report(DiagKind::InvalidValue, v.range.Start, "'" + key + "' must be positive")
          .range(v.range);
      ok = false;
    }
    return v.number;
  };
  for (const SettingAST &s : d.settings) {
    ConstValue v = eval(*s.value, env);
    if (v.kind == ConstValue::Invalid) {
      ok = false;
      continue;
    }
    if (s.key == "memory")
      t.memoryBytes = need(v, UnitDim::Bytes, s.key);
    else if (s.key == "bandwidth")
      t.bandwidth = need(v, UnitDim::ByteRate, s.key);
    else if (s.key == "host_link")
      t.hostLink = need(v, UnitDim::ByteRate, s.key);
    else if (s.key == "interconnect")
      t.interconnect = need(v, UnitDim::ByteRate, s.key);
    else if (s.key == "host_memory")
      t.hostMemoryBytes = need(v, UnitDim::Bytes, s.key);
    else if (s.key == "network")
      t.network = need(v, UnitDim::ByteRate, s.key);
    else if (s.key == "cuda_context")
      t.contextBytes = need(v, UnitDim::Bytes, s.key);
    else if (s.key == "comm_buffer")
      t.commBufferBytes = need(v, UnitDim::Bytes, s.key);
    else if (s.key == "allocator_reserve") {
      bool fraction = v.kind == ConstValue::Number &&
                      (v.dim == UnitDim::None || v.dim == UnitDim::Ratio) && v.number >= 0 &&
                      v.number < 1;
      if (!fraction) {
        diags.report(DiagKind::InvalidValue, v.range.Start,
                     "'allocator_reserve' is a fraction in [0, 1), such as 0.05 or 5%")
            .range(v.range);
        ok = false;
      }
      t.allocatorReserve = v.number;
    } else if (s.key == "gpus_per_node") {
      if (auto n = positiveInt(v, "'gpus_per_node'"))
        t.gpusPerNode = *n;
      else
        ok = false;
    } else if (s.key == "link_latency")
      t.linkLatency = need(v, UnitDim::Time, s.key);
    else if (s.key == "network_latency")
      t.networkLatency = need(v, UnitDim::Time, s.key);
    else if (s.key == "kernel_overhead") // written by `tally calibrate` (docs/targets.md)
      t.kernelOverhead = need(v, UnitDim::Time, s.key);
    else if (s.key == "kernel_launch")
      t.kernelLaunch = need(v, UnitDim::Time, s.key);
    else if (s.key == "transcendental")
      t.transcendentalTime = need(v, UnitDim::Time, s.key);
    else if (s.key == "cache")
      t.cacheBytes = need(v, UnitDim::Bytes, s.key);
    else if (s.key == "threads") { // the OpenMP threads a calibration measured with
      if (auto n = positiveInt(v, "'threads'"))
        t.threads = *n;
      else
        ok = false;
    } else if (s.key == "attention_curve") {
      if (!curvePoints(v, v.range, "an attention curve", t.attentionCurve))
        ok = false;
    } else if (s.key == "cache_bandwidth")
      t.cacheBandwidth = need(v, UnitDim::ByteRate, s.key);
    else if (s.key == "peak" && v.kind == ConstValue::Record) {
      for (size_t i = 0; i < v.elems.size(); ++i) {
        auto dt = parseDtype(v.names[i]);
        double rate = need(v.elems[i], UnitDim::FlopRate, "peak " + v.names[i]);
        if (!dt) {
          diags.report(DiagKind::UnknownDtype, v.nameRanges[i].Start,
                       "unknown dtype '" + v.names[i] + "' in peak rates")
              .range(v.nameRanges[i]);
          ok = false;
          continue;
        }
        switch (*dt) {
        case Dtype::F64: t.peakF64 = rate; break;
        case Dtype::F32: t.peakF32 = rate; break;
        case Dtype::TF32: t.peakTF32 = rate; break;
        case Dtype::F16: t.peakF16 = rate; break;
        case Dtype::BF16: t.peakBF16 = rate; break;
        case Dtype::FP8E4M3: case Dtype::FP8E5M2: t.peakFP8 = rate; break;
        case Dtype::I8: t.peakINT8 = rate; break;
        default: break;
        }
      }
    } else if (s.key == "efficiency" && v.kind == ConstValue::Record) {
      for (size_t i = 0; i < v.elems.size(); ++i) {
        const ConstValue &e = v.elems[i];
        double f = e.number;
        if (e.kind != ConstValue::Number || (e.dim != UnitDim::None && e.dim != UnitDim::Ratio) ||
            f <= 0 || f > 1) {
          diags.report(DiagKind::InvalidValue, v.ranges[i].Start,
                       "an efficiency is a fraction in (0, 1], such as 0.7 or 70%")
              .range(v.ranges[i]);
          ok = false;
          continue;
        }
        const std::string &k = v.names[i];
        if (k == "matmul") t.efficiency.matmul = f;
        else if (k == "attention") t.efficiency.attention = f;
        else if (k == "elementwise") t.efficiency.elementwise = f;
        else if (k == "communication") t.efficiency.communication = f;
        else if (k == "host_link") t.efficiency.hostLink = f;
        else {
          unknownName(v.nameRanges[i], "efficiency class", k,
                      {"matmul", "attention", "elementwise", "communication", "host_link"});
          ok = false;
        }
      }
    } else if (s.key == "matmul_curve" && v.kind == ConstValue::Record) {
      ok &= matmulCurves(v, t);
    } else {
      suggest(DiagKind::UnknownSetting, s.keyRange, "unknown target setting '" + s.key + "'",
              s.key,
              {"memory", "bandwidth", "peak", "host_link", "interconnect", "host_memory",
               "efficiency", "network", "gpus_per_node", "link_latency", "network_latency",
               "matmul_curve", "cuda_context", "comm_buffer", "allocator_reserve",
               "kernel_overhead", "kernel_launch", "transcendental", "cache", "cache_bandwidth",
               "threads", "attention_curve"});
      ok = false;
    }
  }
  if (!ok)
    return std::nullopt;
  const char *missing = t.memoryBytes == 0 ? "memory" : t.bandwidth == 0 ? "bandwidth" : nullptr;
  if (!missing && t.peakF32 == 0 && t.peakBF16 == 0 && t.peakF16 == 0)
    missing = "peak";
  if (missing) {
    diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                 "target '" + d.name + "' does not say its " + missing)
        .range(d.nameRange);
    return std::nullopt;
  }
  return t;
}

std::optional<Target> Sema::resolveTarget(const Program &p, llvm::StringRef name,
                                          llvm::SMRange r) {
  auto it = p.targets.find(name);
  if (it != p.targets.end())
    return userTarget(*it->second);
  if (const Target *t = findTarget(name))
    return *t;
  // `host` (this machine, from `tally calibrate`) and target files come from the loader that
  // the tally binary installs (ir/Target.h).
  if (isExternalTargetName(name)) {
    std::string error;
    if (std::optional<Target> t = loadExternalTarget(name, error))
      return t;
    diags.report(DiagKind::UnknownTarget, r.Start,
                 "cannot load target '" + name.str() + "': " + error)
        .range(r);
    return std::nullopt;
  }
  std::vector<std::string> names;
  for (const Target &t : targetCatalogue())
    names.push_back(t.name);
  for (const auto &kv : p.targets)
    names.push_back(kv.getKey().str());
  suggest(DiagKind::UnknownTarget, r, "unknown target '" + name.str() + "'", name, names)
      .note(llvm::SMLoc(), "`tally targets` lists the built-in catalogue");
  return std::nullopt;
}

// ---- plans ----------------------------------------------------------------------------------

std::optional<Dtype> Sema::dtypeSetting(const ConstValue &v, const char *what) {
  if (v.kind == ConstValue::Word) {
    if (auto d = parseDtype(v.text))
      return d;
  }
  diags.report(DiagKind::UnknownDtype, v.range.Start,
               std::string(what) + " must be a dtype such as fp32, bf16 or fp16, not " +
                   v.describe())
      .range(v.range);
  return std::nullopt;
}

bool Sema::precision(const ConstValue &v, PrecisionPolicy &out) {
  out.range = v.range;
  if (v.kind == ConstValue::Word) {
    auto preset = precisionPreset(v.text);
    if (!preset) {
      unknownName(v.range, "precision", v.text, precisionPresetNames());
      return false;
    }
    out = *preset;
    out.range = v.range;
    return true;
  }
  if (v.kind != ConstValue::Record) {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 "precision is a preset (fp32, bf16, mixed_bf16, ...) or a record such as "
                 "{ params = bf16, optimizer = fp32 }, not " + v.describe())
        .range(v.range);
    return false;
  }
  out.preset = "custom";
  out.master = Dtype::Invalid;
  bool ok = true, sawActivations = false, sawGrads = false;
  for (size_t i = 0; i < v.elems.size(); ++i) {
    const std::string &k = v.names[i];
    const ConstValue &e = v.elems[i];
    bool host = v.placements[i] == "host";
    if (k == "loss_scaling") {
      if (e.kind != ConstValue::Bool) {
        diags.report(DiagKind::TypeMismatch, e.range.Start, "loss_scaling is true or false")
            .range(e.range);
        ok = false;
      }
      out.lossScaling = e.boolean;
      continue;
    }
    if (k == "master" && e.kind == ConstValue::Word && e.text == "none") {
      out.master = Dtype::Invalid;
      continue;
    }
    Dtype *slot = k == "params" ? &out.params
                  : k == "grads" ? &out.grads
                  : k == "activations" ? &out.activations
                  : k == "master" ? &out.master
                  : k == "optimizer" ? &out.optimizer
                                     : nullptr;
    if (!slot) {
      unknownName(v.nameRanges[i], "tensor class", k,
                  {"params", "grads", "activations", "master", "optimizer", "loss_scaling"});
      ok = false;
      continue;
    }
    auto d = dtypeSetting(e, ("'" + k + "'").c_str());
    if (!d) {
      ok = false;
      continue;
    }
    if (!isFloat(*d)) {
      diags.report(DiagKind::UnknownDtype, e.range.Start,
                   "'" + k + "' must be a floating-point dtype (fp32, tf32, bf16, fp16, fp8_e4m3, "
                   "fp8_e5m2), not " + nameOf(*d).str())
          .range(e.range);
      ok = false;
      continue;
    }
    *slot = *d;
    sawActivations |= k == "activations";
    sawGrads |= k == "grads";
    if (k == "params") out.paramsOnHost = host;
    if (k == "grads") out.gradsOnHost = host;
    if (k == "master") out.masterOnHost = host;
    if (k == "optimizer") out.optimizerOnHost = host;
    if (k == "activations" && host) {
      diags.report(DiagKind::InvalidValue, v.ranges[i].Start,
                   "activations cannot live on the host in this version")
          .range(v.ranges[i]);
      ok = false;
    }
  }
  if (!sawActivations)
    out.activations = out.params;
  if (!sawGrads)
    out.grads = out.params;
  return ok;
}

bool Sema::optimizer(const ConstValue &v, OptimizerSpec &out) {
  std::string name = v.kind == ConstValue::Call || v.kind == ConstValue::Word ? v.text : "";
  auto preset = optimizerPreset(name);
  if (!preset) {
    if (name.empty())
      diags.report(DiagKind::TypeMismatch, v.range.Start,
                   "optimizer must be SGD, AdaGrad, RMSprop, Adam, AdamW or Lion, not " +
                       v.describe())
          .range(v.range);
    else
      unknownName(v.nameRange.isValid() ? v.nameRange : v.range, "optimizer", name,
                  optimizerNames());
    return false;
  }
  out = *preset;
  out.range = v.range;
  bool ok = true;
  for (size_t i = 0; i < v.elems.size(); ++i) {
    const std::string &k = i < v.names.size() ? v.names[i] : "";
    const ConstValue &e = v.elems[i];
    llvm::SMRange r = v.ranges[i];
    std::string key = k.empty() && i == 0 ? "lr" : k;
    if (key == "betas") {
      if (e.kind != ConstValue::Tuple || e.elems.size() != 2 ||
          e.elems[0].kind != ConstValue::Number || e.elems[1].kind != ConstValue::Number) {
        diags.report(DiagKind::TypeMismatch, r.Start, "betas is a pair such as (0.9, 0.95)")
            .range(r);
        ok = false;
        continue;
      }
      out.beta1 = e.elems[0].number;
      out.beta2 = e.elems[1].number;
      continue;
    }
    double *slot = key == "lr" ? &out.lr
                   : key == "momentum" ? &out.momentum
                   : key == "eps" ? &out.eps
                   : key == "weight_decay" ? &out.weightDecay
                                           : nullptr;
    if (!slot) {
      std::string close = closestName(key, {"lr", "momentum", "betas", "eps", "weight_decay"});
      llvm::SMRange at = i < v.nameRanges.size() ? v.nameRanges[i] : r;
      auto d = diags.report(DiagKind::UnknownArgument, at.Start,
                            key.empty() ? "only the learning rate may be given without a name"
                                        : "unknown optimizer argument '" + key + "'" +
                                              didYouMean(close));
      d.range(at);
      if (!key.empty() && !close.empty())
        d.fixit(at, close);
      ok = false;
      continue;
    }
    if (e.kind != ConstValue::Number || e.dim != UnitDim::None) {
      diags.report(DiagKind::TypeMismatch, r.Start,
                   "'" + key + "' must be a plain number, not " + e.describe())
          .range(r);
      ok = false;
      continue;
    }
    *slot = e.number;
    if (key == "eps")
      out.epsRange = r;
  }
  out.states = optimizerStates(out);
  return ok;
}

bool Sema::parallel(const Program &p, const ConstValue &v, Plan &plan) {
  plan.parallel.range = v.range;
  std::string targetName;
  int64_t devices = 1;
  if (v.kind == ConstValue::Word || v.kind == ConstValue::String) {
    targetName = v.text;
  } else if (v.kind == ConstValue::Device) {
    targetName = v.text;
    if (!v.isInteger || v.number < 1) {
      diags.report(DiagKind::NotInteger, v.range.Start,
                   "the device count must be a positive whole number, but it is " +
                       significant(v.number))
          .range(v.range);
      return false;
    }
    devices = v.intValue;
  } else {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 "target is a target name such as H100_SXM, or N x NAME { data = N }, not " +
                     v.describe())
        .range(v.range);
    return false;
  }
  auto t = resolveTarget(p, targetName, v.nameRange.isValid() ? v.nameRange : v.range);
  if (!t)
    return false;
  plan.target = *t;
  Parallelism &par = plan.parallel;
  par.devices = devices;
  bool dataGiven = false;
  llvm::SMRange expertRange = v.range;
  if (v.kind == ConstValue::Device && !v.elems.empty()) {
    const ConstValue &rec = v.elems[0];
    for (size_t i = 0; i < rec.elems.size(); ++i) {
      const std::string &k = rec.names[i];
      const ConstValue &e = rec.elems[i];
      if (k == "zero") {
        if (e.kind != ConstValue::Number || !e.isInteger || e.intValue < 0 || e.intValue > 3) {
          diags.report(DiagKind::InvalidValue, rec.ranges[i].Start,
                       "zero is a ZeRO stage: 0, 1, 2 or 3")
              .range(rec.ranges[i]);
          return false;
        }
        par.zero = static_cast<int>(e.intValue);
        continue;
      }
      // Topology and layout settings (docs/time.md §4, "Nodes and collectives").
      if (k == "sequence_parallel" || k == "overlap" || k == "tensor_overlap" || k == "compiled") {
        if (e.kind != ConstValue::Bool) {
          diags.report(DiagKind::TypeMismatch, rec.ranges[i].Start, k + " is true or false")
              .range(rec.ranges[i]);
          return false;
        }
        bool &flag = k == "overlap"          ? par.overlap
                     : k == "tensor_overlap" ? par.tensorOverlap
                     : k == "compiled"       ? par.compiled
                                             : par.sequenceParallel;
        flag = e.boolean;
        par.overlapGiven |= k == "overlap";
        continue;
      }
      if (k == "nvls" || k == "sharp") { // NCCL's NVLS and CollNet algorithms
        if (e.kind != ConstValue::Bool) {
          diags.report(DiagKind::TypeMismatch, rec.ranges[i].Start, k + " is true or false")
              .range(rec.ranges[i]);
          return false;
        }
        (k == "nvls" ? plan.target.nvlinkSwitch : plan.target.collnet) = e.boolean;
        continue;
      }
      if (k == "stack") {
        static const std::vector<std::string> stacks = {"megatron", "deepspeed", "fsdp", "fsdp2",
                                                        "ddp"};
        std::string s = e.kind == ConstValue::Word || e.kind == ConstValue::String ? e.text : "";
        if (std::find(stacks.begin(), stacks.end(), s) == stacks.end()) {
          std::string close = closestName(s, stacks);
          diags.report(DiagKind::InvalidValue, rec.ranges[i].Start,
                       "stack is the framework that runs the step: megatron, deepspeed, fsdp, "
                       "fsdp2 or ddp" +
                           (s.empty() ? std::string() : ", not '" + s + "'" + didYouMean(close)))
              .range(rec.ranges[i]);
          return false;
        }
        par.stack = s;
        continue;
      }
      if (k == "bucket") {
        if (e.kind != ConstValue::Number || e.dim != UnitDim::Bytes || e.number <= 0) {
          diags.report(DiagKind::InvalidValue, rec.ranges[i].Start,
                       "bucket is the gradient bytes each data-parallel reduction carries, "
                       "such as 25 MiB")
              .range(rec.ranges[i]);
          return false;
        }
        par.bucketBytes = e.number;
        continue;
      }
      if (k == "network" || k == "link" || k == "link_latency" || k == "network_latency") {
        bool time = k == "link_latency" || k == "network_latency";
        UnitDim want = time ? UnitDim::Time : UnitDim::ByteRate;
        if (e.kind != ConstValue::Number || e.dim != want || e.number <= 0) {
          diags.report(DiagKind::InvalidValue, rec.ranges[i].Start,
                       k + " must be a positive " +
                           (time ? std::string("time such as 5 us")
                                 : std::string("bandwidth such as 400 Gb/s or 25 GB/s")))
              .range(rec.ranges[i]);
          return false;
        }
        (k == "network" ? plan.target.network
         : k == "link" ? plan.target.interconnect
         : k == "link_latency" ? plan.target.linkLatency
                               : plan.target.networkLatency) = e.number;
        continue;
      }
      if (k == "kernel_launch") { // 0 is allowed: launches that cost nothing (CUDA graphs)
        if (e.kind != ConstValue::Number || e.dim != UnitDim::Time || e.number < 0) {
          diags.report(DiagKind::InvalidValue, rec.ranges[i].Start,
                       "kernel_launch is the time one kernel launch takes, such as 3.8 us, or "
                       "0 us under CUDA graphs")
              .range(rec.ranges[i]);
          return false;
        }
        plan.target.kernelLaunch = e.number;
        continue;
      }
      if (k == "order") {
        std::string o = e.kind == ConstValue::Word || e.kind == ConstValue::String ? e.text : "";
        std::string sorted = o;
        std::sort(sorted.begin(), sorted.end());
        if (sorted != "dpt" && sorted != "cdpt") {
          diags.report(DiagKind::InvalidValue, rec.ranges[i].Start,
                       "order places ranks innermost first: the letters t (tensor), p "
                       "(pipeline) and d (data) once each, and c (context) if you place it, "
                       "such as tpd or tcpd")
              .range(rec.ranges[i]);
          return false;
        }
        if (sorted == "dpt") // the context ranks go right outside the tensor group
          o.insert(o.find('t') + 1, "c");
        par.order = o;
        continue;
      }
      if (k == "gpus_per_node" || k == "interleave") {
        auto n = positiveInt(e, ("'" + k + "'").c_str());
        if (!n)
          return false;
        (k == "interleave" ? par.interleave : plan.target.gpusPerNode) = *n;
        continue;
      }
      int64_t *slot = k == "data" ? &par.data
                      : k == "tensor" ? &par.tensor
                      : k == "pipeline" ? &par.pipeline
                      : k == "context" ? &par.context
                      : k == "expert" ? &par.expert
                                        : nullptr;
      if (!slot) {
        unknownName(rec.nameRanges[i], "parallelism setting", k,
                    {"data", "tensor", "pipeline", "context", "expert", "zero", "interleave",
                     "sequence_parallel", "overlap", "tensor_overlap", "order", "gpus_per_node",
                     "link", "network", "link_latency", "network_latency", "kernel_launch",
                     "stack", "bucket", "nvls", "sharp", "compiled"});
        return false;
      }
      auto n = positiveInt(e, ("'" + k + "'").c_str());
      if (!n)
        return false;
      *slot = *n;
      dataGiven |= k == "data";
      if (k == "expert")
        expertRange = rec.ranges[i];
    }
  }
  if (par.interleave > 1 && par.pipeline <= 1) {
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "interleave = " + std::to_string(par.interleave) +
                     " splits each pipeline stage into virtual stages, but pipeline = 1")
        .range(v.range);
    return false;
  }
  // Degrees are positive and at most the device count's magnitude each; a product past int64
  // cannot match the device count, so it is reported as a mismatch rather than computed.
  int64_t modelParallel = 0;
  bool fits = !llvm::MulOverflow(par.tensor, par.pipeline, modelParallel) &&
              !llvm::MulOverflow(modelParallel, par.context, modelParallel);
  std::string cp = par.context > 1 ? " × context" : "";
  std::string cpValue = par.context > 1 ? " × " + std::to_string(par.context) : "";
  if (!dataGiven) {
    if (!fits || devices % modelParallel != 0) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   std::to_string(devices) + " devices cannot be split into tensor × pipeline" +
                       cp + " = " + (fits ? std::to_string(modelParallel) : "more than that"))
          .range(v.range);
      return false;
    }
    par.data = devices / modelParallel;
  }
  int64_t product = 0;
  bool over = !fits || llvm::MulOverflow(par.data, modelParallel, product);
  if (over || product != devices) {
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "data × tensor × pipeline" + cp + " = " + std::to_string(par.data) + " × " +
                     std::to_string(par.tensor) + " × " + std::to_string(par.pipeline) +
                     cpValue + " = " +
                     (over ? std::string("more") : std::to_string(product)) + ", but there are " +
                     std::to_string(devices) + " devices")
        .range(v.range);
    return false;
  }
  // Expert parallelism (Megatron, DeepSpeed-MoE): the expert group is carved out of the
  // data-parallel ranks, so it adds no devices and must divide the data degree.
  if (par.data % par.expert != 0) {
    diags.report(DiagKind::InvalidValue, expertRange.Start,
                 "expert = " + std::to_string(par.expert) + " must divide data = " +
                     std::to_string(par.data) +
                     ": the expert-parallel group is carved out of the data-parallel ranks")
        .range(expertRange);
    return false;
  }
  return true;
}

const BlockDecl *Sema::planModel(const Program &p, const PlanDecl &d, ConstValue &call) {
  for (const SettingAST &s : d.settings) {
    if (s.key != "model")
      continue;
    ConstEnv env;
    call = eval(*s.value, env);
    if (call.kind == ConstValue::Invalid)
      return nullptr;
    if (call.kind != ConstValue::Call && call.kind != ConstValue::Word) {
      diags.report(DiagKind::TypeMismatch, call.range.Start,
                   "model is a model name, optionally with arguments: GPT2(layers = 24)")
          .range(call.range);
      return nullptr;
    }
    auto it = p.blocks.find(call.text);
    if (it == p.blocks.end()) {
      std::vector<std::string> names;
      for (const auto &kv : p.blocks)
        names.push_back(kv.getKey().str());
      unknownName(call.nameRange.isValid() ? call.nameRange : call.range, "model", call.text,
                  names);
      return nullptr;
    }
    return it->second;
  }
  diags.report(DiagKind::MissingSetting, d.nameRange.Start,
               "plan '" + d.name + "' does not say which model it runs (for example "
               "model = GPT2())")
      .range(d.nameRange);
  return nullptr;
}

/// One policy word or call: none, full, auto, sqrt, recompute_all, selective, every(k) (a call
/// in a file, the word "every(k)" on the command line). Stored as written, every(k) with k a
/// positive integer.
std::optional<std::string> Sema::singleCheckpointPolicy(const ConstValue &v) {
  if (v.kind == ConstValue::Call && v.text == "every") {
    if (v.elems.size() != 1 || (!v.names.empty() && !v.names[0].empty())) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "every(k) takes one positional argument: the copies per segment")
          .range(v.range);
      return std::nullopt;
    }
    auto k = positiveInt(v.elems[0], "the segment length of every(k)");
    if (!k)
      return std::nullopt;
    return "every(" + std::to_string(*k) + ")";
  }
  if (v.kind == ConstValue::Word && v.text.rfind("every(", 0) == 0) {
    std::string digits = v.text.substr(6);
    bool closed = !digits.empty() && digits.back() == ')';
    if (closed)
      digits.pop_back();
    bool allDigits = !digits.empty() && digits.size() <= 18 &&
                     std::all_of(digits.begin(), digits.end(),
                                 [](char c) { return c >= '0' && c <= '9'; });
    int64_t k = allDigits ? std::stoll(digits) : 0;
    if (!closed || !allDigits || k <= 0) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "checkpoint every(k) needs a positive whole number k of copies per "
                   "segment, not '" + v.text + "'")
          .range(v.range);
      return std::nullopt;
    }
    return "every(" + std::to_string(k) + ")";
  }
  if (v.kind == ConstValue::Word && llvm::StringRef(v.text).startswith("keep"))
    return keepPolicy(v.text, v.range);
  static const std::vector<std::string> policies = {"none",          "full",      "auto",
                                                    "sqrt",          "every",     "recompute_all",
                                                    "selective",     "selective_wide", "keep"};
  if (v.kind != ConstValue::Word ||
      std::find(policies.begin(), policies.end(), v.text) == policies.end() || v.text == "every") {
    if (v.kind == ConstValue::Word && v.text == "every")
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "checkpoint every needs its segment length: every(k)")
          .range(v.range);
    else if (v.kind == ConstValue::Word)
      unknownName(v.range, "checkpoint policy", v.text, policies);
    else
      diags.report(DiagKind::TypeMismatch, v.range.Start,
                   "checkpoint is none, full, every(k), sqrt, recompute_all, selective, "
                   "selective_wide, a block policy + selective, keep [paths], or auto")
          .range(v.range);
    return std::nullopt;
  }
  return v.text;
}

/// Two policies joined by `+`: a block policy (full, every(k), sqrt) with selective (or
/// selective_wide), stored as "full + selective" whichever order they were written in; none +
/// selective is selective.
std::optional<std::string> Sema::combinedCheckpointPolicy(const std::string &a,
                                                          const std::string &b,
                                                          llvm::SMRange r) {
  auto isSel = [](const std::string &p) { return p == "selective" || p == "selective_wide"; };
  bool aSel = isSel(a), bSel = isSel(b);
  const std::string &other = aSel ? b : a;
  const std::string &sel = aSel ? a : b;
  if (aSel == bSel || other == "auto" || other == "recompute_all") {
    std::string why =
        aSel && bSel ? "selective is given twice"
        : !aSel && !bSel
            ? "two block policies cannot be combined ('" + a + "' and '" + b + "')"
        : other == "auto"
            ? "auto already weighs selective recompute against the block policies"
            : "recompute_all keeps nothing inside the blocks, so selective has nothing to add";
    diags.report(DiagKind::InvalidValue, r.Start,
                 "checkpoint combines a block policy (full, every(k), sqrt) with selective, "
                 "as in full + selective: " + why)
        .range(r);
    return std::nullopt;
  }
  return other == "none" ? sel : other + " + " + sel;
}

namespace {

/// The path an expression names in a keep list: `h`, `h[0]`, `h[4].mlp`, `lnf`; "" when it is
/// not such a path.
std::string pathOf(const Expr &e) {
  if (e.kind == ExprKind::Name)
    return e.text;
  if (e.kind == ExprKind::Member && e.lhs) {
    std::string base = pathOf(*e.lhs);
    return base.empty() ? "" : base + "." + e.text;
  }
  if (e.kind == ExprKind::Index && e.lhs && e.args.size() == 1 && e.args[0] &&
      e.args[0]->kind == ExprKind::Number && e.args[0]->isInteger && e.args[0]->suffix.empty() &&
      e.args[0]->unit.empty() && e.args[0]->number >= 0 && e.args[0]->number < 1e15) {
    std::string base = pathOf(*e.lhs);
    return base.empty() ? "" : base + "[" + std::to_string(static_cast<int64_t>(e.args[0]->number)) + "]";
  }
  return "";
}

/// Whether `p` is a path as pathOf writes it: names joined by '.', each with optional [n].
bool isPath(llvm::StringRef p) {
  if (p.empty())
    return false;
  llvm::SmallVector<llvm::StringRef, 8> parts;
  p.split(parts, '.');
  for (llvm::StringRef part : parts) {
    llvm::StringRef name = part.take_until([](char c) { return c == '['; });
    llvm::StringRef rest = part.drop_front(name.size());
    if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') ||
        !llvm::all_of(name, [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
      return false;
    while (!rest.empty()) {
      if (!rest.consume_front("["))
        return false;
      llvm::StringRef digits = rest.take_until([](char c) { return c == ']'; });
      rest = rest.drop_front(digits.size());
      if (digits.empty() || digits.size() > 15 || !llvm::all_of(digits, llvm::isDigit) ||
          !rest.consume_front("]"))
        return false;
    }
  }
  return true;
}

std::string keepText(const std::vector<std::string> &paths) {
  return "keep [" + llvm::join(paths, ", ") + "]";
}

} // namespace

/// `keep [h[0], h[4].mlp]`: the blocks or ops that keep their activations; every other
/// repeat copy (or the rest of it) is recomputed (Activations.cpp checks the paths exist).
std::optional<std::string> Sema::keepPolicy(const Expr &e) {
  std::vector<std::string> paths;
  for (const ExprPtr &arg : e.args) {
    std::string path = arg ? pathOf(*arg) : "";
    if (path.empty()) {
      llvm::SMRange r = arg ? arg->range : e.range;
      diags.report(DiagKind::InvalidValue, r.Start,
                   "a keep list names blocks or ops by path, like h[0] or h[4].mlp")
          .range(r);
      return std::nullopt;
    }
    paths.push_back(path);
  }
  if (paths.empty()) {
    diags.report(DiagKind::InvalidValue, e.range.Start,
                 "keep [] names nothing to keep: write checkpoint = full to recompute every block")
        .range(e.range);
    return std::nullopt;
  }
  return keepText(paths);
}

/// The same from the command line: "keep [h[0], h[4].mlp]" as one word.
std::optional<std::string> Sema::keepPolicy(const std::string &text, llvm::SMRange r) {
  llvm::StringRef rest = llvm::StringRef(text).trim();
  bool ok = rest.consume_front("keep");
  rest = rest.trim();
  ok = ok && rest.consume_front("[") && rest.consume_back("]");
  std::vector<std::string> paths;
  if (ok) {
    llvm::SmallVector<llvm::StringRef, 8> parts;
    rest.split(parts, ',');
    for (llvm::StringRef part : parts) {
      ok = ok && isPath(part.trim());
      paths.push_back(part.trim().str());
    }
  }
  if (!ok || paths.empty()) {
    diags.report(DiagKind::InvalidValue, r.Start,
                 "checkpoint keep needs a list of block or op paths, like keep [h[0], h[4].mlp], "
                 "not '" + text + "'")
        .range(r);
    return std::nullopt;
  }
  return keepText(paths);
}

std::optional<std::string> Sema::checkpointPolicy(const Expr &e, ConstEnv &env) {
  if (e.kind == ExprKind::Index && e.lhs && e.lhs->kind == ExprKind::Name && e.lhs->text == "keep")
    return keepPolicy(e);
  if (e.kind == ExprKind::Binary && e.text == "+" && e.args.size() == 2) {
    auto a = checkpointPolicy(*e.args[0], env);
    auto b = checkpointPolicy(*e.args[1], env);
    if (!a || !b)
      return std::nullopt;
    if (a->find('+') != std::string::npos || b->find('+') != std::string::npos) {
      diags.report(DiagKind::InvalidValue, e.range.Start,
                   "checkpoint combines at most one block policy with selective")
          .range(e.range);
      return std::nullopt;
    }
    return combinedCheckpointPolicy(*a, *b, e.range);
  }
  ConstValue v = eval(e, env);
  if (v.kind == ConstValue::Invalid)
    return std::nullopt;
  // The command line gives one word: "full+selective" or "full + selective".
  if (v.kind == ConstValue::Word && v.text.find('+') != std::string::npos &&
      !llvm::StringRef(v.text).trim().endswith("]")) {
    size_t plus = v.text.find('+');
    auto trimmed = [&](std::string w) {
      ConstValue part = v;
      part.text = llvm::StringRef(w).trim().str();
      return part;
    };
    ConstValue left = trimmed(v.text.substr(0, plus)), right = trimmed(v.text.substr(plus + 1));
    if (right.text.find('+') != std::string::npos) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   "checkpoint combines at most one block policy with selective, not '" +
                       v.text + "'")
          .range(v.range);
      return std::nullopt;
    }
    auto a = singleCheckpointPolicy(left), b = singleCheckpointPolicy(right);
    if (!a || !b)
      return std::nullopt;
    return combinedCheckpointPolicy(*a, *b, v.range);
  }
  return singleCheckpointPolicy(v);
}

std::optional<Plan> Sema::resolvePlan(const Program &p, const PlanDecl &d,
                                      const PlanOverrides &o) {
  Plan plan;
  plan.isTrain = d.isTrain;
  plan.name = d.name;
  plan.range = d.range;
  bool ok = true;
  bool sawTarget = false, sawPrecision = false, sawBatch = false;
  Dtype gradDtype = Dtype::Invalid; // `grad_dtype`, checked against the final precision below
  llvm::SMRange gradDtypeRange;
  static const std::vector<std::string> trainKeys = {
      "model", "batch", "seq", "micro_batch", "tokens", "optimizer", "precision", "checkpoint",
      "target", "grad_dtype"};
  static const std::vector<std::string> inferKeys = {"model", "batch", "prompt", "generate",
                                                     "precision", "target"};
  const auto &keys = d.isTrain ? trainKeys : inferKeys;
  ConstEnv env;
  // Command-line overrides of plain settings become settings of their own, read after the
  // file's: the same code validates both (so --checkpoint=foo and --batch 0 are errors, as in a
  // file). They have no source location, so their diagnostics print as "tally: error: ...".
  std::vector<SettingAST> cli;
  auto addCli = [&](const char *key, ExprKind k, const std::string &text, double number) {
    SettingAST s;
    s.key = key;
    s.value = std::make_unique<Expr>(k, llvm::SMRange());
    s.value->text = text;
    s.value->number = number;
    s.value->isInteger = k == ExprKind::Number;
    cli.push_back(std::move(s));
  };
  if (!o.checkpoint.empty())
    addCli("checkpoint", ExprKind::Name, o.checkpoint, 0);
  if (o.batch)
    addCli("batch", ExprKind::Number, std::to_string(*o.batch), double(*o.batch));
  if (o.microBatch)
    addCli("micro_batch", ExprKind::Number, std::to_string(*o.microBatch), double(*o.microBatch));
  std::vector<const SettingAST *> settings;
  for (const SettingAST &s : d.settings)
    settings.push_back(&s);
  for (const SettingAST &s : cli)
    settings.push_back(&s);
  for (const SettingAST *sp : settings) {
    const SettingAST &s = *sp;
    bool fromCli = sp >= cli.data() && sp < cli.data() + cli.size();
    if (fromCli && std::find(keys.begin(), keys.end(), s.key) == keys.end())
      continue; // e.g. --checkpoint on an infer plan: nothing to override
    if (!fromCli && plan.settingRanges.count(s.key)) {
      diags.report(DiagKind::DuplicateName, s.keyRange.Start,
                   "setting '" + s.key + "' is given twice")
          .range(s.keyRange)
          .note(plan.settingRanges[s.key].Start, "first given here");
      ok = false;
      continue;
    }
    // An override has no place in the file: diagnostics about it carry no location.
    plan.settingRanges[s.key] = fromCli ? llvm::SMRange() : s.range;
    if (std::find(keys.begin(), keys.end(), s.key) == keys.end()) {
      suggest(DiagKind::UnknownSetting, s.keyRange,
              "unknown setting '" + s.key + "' in " + (d.isTrain ? "a train" : "an infer") +
                  " plan",
              s.key, keys);
      ok = false;
      continue;
    }
    if (s.key == "model") {
      ConstValue call;
      const BlockDecl *b = planModel(p, d, call);
      if (!b)
        ok = false;
      else
        plan.modelName = b->name;
      continue;
    }
    if (s.key == "checkpoint") {
      if (auto policy = checkpointPolicy(*s.value, env))
        plan.checkpoint = *policy;
      else
        ok = false;
      continue;
    }
    ConstValue v = eval(*s.value, env);
    if (v.kind == ConstValue::Invalid) {
      ok = false;
      continue;
    }
    if (s.key == "batch" || s.key == "seq" || s.key == "micro_batch" || s.key == "prompt" ||
        s.key == "generate") {
      auto n = positiveInt(v, ("'" + s.key + "'").c_str());
      if (!n) {
        ok = false;
        continue;
      }
      if (s.key == "batch") plan.batch = *n, sawBatch = true;
      if (s.key == "seq") plan.seq = *n;
      if (s.key == "micro_batch") plan.microBatch = *n, plan.microBatchGiven = true;
      if (s.key == "prompt") plan.prompt = *n;
      if (s.key == "generate") plan.generate = *n;
    } else if (s.key == "tokens") {
      if (v.kind != ConstValue::Number || v.dim != UnitDim::None || v.number <= 0) {
        diags.report(DiagKind::UnitMismatch, v.range.Start,
                     "tokens is a positive count such as 10B, not " + v.describe())
            .range(v.range);
        ok = false;
        continue;
      }
      plan.tokens = v.number;
    } else if (s.key == "optimizer") {
      ok &= optimizer(v, plan.optimizer);
    } else if (s.key == "precision") {
      if (o.precision.empty())
        ok &= precision(v, plan.precision);
      sawPrecision = true;
    } else if (s.key == "grad_dtype") {
      std::optional<Dtype> d = dtypeSetting(v, "'grad_dtype'");
      gradDtypeRange = v.range;
      if (d && !isFloat(*d)) {
        diags.report(DiagKind::UnknownDtype, v.range.Start,
                     "'grad_dtype' must be a floating-point dtype such as fp32")
            .range(v.range);
        d.reset();
      }
      ok &= d.has_value();
      gradDtype = d.value_or(Dtype::Invalid);
    } else if (s.key == "target") {
      sawTarget = true;
      if (o.target.empty())
        ok &= parallel(p, v, plan);
    }
  }
  for (const BudgetItemAST &b : d.budgets) {
    BudgetSpec spec;
    spec.range = b.range;
    spec.atMost = b.op[0] == '<';
    UnitDim want;
    if (b.metric == "memory per device" || b.metric == "memory") {
      spec.metric = BudgetMetric::MemoryPerDevice;
      want = UnitDim::Bytes;
    } else if (b.metric == "step time") {
      spec.metric = BudgetMetric::StepTime;
      want = UnitDim::Time;
    } else if (b.metric == "mfu") {
      spec.metric = BudgetMetric::Mfu;
      want = UnitDim::Ratio;
    } else if (b.metric == "run time") {
      spec.metric = BudgetMetric::RunTime;
      want = UnitDim::Time;
    } else {
      std::string close =
          closestName(b.metric, {"memory per device", "step time", "mfu", "run time"});
      diags.report(DiagKind::UnknownSetting, b.range.Start,
                   "unknown budget '" + b.metric + "'" +
                       didYouMean(close))
          .range(b.range);
      ok = false;
      continue;
    }
    ConstValue v = eval(*b.value, env);
    if (v.kind == ConstValue::Invalid) {
      ok = false;
      continue;
    }
    bool fits = v.kind == ConstValue::Number &&
                (v.dim == want || (want == UnitDim::Ratio && v.dim == UnitDim::None &&
                                   v.number > 0 && v.number <= 1));
    if (!fits) {
      diags.report(DiagKind::UnitMismatch, v.range.Start,
                   "budget '" + b.metric + "' is " + describe(want).str() + ", not " +
                       v.describe())
          .range(v.range);
      ok = false;
      continue;
    }
    spec.value = v.number;
    plan.budgets.push_back(spec);
  }
  // Command-line overrides replace what the file says.
  if (!o.precision.empty()) {
    ConstValue v;
    v.kind = ConstValue::Word;
    v.text = o.precision;
    ok &= precision(v, plan.precision);
    sawPrecision = true;
  }
  if (!o.target.empty()) {
    ConstValue v;
    llvm::StringRef spec(o.target);
    auto x = spec.find('x');
    int64_t n = 0;
    if (x != llvm::StringRef::npos && !spec.substr(0, x).trim().getAsInteger(10, n)) {
      v.kind = ConstValue::Device;
      v.number = static_cast<double>(n);
      v.intValue = n;
      v.isInteger = true;
      v.text = spec.substr(x + 1).trim().str();
    } else {
      v.kind = ConstValue::Word;
      v.text = o.target;
    }
    ok &= parallel(p, v, plan);
    sawTarget = true;
  }
  if (!ok)
    return std::nullopt;
  if (plan.modelName.empty()) {
    ConstValue call;
    planModel(p, d, call);
    return std::nullopt;
  }
  if (!sawTarget) {
    diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                 "plan '" + d.name + "' does not say its target (for example target = H100_SXM)")
        .range(d.nameRange);
    return std::nullopt;
  }
  // On the calibrated host, every rank has its part of the one machine (docs/targets.md).
  plan.target.shareHost(plan.parallel.devices, o.hostThreads);
  plan.fuseKernels = o.fuseKernels || plan.parallel.compiled;
  plan.cudaStep = o.cudaStep;
  if (!sawPrecision)
    plan.precision.preset = "fp32";
  if (gradDtype != Dtype::Invalid && bytesOf(gradDtype) < bytesOf(plan.precision.grads)) {
    diags.report(DiagKind::InvalidValue, gradDtypeRange.Start,
                 "grad_dtype " + nameOf(gradDtype).str() +
                     " is narrower than the gradients (" + nameOf(plan.precision.grads).str() +
                     "): an accumulation buffer must hold at least their precision")
        .range(gradDtypeRange);
    return std::nullopt;
  }
  plan.precision.gradAccum = gradDtype;
  if (!sawBatch && d.isTrain) {
    diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                 "plan '" + d.name + "' does not say its batch size")
        .range(d.nameRange);
    return std::nullopt;
  }
  if (!d.isTrain && plan.prompt == 0) {
    diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                 "infer plan '" + d.name + "' does not say its prompt length")
        .range(d.nameRange);
    return std::nullopt;
  }
  if (!d.isTrain)
    plan.seq = plan.prompt;
  if (!plan.microBatchGiven)
    plan.microBatch = d.isTrain ? std::max<int64_t>(1, plan.batch / plan.parallel.data)
                                : plan.batch;
  // Sequences per accumulation step, micro_batch × data-parallel devices, is int64 arithmetic
  // downstream (the accumulation check); a device count near 2^63 must not wrap it.
  int64_t perStep = 0;
  if (d.isTrain && __builtin_mul_overflow(plan.microBatch,
                                          std::max<int64_t>(1, plan.parallel.data), &perStep)) {
    auto at = plan.settingRanges.find("target");
    llvm::SMRange r = at != plan.settingRanges.end() ? at->second : d.nameRange;
    diags.report(DiagKind::Overflow, r.Start,
                 "micro_batch × data-parallel devices = " + std::to_string(plan.microBatch) +
                     " × " + std::to_string(plan.parallel.data) + " does not fit in 64 bits")
        .range(r);
    return std::nullopt;
  }
  return plan;
}

} // namespace tally
