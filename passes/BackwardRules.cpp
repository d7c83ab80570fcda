// The backward of each op kind (step 3 of passes/Backward.cpp): the ops that compute the
// gradients of an op's inputs from the gradient of its first output, one builder per kind
// (PyTorch's derivatives.yaml, written once), each in its family's file and registered there
// by one BACKWARD line, or a NO_BACKWARD line saying why the kind has none (passes/
// BackwardTable.h lists the files). This file holds what the builders share (views of a
// tensor, a dense copy, a multi-output backward op), the table that indexes the entries by
// kind, and the dispatch. The Builder is passes/BackwardBuilder.h.
#include "passes/BackwardBuilder.h"

#include <cassert>

namespace tally {
namespace backward {

// ------------------------------------------------------------------------------------------
// Step 3: what the builders of several kinds share.

/// A view of `t` with shape `s` and strides `st` over the same storage.
TensorId Builder::view(TensorId t, const Shape &s, llvm::ArrayRef<int64_t> st, int64_t offset) {
  Tensor v;
  v.shape = s;
  v.dtype = g.tensors[t].dtype;
  v.role = g.tensors[t].role == TensorRole::Gradient ? TensorRole::Gradient
                                                     : TensorRole::Activation;
  v.viewOf = base(t);
  v.layout = Layout(st, offset);
  v.producer = g.tensors[t].producer;
  TensorId id = g.addTensor(std::move(v));
  g.gradient.push_back(kNone);
  return id;
}

TensorId Builder::transposed(TensorId t) {
  const Tensor &x = g.tensors[t];
  Shape s = x.shape;
  llvm::SmallVector<int64_t, 4> st = stridesOf(x.shape, x.layout);
  size_t r = s.size();
  std::swap(s[r - 1], s[r - 2]);
  std::swap(st[r - 1], st[r - 2]);
  return view(t, s, st, x.layout.offset());
}

/// [..., K] viewed as [rows, K]; nullopt-free: callers only flatten tensors whose batch
/// dimensions collapse (acceptsLayout guarantees it for matmul operands).
TensorId Builder::flattened(TensorId t) {
  const Tensor &x = g.tensors[t];
  Shape s{Dim{static_cast<int64_t>(numel(x.shape) / std::max<int64_t>(1, x.shape.back().size)), 0},
          x.shape.back()};
  auto st = viewStrides(x.shape, stridesOf(x.shape, x.layout), s);
  if (!st) // not expressible as a view: copy first
    return flattened(copyDense(t));
  return view(t, s, *st, x.layout.offset());
}

TensorId Builder::copyDense(TensorId t) {
  TensorId d = temp(g.tensors[t].shape, g.tensors[t].dtype, g.tensors[t].gradOf);
  emit(OpKind::Contiguous, {t}, {d}, SharedAttrs());
  return d;
}

/// A multi-output backward op: the gradients of the inputs in `which` (in that order).
void Builder::multiBackward(const Op &op, OpKind kind, llvm::SmallVector<TensorId, 3> in,
                            llvm::ArrayRef<unsigned> which) {
  OpAttrs a = op.attrs;
  a.gradMask = 0;
  llvm::SmallVector<TensorId, 3> outs;
  uint32_t acc = 0;
  for (unsigned i : which) {
    if (i >= op.inputs.size())
      continue;
    TensorId x = op.inputs[i];
    if (!needs(x))
      continue;
    a.gradMask |= 1u << i;
    if (accumulateNext(x))
      acc |= 1u << outs.size();
    outs.push_back(gradOf(x));
  }
  if (!outs.empty())
    emit(kind, in, outs, a, acc);
}

// ------------------------------------------------------------------------------------------
// The table: one entry per kind, indexed by ir/Ops.def's order. Each backward<ID> is defined by
// the BACKWARD or NO_BACKWARD line of its family's file.

namespace {
const BackwardRule *const kBackward[] = {
#define OP(ID, NAME, CLASS) &backward##ID,
#include "ir/Ops.def"
};
} // namespace

const BackwardRule &backwardFor(OpKind k) { return *kBackward[static_cast<unsigned>(k)]; }

void Builder::opBackward(OpId o) {
  const Op op = g.ops[o]; // a copy: emitting ops grows g.ops
  const BackwardRule &rule = backwardFor(op.kind);
  assert(rule.build && "runsBackward is false for a kind without a backward");
  current = o;
  TensorId dy = gradOf(op.outputs[0]);
  rule.build(*this, op, dy);
  current = kNone;
}

} // namespace backward
} // namespace tally
