// The per-op table: for every op kind in ir/Ops.def, how its output shapes follow from its
// inputs, what its forward pass costs (FLOPs, bytes), what each input's gradient costs, and what
// the backward keeps from the forward. docs/counting.md states the same rules as formulas; keep
// the two in step.
//
// The rules live in ir/ops/, one file per op family, each op kind (its backward ops included)
// in exactly one: Matmul, Elementwise (binary and unary, dropout, rope), Norm (softmax, layer
// and RMS norm), Attention, Data (embedding, index generation, concat, copies, the gathers and
// scatters of routing), Reduce (sum, mean, reduce_to, expand), Loss (cross entropy), View,
// Conv (convolution and pooling), Update (the optimizer step's ops) and Moe. Each family file
// holds its shape rules, its Counts and what its backward keeps, and ends with one RULE line
// per kind; ir/ops/OpsCommon.h has what the families share (helpers, the Counts machinery,
// the RULE macro). This file indexes the entries by kind, from ir/Ops.def, and holds the
// helpers ir/OpRules.h exports.
// The functions assume the op was built by lowering: the right number of inputs for `forward`,
// `gradFlops` and `saved`, and outputs already created from `infer`'s results. `infer` checks
// everything itself and reports bad shapes as a ShapeError.
#include "ir/OpRules.h"

#include "ir/ops/OpsCommon.h"

#include <algorithm>
#include <string>

namespace tally {

namespace {

// The table: one entry per kind, indexed by ir/Ops.def's order. Each rule<ID> is defined by the
// RULE line of its family's file in ir/ops/.
const OpRule *const kRules[] = {
#define OP(ID, NAME, CLASS) &oprules::rule##ID,
#include "ir/Ops.def"
};

} // namespace

const OpRule &ruleFor(OpKind k) { return *kRules[static_cast<unsigned>(k)]; }

namespace {
const UnaryDef kUnary[] = {
#define UNARY(ID, FWD, GRAD, READS, FWD_EXPS, GRAD_EXPS, RUNTIME)                                  \
  {OpKind::ID, FWD, GRAD, GradReads::READS, FWD_EXPS, GRAD_EXPS, #RUNTIME},
#include "ir/ops/Unary.def"
};
} // namespace

llvm::ArrayRef<UnaryDef> unaryDefs() { return kUnary; }

const UnaryDef *unaryDef(OpKind k) {
  for (const UnaryDef &u : kUnary)
    if (u.kind == k)
      return &u;
  return nullptr;
}

const char *binaryRuntime(OpKind k) {
  switch (k) {
#define BINARY(ID, RUNTIME)                                                                        \
  case OpKind::ID:                                                                                 \
    return #RUNTIME;
#include "ir/ops/Binary.def"
  default:
    return nullptr;
  }
}

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
    if (ruleFor(op.kind).infer == &oprules::inferChecked<&oprules::inferGiven>)
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
