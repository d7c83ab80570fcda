// Lowering, step 3: evaluation. A forward function runs like an interpreter over symbolic
// tensors and constants (frontend/Lower.cpp has the steps).
//
// A call of a submodule evaluates its forward with a fresh scope (its inputs checked against
// their declared types); a repeated block's copies run in order, each output feeding the
// next. Names resolve to locals, then the instance's members and constants, then `batch`,
// `seq`, `true`, `false`. Constant arithmetic is Sema's; tensor arithmetic, negation and
// `x[...]` slices append ops; a call of a primitive goes to frontend/LowerPrimitives.cpp.
#include "frontend/Lowerer.h"

#include <algorithm>
#include <functional>
#include <tuple>

namespace tally {
namespace lowering {

namespace {

/// Whether an op reading `b` instead of `a` computes the same way: type, shape (sizes and
/// names), layout, role, whether a gradient flows, and whether it is a view (a view of it is
/// then a view of its storage).
bool sameKind(const Tensor &a, const Tensor &b) {
  if (a.dtype != b.dtype || a.role != b.role || a.requiresGrad != b.requiresGrad ||
      (a.viewOf == kNone) != (b.viewOf == kNone) ||
      a.shape.size() != b.shape.size() || a.layout.offset() != b.layout.offset() ||
      a.layout.strides() != b.layout.strides())
    return false;
  for (size_t i = 0; i < a.shape.size(); ++i)
    if (a.shape[i].size != b.shape[i].size || a.shape[i].sym != b.shape[i].sym)
      return false;
  return true;
}

} // namespace

/// Appends copy `m`'s forward call by copying the ops that `from`'s call appended: the same
/// block with inputs and parameters of the same types computes the same ops, so evaluating
/// it again would only repeat the interpreter's work (most of the lowering's time in a deep
/// model). Each tensor is mapped: one the call made to its copy, an input to `m`'s input, a
/// parameter of `from`'s copy to the same parameter of `m`'s; ops get `m`'s instances, the
/// names evaluation would give them ("#n" counted per instance as op1 does) and fresh random
/// streams, in order. Nothing is appended, and nullopt returned, when any of that does not
/// hold (another block, other input types, an op reading a tensor from elsewhere), and the
/// copy is then evaluated. The graph is the one evaluation gives, byte for byte (lit
/// lower-repeat-copies; every example's and lit input's IR and reports were compared).
std::optional<Value> Lowerer::cloneCall(const CallRecord &from, ModuleObj &m,
                                        const std::vector<Value> &args) {
  const ModuleObj &pm = *from.module;
  if (pm.decl != m.decl || pm.forward != m.forward || args.size() != from.args.size())
    return std::nullopt;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind != Value::Tensor || from.args[i].kind != Value::Tensor ||
        !sameKind(g.tensors[from.args[i].tensor], g.tensors[args[i].tensor]))
      return std::nullopt;
    for (size_t j = 0; j < i; ++j)
      if ((from.args[i].tensor == from.args[j].tensor) != (args[i].tensor == args[j].tensor))
        return std::nullopt;
  }
  uint32_t fromRoot = pm.instance, fromEnd = subtreeEnd(g, fromRoot);
  uint32_t toRoot = m.instance, toEnd = subtreeEnd(g, toRoot);
  if (fromEnd - fromRoot != toEnd - toRoot || fromRoot == toRoot)
    return std::nullopt;
  size_t fp0, fp1, tp0, tp1; // not structured bindings: C++17 lambdas cannot capture those
  std::tie(fp0, fp1) = paramsIn(g, fromRoot, fromEnd);
  std::tie(tp0, tp1) = paramsIn(g, toRoot, toEnd);
  if (fp1 - fp0 != tp1 - tp0)
    return std::nullopt;
  for (size_t k = 0; k < fp1 - fp0; ++k) {
    const ParamInfo &a = g.params[fp0 + k], &b = g.params[tp0 + k];
    if (a.trainable != b.trainable || a.instance - fromRoot != b.instance - toRoot ||
        !sameKind(g.tensors[a.tensor], g.tensors[b.tensor]))
      return std::nullopt;
  }
  // A copy that would pass the op or tensor bound is evaluated instead, which says so at the op.
  if (g.ops.size() + (from.opsEnd - from.opsBegin) > kMaxOps ||
      g.tensors.size() + (from.tensorsEnd - from.tensorsBegin) > kMaxTensors)
    return std::nullopt;
  TensorId begin = static_cast<TensorId>(g.tensors.size());
  auto map = [&](TensorId t) -> TensorId {
    if (t >= from.tensorsBegin && t < from.tensorsEnd)
      return begin + (t - from.tensorsBegin);
    for (size_t i = 0; i < args.size(); ++i)
      if (t == from.args[i].tensor)
        return args[i].tensor;
    const Tensor &x = g.tensors[t];
    if (x.role == TensorRole::Param && x.param >= fp0 && x.param < fp1)
      return g.params[tp0 + (x.param - fp0)].tensor;
    return kNone;
  };
  auto mapBase = [&](TensorId t) -> TensorId {
    if (t == kNone)
      return kNone;
    if (TensorId r = map(t); r != kNone)
      return r;
    for (size_t i = 0; i < args.size(); ++i)
      if (t == g.tensors[from.args[i].tensor].viewOf)
        return g.tensors[args[i].tensor].viewOf;
    return kNone;
  };
  // Check everything before appending anything.
  for (TensorId t = from.tensorsBegin; t < from.tensorsEnd; ++t)
    if (g.tensors[t].viewOf != kNone && mapBase(g.tensors[t].viewOf) == kNone)
      return std::nullopt;
  for (OpId o = from.opsBegin; o < from.opsEnd; ++o) {
    const Op &op = g.ops[o];
    if (op.instance < fromRoot || op.instance >= fromEnd)
      return std::nullopt;
    for (TensorId t : op.inputs)
      if (map(t) == kNone)
        return std::nullopt;
    for (TensorId t : op.outputs)
      if (t < from.tensorsBegin || t >= from.tensorsEnd)
        return std::nullopt;
  }
  std::function<bool(const Value &)> mappable = [&](const Value &v) {
    if (v.kind == Value::Tensor)
      return map(v.tensor) != kNone;
    if (v.kind == Value::Tuple)
      return std::all_of(v.elems.begin(), v.elems.end(), mappable);
    return v.kind == Value::Const;
  };
  if (!mappable(from.result))
    return std::nullopt;

  for (TensorId t = from.tensorsBegin; t < from.tensorsEnd; ++t) {
    Tensor x = g.tensors[t];
    x.viewOf = mapBase(x.viewOf);
    x.producer = kNone;
    g.addTensor(std::move(x));
  }
  for (OpId o = from.opsBegin; o < from.opsEnd; ++o) {
    Op op = g.ops[o];
    for (TensorId &t : op.inputs)
      t = map(t);
    for (TensorId &t : op.outputs)
      t = map(t);
    op.instance = toRoot + (op.instance - fromRoot);
    op.ordinal = nextOrdinal(op.instance, op.kind);
    if (takesRandomStream(op)) // each copy draws its own stream: its own attributes
      op.attrs.change([&](OpAttrs &a) { a.stream = g.randomStreams++; });
    g.addOp(std::move(op));
  }
  for (size_t l = from.localsBegin; l < from.localsEnd; ++l)
    if (TensorId t = map(g.locals[l].tensor); t != kNone)
      g.locals.push_back({t, g.locals[l].name});
  std::function<Value(const Value &)> remap = [&](const Value &v) {
    Value r = v;
    if (v.kind == Value::Tensor)
      r.tensor = map(v.tensor);
    for (Value &e : r.elems)
      e = remap(e);
    return r;
  };
  return remap(from.result);
}

Value Lowerer::callModule(ModuleObj &lazy, std::vector<Value> args, llvm::SMRange where) {
  ModuleObj &m = materialize(lazy); // evaluation reads its constants and members
  if (!m.forward) {
    diags.report(DiagKind::TypeMismatch, where.Start,
                 "block '" + m.decl->name + "' has no forward function to call")
        .range(where)
        .note(m.decl->nameRange.Start, "'" + m.decl->name + "' is declared here");
    fail();
    return {};
  }
  const ForwardAST &f = *m.forward;
  if (args.size() != f.params.size()) {
    diags.report(DiagKind::WrongArgCount, where.Start,
                 "'" + m.decl->name + "' takes " + std::to_string(f.params.size()) +
                     " input" + (f.params.size() == 1 ? "" : "s") + ", but " +
                     std::to_string(args.size()) + (args.size() == 1 ? " was" : " were") +
                     " given")
        .range(where)
        .note(f.range.Start, "its forward function is declared here");
    fail();
    return {};
  }
  if (++callDepth > kMaxInstanceDepth * 2) {
    diags.report(DiagKind::NestingTooDeep, where.Start, "calls are nested too deeply")
        .range(where);
    fail();
    return {};
  }
  Scope scope{&m, {}};
  for (size_t i = 0; i < args.size(); ++i) {
    if (f.params[i].type && args[i].kind == Value::Tensor &&
        !checkInputType(m, f.params[i], args[i], where)) {
      --callDepth;
      fail();
      return {};
    }
    scope.locals[f.params[i].name] = args[i];
  }
  sites.push_back({where, m.decl, m.path, true});
  std::optional<Value> result = statements(f.body, scope);
  sites.pop_back();
  --callDepth;
  if (failed)
    return {};
  if (!result) {
    diags.report(DiagKind::MissingReturn, f.range.Start,
                 "the forward function of '" + m.decl->name + "' does not return a value")
        .range(llvm::SMRange(f.range.Start, f.range.Start));
    fail();
    return {};
  }
  return *result;
}

bool Lowerer::checkInputType(ModuleObj &m, const ForwardParam &p, const Value &arg,
                             llvm::SMRange where) {
  Shape want;
  Dtype dtype = g.tensors[arg.tensor].dtype;
  if (!shapeOf(*p.type, m.consts, true, want, dtype))
    return false;
  const Shape &have = g.tensors[arg.tensor].shape;
  bool same = have.size() == want.size();
  for (size_t i = 0; same && i < have.size(); ++i)
    same = have[i].size == want[i].size;
  if (!same) {
    diags.report(DiagKind::ShapeMismatch, where.Start,
                 "input '" + p.name + "' of '" + m.decl->name + "' must be " +
                     g.formatShape(want) + ", but it is " + g.formatShape(have))
        .range(where)
        .note(p.range.Start, "declared here");
    return false;
  }
  return true;
}

/// Runs statements; returns the returned value, or nullopt if the end is reached.
std::optional<Value> Lowerer::statements(const std::vector<StmtPtr> &body, Scope &scope) {
  for (const StmtPtr &s : body) {
    if (failed)
      return Value{};
    switch (s->kind) {
    case StmtKind::Return:
      return eval(*s->value, scope);
    case StmtKind::If: {
      auto cond = condition(*s->value, scope.module->consts);
      if (!cond) {
        fail();
        return Value{};
      }
      auto r = statements(*cond ? s->thenBody : s->elseBody, scope);
      if (r)
        return r;
      break;
    }
    case StmtKind::Assign: {
      Value v = eval(*s->value, scope);
      if (v.kind == Value::Invalid) {
        fail();
        return Value{};
      }
      if (s->targets.size() == 1) {
        scope.locals[s->targets[0]] = v;
        if (v.kind == Value::Tensor && !s->targetRanges.empty())
          g.locals.push_back({v.tensor, s->targetRanges[0]});
        break;
      }
      if (v.kind != Value::Tuple || v.elems.size() != s->targets.size()) {
        diags.report(DiagKind::WrongArgCount, s->range.Start,
                     "cannot unpack " +
                         (v.kind == Value::Tuple ? std::to_string(v.elems.size()) + " values"
                                                 : v.describe()) +
                         " into " + std::to_string(s->targets.size()) + " names")
            .range(s->value->range);
        fail();
        return Value{};
      }
      for (size_t i = 0; i < s->targets.size(); ++i) {
        scope.locals[s->targets[i]] = v.elems[i];
        if (v.elems[i].kind == Value::Tensor && i < s->targetRanges.size())
          g.locals.push_back({v.elems[i].tensor, s->targetRanges[i]});
      }
      break;
    }
    }
  }
  return std::nullopt;
}

std::vector<std::string> Lowerer::visibleNames(const Scope &scope) {
  std::vector<std::string> names;
  for (const auto &kv : scope.locals)
    names.push_back(kv.getKey().str());
  for (const auto &kv : scope.module->members)
    names.push_back(kv.getKey().str());
  for (const auto &kv : scope.module->consts)
    names.push_back(kv.getKey().str());
  for (const std::string &p : primitiveNames())
    names.push_back(p);
  names.push_back("batch");
  names.push_back("seq");
  return names;
}

Value Lowerer::lookup(const Expr &e, Scope &scope) {
  const std::string &n = e.text;
  auto set = [&](Value v) {
    v.range = e.range;
    if (v.kind == Value::Const)
      v.c.range = e.range;
    return v;
  };
  if (auto it = scope.locals.find(n); it != scope.locals.end())
    return set(it->second);
  if (auto it = scope.module->members.find(n); it != scope.module->members.end())
    return set(it->second);
  if (auto it = scope.module->consts.find(n); it != scope.module->consts.end())
    return set(Value::ofConst(it->second));
  if (n == "batch")
    return set(Value::ofConst(ConstValue::integer(key.microBatch, e.range)));
  if (n == "seq" && !seqGiven(e.range)) {
    failed = true;
    return set(Value());
  }
  if (n == "seq")
    return set(Value::ofConst(ConstValue::integer(key.seq, e.range)));
  if (n == "true" || n == "false") {
    ConstValue c;
    c.kind = ConstValue::Bool;
    c.boolean = n == "true";
    c.range = e.range;
    return Value::ofConst(c);
  }
  if (findPrimitive(n)) {
    diags.report(DiagKind::TypeMismatch, e.range.Start,
                 "'" + n + "' is a primitive op; call it, as in " + n + "(x)")
        .range(e.range);
    return {};
  }
  if (program.blocks.count(n)) {
    diags.report(DiagKind::TypeMismatch, e.range.Start,
                 "block '" + n + "' must be declared as a member before the forward "
                 "function uses it, as in `" + llvmLower(n) + " = " + n + "(...)`")
        .range(e.range);
    return {};
  }
  sema.unknownName(e.range, "name", n, visibleNames(scope));
  return {};
}

std::string Lowerer::llvmLower(const std::string &s) {
  std::string out = s;
  for (char &c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

Value Lowerer::eval(const Expr &e, Scope &scope) {
  if (failed)
    return {};
  switch (e.kind) {
  case ExprKind::Number:
  case ExprKind::String: {
    ConstEnv none;
    ConstValue v = sema.eval(e, none);
    return v.kind == ConstValue::Invalid ? Value{} : Value::ofConst(v);
  }
  case ExprKind::Name:
    return lookup(e, scope);
  case ExprKind::Neg: {
    Value v = eval(*e.args[0], scope);
    if (v.kind == Value::Tensor)
      return op1(OpKind::Neg, {v.tensor}, OpAttrs(), e, scope);
    if (v.kind == Value::Const && v.c.kind == ConstValue::Number)
      return Value::ofConst(v.c.isInteger && v.c.intValue != INT64_MIN
                                ? ConstValue::integer(-v.c.intValue, e.range)
                                : ConstValue::real(-v.c.number, v.c.dim, e.range));
    if (v.kind != Value::Invalid)
      diags.report(DiagKind::TypeMismatch, e.range.Start, "cannot negate " + v.describe())
          .range(e.range);
    return {};
  }
  case ExprKind::Binary:
    return binary(e, scope);
  case ExprKind::Call:
    return call(e, scope);
  case ExprKind::Member: {
    Value base = eval(*e.lhs, scope);
    if (base.kind == Value::Invalid)
      return {};
    if (base.kind != Value::Module) {
      diags.report(DiagKind::TypeMismatch, e.opLoc,
                   "'." + e.text + "' needs a block on its left, not " + base.describe())
          .range(e.lhs->range);
      return {};
    }
    ModuleObj &m = materialize(*base.module);
    if (auto it = m.members.find(e.text); it != m.members.end()) {
      Value v = it->second;
      v.range = e.range;
      return v;
    }
    if (auto it = m.consts.find(e.text); it != m.consts.end())
      return Value::ofConst(it->second);
    std::vector<std::string> names;
    for (const auto &kv : m.members)
      names.push_back(kv.getKey().str());
    for (const auto &kv : m.consts)
      names.push_back(kv.getKey().str());
    llvm::SMRange at(e.opLoc, e.range.End);
    sema.suggest(DiagKind::UnknownName, at,
                 "'" + m.decl->name + "' has no member '" + e.text + "'", e.text, names);
    return {};
  }
  case ExprKind::Index: {
    Value base = eval(*e.lhs, scope);
    if (base.kind == Value::Tensor)
      return slice(e, base, scope);
    if (base.kind != Value::Invalid && (e.args.size() != 1 || e.args[0]->kind == ExprKind::Slice)) {
      diags.report(DiagKind::TypeMismatch, e.args[0]->range.Start,
                   "only tensors take slices or several subscripts; " + base.describe() +
                       " takes one index")
          .range(e.args[0]->range);
      return {};
    }
    Value index = base.kind == Value::Invalid ? Value() : eval(*e.args[0], scope);
    if (base.kind == Value::Invalid || index.kind == Value::Invalid)
      return {};
    size_t count = base.kind == Value::List ? base.list.size()
                   : base.kind == Value::Tuple ? base.elems.size()
                                               : 0;
    if (count == 0) {
      diags.report(DiagKind::TypeMismatch, e.opLoc,
                   "only repeated blocks and tuples can be indexed, not " + base.describe())
          .range(e.lhs->range);
      return {};
    }
    if (index.kind != Value::Const || !index.c.isInteger || index.c.dim != UnitDim::None) {
      diags.report(DiagKind::TypeMismatch, e.args[0]->range.Start,
                   "an index must be a whole number")
          .range(e.args[0]->range);
      return {};
    }
    int64_t i = index.c.intValue < 0 ? index.c.intValue + static_cast<int64_t>(count)
                                     : index.c.intValue;
    if (i < 0 || i >= static_cast<int64_t>(count)) {
      diags.report(DiagKind::InvalidValue, e.args[0]->range.Start,
                   "index " + std::to_string(index.c.intValue) + " is out of range for " +
                       std::to_string(count) + " elements")
          .range(e.args[0]->range);
      return {};
    }
    if (base.kind == Value::Tuple)
      return base.elems[static_cast<size_t>(i)];
    Value v;
    v.kind = Value::Module;
    v.module = base.list[static_cast<size_t>(i)];
    v.range = e.range;
    return v;
  }
  case ExprKind::Tuple:
  case ExprKind::List: {
    Value v;
    v.kind = Value::Tuple;
    v.range = e.range;
    for (const ExprPtr &a : e.args) {
      Value x = eval(*a, scope);
      if (x.kind == Value::Invalid)
        return {};
      v.elems.push_back(std::move(x));
    }
    return v;
  }
  case ExprKind::Record:
  case ExprKind::Repeat:
  case ExprKind::Device:
  case ExprKind::Slice:
    diags.report(DiagKind::TypeMismatch, e.range.Start,
                 "this kind of expression is not allowed in a forward function")
        .range(e.range);
    return {};
  }
  return {};
}

/// `x[:, 0]`, `x[:, 1:]`, `x[..., lo:hi:step]` on a tensor: a `slice` view (no copy). Each
/// subscript takes one axis from the left; an integer index drops its axis; bounds may be
/// negative (from the end), a slice's bounds are clamped to the axis as in Python, and an
/// index out of range or an empty slice is an error at the subscript.
Value Lowerer::slice(const Expr &e, const Value &base, Scope &scope) {
  const Shape shape = g.tensors[base.tensor].shape;
  if (e.args.size() > shape.size()) {
    diags.report(DiagKind::InvalidValue, e.args[shape.size()]->range.Start,
                 std::to_string(e.args.size()) + " subscripts for a tensor of rank " +
                     std::to_string(shape.size()) + ", " + g.formatShape(shape))
        .range(e.args[shape.size()]->range);
    return {};
  }
  OpAttrs attrs;
  auto whole = [&](const Expr *x, const char *what, std::optional<int64_t> &out) {
    if (!x)
      return true;
    Value v = eval(*x, scope);
    if (v.kind == Value::Invalid)
      return false;
    if (v.kind != Value::Const || v.c.kind != ConstValue::Number || !v.c.isInteger ||
        v.c.dim != UnitDim::None) {
      diags.report(DiagKind::NotInteger, x->range.Start,
                   std::string("a tensor ") + what + " must be a whole number, not " + v.describe())
          .range(x->range);
      return false;
    }
    out = v.c.intValue;
    return true;
  };
  for (size_t i = 0; i < e.args.size(); ++i) {
    const Expr &sub = *e.args[i];
    int64_t n = shape[i].size;
    SliceDim d;
    if (sub.kind != ExprKind::Slice) {
      std::optional<int64_t> idx;
      if (!whole(&sub, "index", idx))
        return {};
      int64_t k = *idx < 0 ? *idx + n : *idx;
      if (k < 0 || k >= n) {
        diags.report(DiagKind::InvalidValue, sub.range.Start,
                     "index " + std::to_string(*idx) + " is out of range for dimension " +
                         std::to_string(i) + " of " + g.formatShape(shape) + " (size " +
                         std::to_string(n) + ")")
            .range(sub.range);
        return {};
      }
      d.start = k;
      d.count = 1;
      d.drop = true;
      attrs.slices.push_back(d);
      continue;
    }
    std::optional<int64_t> lo, hi, step;
    if (!whole(sub.args[0].get(), "slice bound", lo) ||
        !whole(sub.args[1].get(), "slice bound", hi) || !whole(sub.args[2].get(), "slice step", step))
      return {};
    if (step && *step <= 0) {
      diags.report(DiagKind::InvalidValue, sub.args[2]->range.Start,
                   "a slice step must be 1 or more, not " + std::to_string(*step))
          .range(sub.args[2]->range);
      return {};
    }
    auto clamp = [n](std::optional<int64_t> v, int64_t dflt) {
      if (!v)
        return dflt;
      int64_t k = *v < 0 ? std::max<int64_t>(*v, -n) + n : *v;
      return std::min(k, n);
    };
    d.start = clamp(lo, 0);
    int64_t stop = clamp(hi, n);
    d.step = std::min(step.value_or(1), n); // a longer step takes one element all the same
    if (stop <= d.start) {
      diags.report(DiagKind::InvalidValue, sub.range.Start,
                   "slice " + std::to_string(d.start) + ":" + std::to_string(stop) +
                       " of dimension " + std::to_string(i) + " of " + g.formatShape(shape) +
                       " (size " + std::to_string(n) + ") is empty")
          .range(sub.range);
      return {};
    }
    d.count = 1 + (stop - d.start - 1) / d.step;
    attrs.slices.push_back(d);
  }
  return op1(OpKind::Slice, {base.tensor}, attrs, e, scope);
}

Value Lowerer::binary(const Expr &e, Scope &scope) {
  Value a = eval(*e.args[0], scope);
  Value b = eval(*e.args[1], scope);
  if (a.kind == Value::Invalid || b.kind == Value::Invalid)
    return {};
  if (a.kind == Value::Const && b.kind == Value::Const) {
    ConstValue v = sema.arith(e, a.c, b.c);
    return v.kind == ConstValue::Invalid ? Value{} : Value::ofConst(v);
  }
  const std::string &op = e.text;
  OpKind kind = op == "@" ? OpKind::Matmul
                : op == "+" ? OpKind::Add
                : op == "-" ? OpKind::Sub
                : op == "*" ? OpKind::Mul
                            : OpKind::Div;
  if (a.kind == Value::Tensor && b.kind == Value::Tensor)
    return op1(kind, {a.tensor, b.tensor}, OpAttrs(), e, scope);
  const Value &t = a.kind == Value::Tensor ? a : b;
  const Value &c = a.kind == Value::Tensor ? b : a;
  if (t.kind != Value::Tensor || c.kind != Value::Const || c.c.kind != ConstValue::Number ||
      kind == OpKind::Matmul) {
    const Value &bad = t.kind != Value::Tensor ? t : c;
    diags.report(DiagKind::TypeMismatch, e.opLoc,
                 "operator '" + op + "' cannot take " + bad.describe())
        .range(bad.range);
    return {};
  }
  if (c.c.dim != UnitDim::None) {
    diags.report(DiagKind::UnitMismatch, c.range.Start,
                 "tensor arithmetic takes plain numbers, not " + c.c.describe())
        .range(c.range);
    return {};
  }
  OpAttrs attrs;
  attrs.hasScalar = true;
  attrs.scalar = c.c.number;
  attrs.scalarOnLeft = a.kind == Value::Const;
  return op1(kind, {t.tensor}, attrs, e, scope);
}

Value Lowerer::call(const Expr &e, Scope &scope) {
  // A primitive, unless a local or member of that name shadows it.
  if (e.lhs->kind == ExprKind::Name) {
    const std::string &n = e.lhs->text;
    bool shadowed = scope.locals.count(n) || scope.module->members.count(n) ||
                    scope.module->consts.count(n);
    if (const Primitive *p = shadowed ? nullptr : findPrimitive(n))
      return primitive(*p, e, scope);
  }
  Value callee = eval(*e.lhs, scope);
  if (callee.kind == Value::Invalid)
    return {};
  std::vector<Value> args;
  for (size_t i = 0; i < e.args.size(); ++i) {
    if (!e.argNames[i].empty()) {
      diags.report(DiagKind::UnknownArgument, e.argNameRanges[i].Start,
                   "a block's forward function takes its inputs by position")
          .range(e.argNameRanges[i]);
      return {};
    }
    Value v = eval(*e.args[i], scope);
    if (v.kind == Value::Invalid)
      return {};
    args.push_back(std::move(v));
  }
  if (callee.kind == Value::Module)
    return callModule(*callee.module, std::move(args), e.range);
  if (callee.kind == Value::List) {
    // The copies run in order. With one input, each copy's output is the next one's input.
    // With several (a decoder block's (x, memory)), a copy returning one tensor replaces the
    // first input and the others reach every copy unchanged; a copy returning as many values
    // as it takes passes all of them on.
    if (args.empty()) {
      diags.report(DiagKind::WrongArgCount, e.range.Start,
                   "a repeated block needs at least one input")
          .range(e.range);
      return {};
    }
    bool all = false; // the last copy returned every input's next value
    // A copy whose inputs and parameters have the types of the last evaluated copy's gets
    // that copy's ops again, renamed (cloneCall); others are evaluated. A copy is only a
    // template when its call said nothing (no diagnostic to repeat per copy).
    std::optional<CallRecord> record;
    for (size_t copy = 0; copy < callee.list.size(); ++copy) {
      ModuleObj *m = callee.list[copy];
      std::optional<Value> cloned;
      if (record)
        cloned = cloneCall(*record, *m, args);
      Value y;
      if (cloned) {
        y = std::move(*cloned);
      } else {
        CallRecord r;
        r.module = m;
        r.args = args;
        r.tensorsBegin = static_cast<TensorId>(g.tensors.size());
        r.opsBegin = static_cast<OpId>(g.ops.size());
        r.localsBegin = g.locals.size();
        unsigned said = diags.errorCount() + diags.warningCount();
        y = callModule(*m, args, e.range);
        if (y.kind == Value::Invalid)
          return {};
        r.tensorsEnd = static_cast<TensorId>(g.tensors.size());
        r.opsEnd = static_cast<OpId>(g.ops.size());
        r.localsEnd = g.locals.size();
        r.result = y;
        if (diags.errorCount() + diags.warningCount() == said) {
          // The copies left will most likely be clones of this one: room for them at once,
          // as many as the op and tensor bounds allow (reserveFor).
          size_t left = std::min(callee.list.size() - copy - 1,
                                 roomUnder(g.ops.size(), kMaxOps) / std::max<size_t>(1, r.opsEnd - r.opsBegin));
          reserveFor(g.tensors, std::min(left * (r.tensorsEnd - r.tensorsBegin),
                                         roomUnder(g.tensors.size(), kMaxTensors)));
          reserveFor(g.ops, left * (r.opsEnd - r.opsBegin));
          record = std::move(r);
        } else {
          record.reset();
        }
      }
      if (args.size() > 1 && y.kind == Value::Tuple && y.elems.size() == args.size()) {
        args = y.elems;
        all = true;
      } else if (args.size() > 1 && y.kind == Value::Tuple) {
        diags.report(DiagKind::WrongArgCount, e.range.Start,
                     "a copy of this repeated block returns " + std::to_string(y.elems.size()) +
                         " values for " + std::to_string(args.size()) +
                         " inputs; return one tensor (the first input's next value) or all " +
                         std::to_string(args.size()))
            .range(e.range);
        return {};
      } else {
        args[0] = y;
        all = false;
      }
    }
    if (!all)
      return args[0];
    Value out;
    out.kind = Value::Tuple;
    out.range = e.range;
    out.elems = args;
    return out;
  }
  diags.report(DiagKind::TypeMismatch, e.range.Start,
               "cannot call " + callee.describe())
      .range(e.lhs->range);
  return {};
}

} // namespace lowering
} // namespace tally
