// The forward graph as one rank of the generated tensor-parallel step holds it (Plan::tensorStep;
// docs/codegen.md, "Tensor parallel under MPI"). Which tensors are split is tensorSplit's
// (StepTime.cpp), the rule the estimate prices; this pass only gives them one rank's shapes:
// 1. Each parameter read by a split op is cut along one dimension: a column-parallel weight
//    [K, N] along N, a row-parallel one along K, a bias added to a split tensor along its last.
//    A dimension that a later `split` view cuts into P parts (a fused qkv projection's 3) is cut
//    as [P, t, size/(P·t)], rank r holding [:, r, :]: its heads of q, of k and of v (Megatron's
//    column-parallel qkv, whose weight is stored per rank in that order).
// 2. Each split activation has its last dimension divided by t, attention its heads and kv
//    heads; the ops' outputs are inferred again from their rules, and `split` views re-laid.
//    The ids of ops and tensors stay, so the memory plan's buffers (sized per rank by the
//    activation planner) and the step built from this graph name the same tensors.
// What the step cannot run is refused, naming the op: a split tensor read by any op but a
// weight matmul, an elementwise op, attention (without dropout, a mask or ALiBi) or a `split`
// along the last dimension; a weight read through a view, or read both split and whole.
#include "passes/Passes.h"

#include "ir/OpRules.h"

#include <map>

namespace tally {

namespace {

bool elementwise(const Op &op) {
  return opClass(op.kind) == OpClass::Elementwise && op.kind != OpKind::Dropout;
}

} // namespace

/// Step 2: one rank's shapes in `out` (a copy of g): the cut parameters, attention's heads,
/// every op reading a split or cut tensor inferred again, `split` views laid out again.
static std::string reshape(const Graph &g, const Plan &plan, const TensorSplit &ts, const std::vector<TensorShardOf> &shards,
                    Graph &out, OpId &at) {
  const int64_t t = plan.parallel.tensor;
  auto isSplit = [&](TensorId x) { return ts.split[g.storageOf(x)]; };
  auto name = [&](const Op &op) {
    at = static_cast<OpId>(&op - &g.ops[0]);
    return "op " + g.opPath(op) + " (" + opName(op.kind).str() + ")";
  };
  auto divided = [&](const Shape &s, size_t axis, int64_t by, Shape &res) {
    res = s;
    if (axis >= res.size() || res[axis].size % by != 0)
      return false;
    res[axis].size /= t;
    res[axis].sym = 0;
    return true;
  };
  for (size_t p = 0; p < g.params.size(); ++p) {
    if (shards[p].dim < 0)
      continue;
    Tensor &x = out.tensors[g.params[p].tensor];
    Shape s;
    if (!divided(x.shape, static_cast<size_t>(shards[p].dim), t * shards[p].parts, s))
      return "parameter " + g.paramPath(g.params[p]) + " of shape " + g.formatShape(x.shape) +
             " does not divide into " + std::to_string(t * shards[p].parts) + " equal parts for tensor = " +
             std::to_string(t);
    x.shape = s;
  }
  for (OpId i = 0; i < g.ops.size(); ++i) {
    Op &op = out.ops[i];
    bool anySplit = false, paramCut = false;
    for (TensorId x : op.inputs) {
      anySplit = anySplit || isSplit(x);
      paramCut = paramCut || (g.isParamStorage(x) && shards[g.tensors[g.storageOf(x)].param].dim >= 0);
    }
    if (!anySplit && !paramCut)
      continue;
    if (op.kind == OpKind::Attention)
      op.attrs.change([&](OpAttrs &at) {
        at.heads /= t;
        if (at.kvHeads)
          at.kvHeads /= t;
      });
    llvm::SmallVector<TensorType, 4> types;
    ShapeError err;
    if (!ruleFor(op.kind).infer(out, op, types, err) || types.size() != op.outputs.size())
      return name(g.ops[i]) + ": its shard's shapes do not infer: " + err.message;
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      Tensor &o = out.tensors[op.outputs[k]];
      o.shape = types[k].shape;
      if (op.kind == OpKind::Split) {
        const Tensor &in = out.tensors[op.inputs[0]];
        llvm::SmallVector<int64_t, 4> st = stridesOf(in.shape, in.layout);
        setLayout(o, st, in.layout.offset() + static_cast<int64_t>(k) * o.shape.back().size);
      }
    }
  }
  return "";
}

std::string shardForTensorParallel(const Graph &g, const Plan &plan, Graph &out,
                                   std::vector<TensorShardOf> &shards, OpId &at) {
  const int64_t t = plan.parallel.tensor;
  TensorSplit ts = tensorSplit(g, plan);
  out = g;
  shards.assign(g.params.size(), TensorShardOf{});
  auto isSplit = [&](TensorId x) { return ts.split[g.storageOf(x)]; };
  at = kNone;
  auto name = [&](const Op &op) {
    at = static_cast<OpId>(&op - &g.ops[0]);
    return "op " + g.opPath(op) + " (" + opName(op.kind).str() + ")";
  };
  const std::string why = ": the generated tensor-parallel step splits only Megatron's column- and "
                          "row-parallel matmuls, elementwise ops and attention between them";
  // Step 1: the root of each split storage (the column-parallel matmul it comes from through
  // elementwise ops; attention and `split` start their own, of one part) and the parts a split
  // view cuts a root's last dimension into.
  std::vector<OpId> root(g.tensors.size(), kNone);
  std::map<OpId, int64_t> parts;
  std::vector<std::pair<uint32_t, std::pair<int, OpId>>> cuts; // param index, (dim, root)
  auto cutParam = [&](TensorId w, int dim, OpId r, const Op &op) -> std::string {
    const Tensor &x = g.tensors[w];
    if (x.role != TensorRole::Param || x.viewOf != kNone || x.param >= g.params.size())
      return name(op) + " reads a view of a parameter on a split tensor" + why;
    cuts.push_back({x.param, {dim, r}});
    return "";
  };
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    bool anySplit = false;
    for (TensorId x : op.inputs)
      anySplit = anySplit || isSplit(x);
    auto [x, w] = weightMatmulOperands(g, op);
    if (ts.columnParallel[i]) {
      if (std::string e = cutParam(w, 1, i, op); !e.empty())
        return e;
      if (g.tensors[w].shape.size() != 2 || w != op.inputs[1])
        return name(op) + " is a column-parallel matmul whose weight is not a [in, out] matrix" + why;
      for (TensorId o : op.outputs)
        root[g.storageOf(o)] = i;
      continue;
    }
    if (ts.rowParallel[i]) {
      if (g.tensors[w].shape.size() != 2 || w != op.inputs[1])
        return name(op) + " is a row-parallel matmul whose weight is not a [in, out] matrix" + why;
      if (std::string e = cutParam(w, 0, root[g.storageOf(x)], op); !e.empty())
        return e;
      continue;
    }
    if (!anySplit)
      continue;
    if (op.kind == OpKind::Attention) {
      const OpAttrs &at = op.attrs;
      int64_t kv = at.kvHeads ? at.kvHeads : at.heads;
      if (at.p > 0 || at.hasMask || at.alibi)
        return name(op) + " has dropout, a padding mask or ALiBi, which the tensor-parallel step "
                          "does not split over heads";
      if (at.heads % t != 0 || kv % t != 0)
        return name(op) + " has " + std::to_string(at.heads) + " heads and " + std::to_string(kv) +
               " kv heads, which tensor = " + std::to_string(t) + " does not divide";
      for (TensorId x : op.inputs)
        if (!isSplit(x))
          return name(op) + " reads a whole q, k or v beside split ones" + why;
      for (TensorId o : op.outputs)
        root[g.storageOf(o)] = i;
      parts[i] = 1;
      continue;
    }
    if (op.kind == OpKind::Split) {
      size_t axis = 0;
      const Tensor &in = g.tensors[op.inputs[0]];
      if (!normalizeAxis(op.attrs->dim, in.shape.size(), axis) || axis + 1 != in.shape.size() ||
          !isDense(in.shape, in.layout) || in.viewOf != kNone)
        return name(op) + " splits a split tensor other than along its last dimension" + why;
      OpId r = root[g.storageOf(op.inputs[0])];
      auto [it, fresh] = parts.emplace(r, op.attrs->parts);
      if (!fresh && it->second != op.attrs->parts)
        return name(op) + " cuts a split tensor into a different number of parts than another split" + why;
      continue;
    }
    if (!elementwise(op))
      return name(op) + " reads a split tensor" + why;
    OpId r = kNone;
    for (TensorId x : op.inputs)
      if (isSplit(x) && r == kNone)
        r = root[g.storageOf(x)];
    const Shape &os = g.tensors[op.outputs[0]].shape;
    for (TensorId x : op.inputs) {
      const Tensor &in = g.tensors[x];
      if (isSplit(x)) {
        if (in.viewOf != kNone && !isDense(in.shape, in.layout) && in.shape.size() != os.size())
          return name(op) + " reads a strided view of a split tensor" + why;
        continue;
      }
      if (g.isParamStorage(x)) {
        if (in.shape.size() != 1 || in.shape[0].size != os.back().size)
          return name(op) + " reads a parameter that is not a bias over the split dimension" + why;
        if (std::string e = cutParam(x, 0, r, op); !e.empty())
          return e;
      } else if (in.shape.empty() || numel(in.shape) == 1) {
        continue; // a scalar
      } else {
        return name(op) + " reads a whole tensor beside a split one" + why;
      }
    }
    for (TensorId o : op.outputs)
      root[g.storageOf(o)] = r;
  }
  // Each parameter cut once, one way.
  for (auto &[p, cut] : cuts) {
    TensorShardOf want{cut.first, 1};
    auto pr = parts.find(cut.second);
    if (pr != parts.end())
      want.parts = pr->second;
    TensorShardOf &have = shards[p];
    if (have.dim >= 0 && (have.dim != want.dim || have.parts != want.parts))
      return "parameter " + g.paramPath(g.params[p]) + " is read by two ops that cut it differently" + why;
    have = want;
  }
  for (OpId i = 0; i < g.ops.size(); ++i)
    for (TensorId x : g.ops[i].inputs)
      if (g.isParamStorage(x) && shards[g.tensors[g.storageOf(x)].param].dim >= 0 && !isSplit(g.ops[i].outputs[0]) &&
          !ts.rowParallel[i])
        return "parameter " + g.tensorName(g.storageOf(x)) + " is read both split and whole (by " + name(g.ops[i]) + ")" +
               why;
  if (std::string e = reshape(g, plan, ts, shards, out, at); !e.empty())
    return e;
  if (std::string e = verifyGraph(out); !e.empty())
    return "internal error: the tensor-parallel shard of the graph does not verify: " + e;
  return "";
}

std::string shardSequence(const Graph &g, const Plan &plan, Graph &step, std::vector<int8_t> &dim) {
  const int64_t t = plan.parallel.tensor;
  TensorSplit ts = tensorSplit(g, plan);
  std::vector<bool> seq(step.tensors.size(), false); // per storage of the step
  auto forward = [&](TensorId x) {
    return x < g.tensors.size() && g.storageOf(x) < ts.sequenceSplit.size() && ts.sequenceSplit[g.storageOf(x)];
  };
  for (TensorId x = 0; x < step.tensors.size(); ++x) {
    const Tensor &v = step.tensors[x];
    if (v.viewOf != kNone)
      continue;
    seq[x] = x < g.tensors.size() ? forward(x)
             : v.role == TensorRole::Gradient && v.gradOf != kNone && forward(v.gradOf);
  }
  for (const Op &op : step.ops) // a gradient passed on is the buffer it shares
    if (op.kind == OpKind::Contiguous && op.attrs->shares && !op.inputs.empty() && !op.outputs.empty() &&
        seq[step.storageOf(op.inputs[0])])
      seq[step.storageOf(op.outputs[0])] = true;
  dim.assign(step.tensors.size(), -1);
  for (TensorId x = 0; x < step.tensors.size(); ++x) {
    if (!seq[x] || step.tensors[x].viewOf != kNone)
      continue;
    Shape sh = step.tensors[x].shape;
    int8_t k = -1;
    for (size_t d = 0; d < sh.size() && d < 64; ++d)
      if (sh[d].sym != 0 && sh[d].sym < step.symbols.size() && step.symbols[sh[d].sym] == "seq")
        k = static_cast<int8_t>(d);
    if (k < 0)
      return "tensor %" + std::to_string(x) + " of shape " + step.formatShape(sh) +
             " is split along the sequence but has no `seq` dimension";
    if (sh[k].size % t != 0)
      return "the sequence of " + std::to_string(sh[k].size) + " tokens does not divide over tensor = " +
             std::to_string(t);
    sh[k].size /= t;
    sh[k].sym = 0;
    step.tensors[x].shape = sh;
    dim[x] = k;
  }
  return "";
}

} // namespace tally
