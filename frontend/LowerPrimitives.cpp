// Lowering: primitive calls and the ops they append (frontend/Lower.cpp has the steps).
//
// 1. Bind the call's arguments to the parameters of the primitive's entry in
//    ir/Primitives.cpp (positional or named, each once, the required ones present; bind).
// 2. Read each argument by its parameter's name, checking its kind: tensor, number, whole
//    number, probability, true/false, a pair or a shape, an absent one taking the table's
//    default (the *Arg helpers). A name the table lacks, or an argument given but never
//    read, is an internal error: the table and this file disagree (tests/unit/
//    test_primitives.cpp calls every entry with every parameter named).
// 3. Read the arguments each kind takes, by the kind's entry in the table of lowerings
//    (frontend/LowerOps.cpp; the code is in its family's file), and append one op (op1): an
//    input whose layout the kernel cannot read gets a `contiguous` copy first, the output
//    shapes come from the op's rule (ir/OpRules.cpp), the op is named after its instance and
//    kind ("h[3].attn.qkv.matmul", "h[3].add#2"), view outputs get their strides and offset
//    (setViewLayouts), random ops a stream, and attention its scale and the head size of the
//    ropes that feed it (setRopeHeadDims).
#include "frontend/Lowerer.h"

#include "support/Format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tally {
namespace lowering {


std::optional<Lowerer::Bound> Lowerer::bind(const Primitive &p, const Expr &e, Scope &scope) {
  const std::vector<PrimitiveParam> &params = p.params;
  auto name = [&] { return p.name().str(); };
  Bound b;
  b.prim = &p;
  b.call = &e;
  b.exprs.assign(params.size(), nullptr);
  b.values.resize(params.size());
  b.read.assign(params.size(), false);
  size_t positional = 0;
  for (size_t i = 0; i < e.args.size(); ++i) {
    size_t slot;
    if (e.argNames[i].empty()) {
      slot = positional++;
      if (p.variadic && slot >= params.size() - 1) {
        // extra positional inputs of concat gather into its first parameter
        Value v = eval(*e.args[i], scope);
        if (v.kind == Value::Invalid)
          return std::nullopt;
        if (b.values[0].kind != Value::Tuple) {
          Value first = b.values[0];
          b.values[0] = Value();
          b.values[0].kind = Value::Tuple;
          b.values[0].range = e.range;
          if (first.kind != Value::Invalid)
            b.values[0].elems.push_back(first);
        }
        b.values[0].elems.push_back(v);
        b.exprs[0] = &e;
        continue;
      }
      if (slot >= params.size()) {
        diags.report(DiagKind::WrongArgCount, e.args[i]->range.Start,
                     "'" + name() + "' takes at most " + std::to_string(params.size()) +
                         " argument" + (params.size() == 1 ? "" : "s"))
            .range(e.args[i]->range);
        return std::nullopt;
      }
    } else {
      slot = p.index(e.argNames[i]);
      if (slot == params.size()) {
        std::vector<std::string> names;
        for (const PrimitiveParam &param : params)
          names.push_back(param.name);
        sema.suggest(DiagKind::UnknownArgument, e.argNameRanges[i],
                     "'" + name() + "' has no argument '" + e.argNames[i] + "'", e.argNames[i],
                     names);
        return std::nullopt;
      }
    }
    if (b.exprs[slot]) {
      llvm::SMRange at = e.argNames[i].empty() ? e.args[i]->range : e.argNameRanges[i];
      diags.report(DiagKind::DuplicateName, at.Start,
                   "argument '" + std::string(params[slot].name) + "' of '" + name() +
                       "' is given twice")
          .range(at);
      return std::nullopt;
    }
    Value v = eval(*e.args[i], scope);
    if (v.kind == Value::Invalid)
      return std::nullopt;
    b.exprs[slot] = e.args[i].get();
    b.values[slot] = std::move(v);
  }
  for (size_t i = 0; i < p.required; ++i)
    if (!b.exprs[i]) {
      diags.report(DiagKind::WrongArgCount, e.range.Start,
                   "'" + name() + "' needs its argument '" + params[i].name + "'")
          .range(e.range);
      return std::nullopt;
    }
  return b;
}

void Lowerer::internalError(const Bound &b, const std::string &problem) {
  diags.report(DiagKind::InvalidValue, b.call->range.Start,
               "internal error: the lowering of '" + b.prim->name().str() +
                   "' disagrees with ir/Primitives.cpp: " + problem)
      .range(b.call->range);
  fail();
}

size_t Lowerer::slot(const Bound &b, llvm::StringRef param) {
  size_t i = b.prim->index(param);
  if (i == b.prim->params.size()) {
    internalError(b, "it has no parameter '" + param.str() + "'");
    return i;
  }
  b.read[i] = true;
  return i;
}

std::optional<double> Lowerer::defaultOf(const Bound &b, size_t i, std::optional<double> dflt) {
  if (dflt)
    return dflt;
  const PrimitiveParam &param = b.prim->params[i];
  if (param.hasNumericDefault())
    return param.defaultValue;
  internalError(b, "parameter '" + std::string(param.name) + "' has no default");
  return std::nullopt;
}

bool Lowerer::tensorArg(const Bound &b, llvm::StringRef param, TensorId &out) {
  size_t i = slot(b, param);
  if (i == b.values.size())
    return false;
  if (b.values[i].kind != Value::Tensor) {
    diags.report(DiagKind::TypeMismatch, b.values[i].range.Start,
                 "'" + param.str() + "' of '" + b.prim->name().str() + "' must be a tensor, not " +
                     b.values[i].describe())
        .range(b.values[i].range);
    return false;
  }
  out = b.values[i].tensor;
  return true;
}

std::optional<double> Lowerer::numberArg(const Bound &b, llvm::StringRef param,
                                         std::optional<double> dflt) {
  size_t i = slot(b, param);
  if (i == b.values.size())
    return std::nullopt;
  if (!b.has(i))
    return defaultOf(b, i, dflt);
  const Value &v = b.values[i];
  if (v.kind != Value::Const || v.c.kind != ConstValue::Number ||
      (v.c.dim != UnitDim::None && v.c.dim != UnitDim::Ratio)) {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 "'" + param.str() + "' must be a number, not " + v.describe())
        .range(v.range);
    return std::nullopt;
  }
  return v.c.number;
}

std::optional<int64_t> Lowerer::intArg(const Bound &b, llvm::StringRef param,
                                       std::optional<int64_t> dflt) {
  size_t i = slot(b, param);
  if (i == b.values.size())
    return std::nullopt;
  if (!b.has(i)) {
    auto d = defaultOf(b, i, dflt ? std::optional<double>(static_cast<double>(*dflt)) : std::nullopt);
    return d ? std::optional<int64_t>(static_cast<int64_t>(*d)) : std::nullopt;
  }
  const Value &v = b.values[i];
  if (v.kind != Value::Const || v.c.kind != ConstValue::Number || !v.c.isInteger ||
      v.c.dim != UnitDim::None) {
    bool plain = v.kind == Value::Const && v.c.kind == ConstValue::Number &&
                 v.c.dim == UnitDim::None;
    diags.report(DiagKind::NotInteger, v.range.Start,
                 "'" + param.str() + "' must be a whole number, " +
                     (plain ? "but it is " + significant(v.c.number) : "not " + v.describe()))
        .range(v.range);
    return std::nullopt;
  }
  return v.c.intValue;
}

std::optional<bool> Lowerer::boolArg(const Bound &b, llvm::StringRef param) {
  size_t i = slot(b, param);
  if (i == b.values.size())
    return std::nullopt;
  if (!b.has(i)) {
    auto d = defaultOf(b, i, std::nullopt);
    return d ? std::optional<bool>(*d != 0) : std::nullopt;
  }
  const Value &v = b.values[i];
  if (v.kind != Value::Const || v.c.kind != ConstValue::Bool) {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 "'" + param.str() + "' must be true or false, not " + v.describe())
        .range(v.range);
    return std::nullopt;
  }
  return v.c.boolean;
}

std::optional<double> Lowerer::probability(const Bound &b, llvm::StringRef param) {
  auto p = numberArg(b, param);
  if (p && (*p < 0 || *p >= 1)) {
    const Value &v = b.values[slot(b, param)];
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "'" + param.str() + "' is a probability in [0, 1), not " + significant(*p))
        .range(v.range);
    return std::nullopt;
  }
  return p;
}

/// `stride = 2` or `stride = (2, 1)`: one whole number for both spatial axes or one each;
/// at least `lo`. Absent: both the default.
bool Lowerer::pairArg(const Bound &b, llvm::StringRef param, int64_t lo, int64_t (&out)[2],
                      std::optional<int64_t> dflt) {
  size_t i = slot(b, param);
  if (i == b.values.size())
    return false;
  if (!b.has(i)) {
    auto d = defaultOf(b, i, dflt ? std::optional<double>(static_cast<double>(*dflt)) : std::nullopt);
    if (!d)
      return false;
    out[0] = out[1] = static_cast<int64_t>(*d);
    return true;
  }
  const Value &v = b.values[i];
  std::vector<Value> items = v.kind == Value::Tuple ? v.elems : std::vector<Value>{v};
  bool ok = items.size() == 1 || items.size() == 2;
  for (size_t k = 0; ok && k < items.size(); ++k) {
    const Value &x = items[k];
    ok = x.kind == Value::Const && x.c.kind == ConstValue::Number && x.c.isInteger &&
         x.c.dim == UnitDim::None && x.c.intValue >= lo && x.c.intValue <= (int64_t(1) << 40);
    if (ok)
      out[k] = out[items.size() == 1 ? 1 : k] = x.c.intValue;
  }
  if (!ok)
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "'" + param.str() + "' must be a whole number " +
                     (lo > 0 ? "of at least 1" : "of at least 0") +
                     ", or a pair (height, width) of them, not " + v.describe())
        .range(v.range);
  return ok;
}

bool Lowerer::shapeArg(const Bound &b, llvm::StringRef param, Shape &out) {
  size_t i = slot(b, param);
  if (i == b.values.size())
    return false;
  const Value &v = b.values[i];
  std::vector<Value> items = v.kind == Value::Tuple ? v.elems : std::vector<Value>{v};
  for (const Value &x : items) {
    if (x.kind != Value::Const || !x.c.isInteger || x.c.dim != UnitDim::None ||
        (x.c.intValue <= 0 && x.c.intValue != -1)) {
      diags.report(DiagKind::TypeMismatch, x.range.Start,
                   "a shape is a list of positive whole numbers (one may be -1)")
          .range(x.range);
      return false;
    }
    Dim d;
    d.size = x.c.intValue;
    out.push_back(d);
  }
  return true;
}

Value Lowerer::primitive(const Primitive &p, const Expr &e, Scope &scope) {
  std::optional<Bound> b = bind(p, e, scope);
  if (!b)
    return {};
  Value out = primitiveOp(*b, e, scope);
  // Every argument given must have been read: a parameter in the table that the lowering
  // ignores would accept an argument and silently drop it.
  for (size_t i = 0; out.kind != Value::Invalid && i < b->values.size(); ++i)
    if (b->exprs[i] && !b->read[i]) {
      internalError(*b, "its argument '" + std::string(p.params[i].name) + "' is not used");
      return {};
    }
  return out;
}

/// The strides and offset of a view op's outputs over the storage of its input (step 3 of
/// the layout rules in docs/ir.md): split offsets each part along its axis, slice offsets
/// its start and multiplies strides by its steps (dropping indexed axes), transpose swaps
/// two strides, reshape re-strides a dense input (a reshape of a non-dense view is made
/// dense later by passes/Contiguous.cpp, which gives it a copy to view).
void Lowerer::setViewLayouts(Op &op) {
  const Tensor &x = g.tensors[op.inputs[0]];
  const llvm::SmallVector<int64_t, 4> xs = stridesOf(x.shape, x.layout);
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    Tensor &t = g.tensors[op.outputs[i]];
    int64_t offset = x.layout.offset();
    llvm::SmallVector<int64_t, 4> st = xs;
    if (op.kind == OpKind::Split) {
      size_t axis = 0;
      normalizeAxis(op.attrs->dim, x.shape.size(), axis);
      offset += static_cast<int64_t>(i) * t.shape[axis].size * xs[axis];
    } else if (op.kind == OpKind::Slice) {
      st.clear();
      for (size_t a = 0; a < x.shape.size(); ++a) {
        if (a >= op.attrs->slices.size()) {
          st.push_back(xs[a]);
          continue;
        }
        const SliceDim &d = op.attrs->slices[a];
        offset += d.start * xs[a];
        if (!d.drop)
          st.push_back(xs[a] * d.step);
      }
    } else if (op.kind == OpKind::Transpose) {
      size_t a0 = 0, a1 = 0;
      normalizeAxis(op.attrs->transposeA, x.shape.size(), a0);
      normalizeAxis(op.attrs->transposeB, x.shape.size(), a1);
      std::swap(st[a0], st[a1]);
    } else {
      st = viewStrides(x.shape, xs, t.shape).value_or(denseStrides(t.shape));
    }
    setLayout(t, st, offset);
  }
}

Lowerer::DenseCopy Lowerer::dense(TensorId t, const Expr &e, Scope &scope) {
  Value v = op1(OpKind::Contiguous, {t}, OpAttrs(), e, scope);
  if (v.kind != Value::Tensor)
    return {};
  return {v.tensor, true};
}

/// Appends one op; returns its output (or a tuple of outputs for split and topk).
Value Lowerer::op1(OpKind kind, llvm::SmallVector<TensorId, 3> inputs, const OpAttrs &attrs,
                   const Expr &e, Scope &scope) {
  bool ops = g.ops.size() >= kMaxOps;
  if (ops || g.tensors.size() >= kMaxTensors) {
    diags.report(DiagKind::Overflow, e.range.Start,
                 "the model has more than " + std::to_string(ops ? kMaxOps : kMaxTensors) +
                     (ops ? " ops" : " tensors") + "; tally stops counting here")
        .range(e.range);
    fail();
    return {};
  }
  Op op;
  op.kind = kind;
  op.inputs = std::move(inputs);
  op.attrs = attrs;
  op.instance = scope.module->instance;
  op.range = e.range;
  // A kernel that cannot read an input's layout (an elementwise op on a transposed view,
  // say) reads a dense copy of it instead: the copy is an op of its own, priced like any.
  for (unsigned i = 0; i < op.inputs.size(); ++i) {
    if (acceptsLayout(g, op, i))
      continue;
    DenseCopy copy = dense(op.inputs[i], e, scope);
    if (!copy.valid)
      return {};
    op.inputs[i] = copy.id;
  }
  llvm::SmallVector<TensorType, 3> outs;
  ShapeError err;
  bool inferred = ruleFor(kind).infer(g, op, outs, err);
  if (inferred && kind == OpKind::Reshape && !outs.empty()) {
    const Tensor &x = g.tensors[op.inputs[0]];
    if (!viewStrides(x.shape, stridesOf(x.shape, x.layout), outs[0].shape)) {
      auto copy = dense(op.inputs[0], e, scope);
      if (!copy.valid)
        return {};
      op.inputs[0] = copy.id;
    }
  }
  if (!inferred) {
    DiagKind dk = err.kind == ShapeErrorKind::Matmul      ? DiagKind::MatmulShape
                  : err.kind == ShapeErrorKind::Broadcast ? DiagKind::BroadcastShape
                  : err.kind == ShapeErrorKind::Overflow  ? DiagKind::Overflow
                  : err.kind == ShapeErrorKind::Invalid   ? DiagKind::InvalidValue
                                                          : DiagKind::ShapeMismatch;
    llvm::SMLoc at = e.kind == ExprKind::Binary ? e.opLoc : e.range.Start;
    auto d = diags.report(dk, at, err.message);
    d.range(e.range);
    context(d);
    fail();
    return {};
  }
  op.ordinal = nextOrdinal(op.instance, kind);
  bool grad = false;
  for (TensorId t : op.inputs)
    grad |= g.tensors[t].requiresGrad;
  TensorId base = kNone;
  if (opClass(kind) == OpClass::View && !op.inputs.empty())
    base = g.tensors[op.inputs[0]].viewOf != kNone ? g.tensors[op.inputs[0]].viewOf
                                                   : op.inputs[0];
  Value result;
  result.kind = Value::Tuple;
  result.range = e.range;
  // Split returns all its parts, topk (values, indices) (their table entries say so,
  // LOWERING_ALL); every other op returns its first output, the rest being what its backward
  // reads (statistics, logsumexp, masks), which carry no gradient.
  bool tuple = loweringFor(kind).returnsAll;
  for (TensorType &tt : outs) {
    Tensor t;
    t.shape = std::move(tt.shape);
    t.dtype = tt.dtype;
    t.requiresGrad = grad && isFloat(tt.dtype) && (tuple || op.outputs.empty());
    t.viewOf = base;
    TensorId id = g.addTensor(std::move(t));
    op.outputs.push_back(id);
    result.elems.push_back(Value::ofTensor(id, e.range));
  }
  if (!op.inputs.empty() && opClass(kind) == OpClass::View)
    setViewLayouts(op);
  bool stream = takesRandomStream(op);
  bool scale = op.kind == OpKind::Attention && op.attrs->scale == 0;
  if (stream || scale)
    op.attrs.change([&](OpAttrs &a) {
      if (stream)
        a.stream = g.randomStreams++;
      if (scale)
        a.scale = 1 / std::sqrt(static_cast<double>(g.tensors[op.inputs[0]].shape[2].size) /
                                static_cast<double>(a.heads));
    });
  if (op.kind == OpKind::Attention)
    setRopeHeadDims(op);
  g.addOp(std::move(op));
  if (!tuple)
    return result.elems[0];
  return result;
}

/// Rope rotates pairs within each head, so it needs the head size of the attention that
/// reads it: q's (and k's) rope, reached through views and copies, gets d / heads unless the
/// head size was already set.
void Lowerer::setRopeHeadDims(const Op &attention) {
  if (attention.attrs->heads <= 0)
    return;
  int64_t hd = g.tensors[attention.inputs[0]].shape.back().size / attention.attrs->heads;
  for (unsigned i = 0; i < 2 && i < attention.inputs.size(); ++i) {
    TensorId t = attention.inputs[i];
    while (t != kNone) {
      OpId p = g.tensors[t].producer;
      if (p == kNone)
        break;
      Op &op = g.ops[p];
      if (op.kind == OpKind::Rope) {
        if (op.attrs->headDim == 0)
          op.attrs.change([&](OpAttrs &a) { a.headDim = hd; });
        auto rot =
            static_cast<int64_t>(static_cast<double>(op.attrs->headDim) * op.attrs->fraction);
        if (op.attrs->fraction >= 1 && op.attrs->headDim % 2 != 0) {
          // Rope turns pairs of a head's dims: an odd head size leaves one dim without a pair
          // (the generated step could not be built; before, only `tally build` said so).
          auto d = diags.report(DiagKind::InvalidValue, op.range.Start,
                                "rope needs an even head size: the attention that reads it has " +
                                    std::to_string(attention.attrs->heads) + " heads of " +
                                    std::to_string(op.attrs->headDim) + " dims, and rope turns "
                                    "pairs of a head's dims");
          d.range(op.range);
          context(d);
          fail();
        } else if (op.attrs->fraction < 1 && (rot <= 0 || rot % 2 != 0)) {
          auto d = diags.report(DiagKind::InvalidValue, op.range.Start,
                                "rope fraction " + significant(op.attrs->fraction) + " of head size " +
                                    std::to_string(op.attrs->headDim) + " rotates " +
                                    std::to_string(rot) + " dims; it must be an even number above 0");
          d.range(op.range);
          context(d);
          fail();
        }
        break;
      }
      if (opClass(op.kind) != OpClass::View && op.kind != OpKind::Contiguous)
        break;
      t = op.inputs.empty() ? kNone : op.inputs[0];
    }
  }
}

/// Which op of `kind` written in `instance` the next one is, counted per instance: 1 for
/// "h[3].attn.qkv.matmul", 2 for "h[3].add#2", its second add (Graph::opPath).
uint32_t Lowerer::nextOrdinal(uint32_t instance, OpKind kind) {
  if (opCounts.size() < g.instances.size())
    opCounts.resize(g.instances.size());
  auto &counts = opCounts[instance];
  auto it = std::find_if(counts.begin(), counts.end(), [&](const auto &c) { return c.first == kind; });
  return it == counts.end() ? (counts.push_back({kind, 1}), 1) : ++it->second;
}

bool Lowerer::takesRandomStream(const Op &op) {
  return op.kind == OpKind::Dropout || (op.kind == OpKind::Attention && op.attrs->p > 0);
}

} // namespace lowering
} // namespace tally
