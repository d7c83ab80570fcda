// BackwardBuilder.h — the builder of the training step (passes/Backward.cpp), shared by its
// files; not a public header (passes/Passes.h declares buildTrainingStep).
//
// The builder is one object, `Builder`, that lives for one buildTrainingStep call and appends
// the backward ops to the step graph. What every rule uses — the gradient of a tensor, a
// temporary, emitting an op, how the next write of a gradient combines (step 2) — is defined
// here; the rest by job:
//   passes/Backward.cpp       steps 1, 2, 4 and 5: which ops run a backward, how each gradient
//                             is written, the optimizer phase, the compact step
//   passes/BackwardRules.cpp  step 3: what the backward builders share, and the table that
//                             indexes them by kind (passes/BackwardTable.h; each kind's
//                             builder is in its family's passes/Backward<Family>.cpp)
#pragma once

#include "passes/BackwardTable.h"
#include "passes/GradientShares.h"
#include "passes/Passes.h"

namespace tally {
namespace backward {

struct Builder {
  Graph &g;
  const Plan &plan;
  size_t forwardTensors;
  std::vector<bool> hasGrad;        ///< per forward base tensor: some op writes its gradient
  std::vector<uint8_t> mode;        ///< per base: how writes combine (Mode)
  std::vector<bool> written;        ///< per base: something already wrote it
  OpId current = kNone;             ///< the forward op whose backward is being built
  /// Which add operands' gradients are dy's buffer (no copy): the forward graph's shares
  /// (GradientSharesOnce, shared with the walks' facts) or `ownShares`.
  const GradientShares *shares = nullptr;
  GradientShares ownShares;
  AttrsPool attrsPool;

  enum Mode : uint8_t { Overwrite, Accumulate, SplitParts, ZeroFirst };

  Builder(Graph &g, const Plan &plan) : g(g), plan(plan), forwardTensors(g.tensors.size()) {}

  TensorId base(TensorId t) const {
    return g.tensors[t].viewOf == kNone ? t : g.tensors[t].viewOf;
  }
  bool isParam(TensorId t) const { return g.tensors[base(t)].role == TensorRole::Param; }
  bool needs(TensorId t) const { return gradientNeeded(g, t); }

  /// The gradient tensor of `t`: a dense tensor for a base, the same view of it for a view.
  TensorId gradOf(TensorId t) {
    if (g.gradient[t] != kNone)
      return g.gradient[t];
    TensorId b = base(t);
    if (b != t) {
      TensorId gb = gradOf(b);
      Tensor v;
      v.shape = g.tensors[t].shape;
      v.dtype = g.tensors[gb].dtype;
      v.role = TensorRole::Gradient;
      v.viewOf = gb;
      v.layout = g.tensors[t].layout;
      v.gradOf = t;
      TensorId id = g.addTensor(std::move(v));
      g.gradient.push_back(kNone);
      g.gradient[t] = id;
      return id;
    }
    Tensor d;
    d.shape = g.tensors[t].shape;
    d.dtype = g.tensors[t].role == TensorRole::Param ? plan.precision.grads : g.tensors[t].dtype;
    d.role = TensorRole::Gradient;
    d.gradOf = t;
    TensorId id = g.addTensor(std::move(d));
    g.gradient.push_back(kNone);
    g.gradient[t] = id;
    return id;
  }

  /// A temporary gradient-phase tensor (a local gradient of `of` before reduce_to, say).
  TensorId temp(const Shape &shape, Dtype dtype, TensorId of = kNone) {
    Tensor t;
    t.shape = shape;
    t.dtype = dtype;
    t.role = TensorRole::Gradient;
    t.gradOf = of;
    TensorId id = g.addTensor(std::move(t));
    g.gradient.push_back(kNone);
    return id;
  }

  /// Attributes made here are interned: the backward ops of every repeat copy derive equal ones.
  OpId emit(OpKind kind, llvm::SmallVector<TensorId, 3> inputs, llvm::SmallVector<TensorId, 3> outputs,
            const OpAttrs &attrs, uint32_t accumulate = 0, Phase phase = Phase::Backward) {
    return emit(kind, std::move(inputs), std::move(outputs), attrsPool.get(attrs), accumulate, phase);
  }
  OpId emit(OpKind kind, llvm::SmallVector<TensorId, 3> inputs, llvm::SmallVector<TensorId, 3> outputs,
            SharedAttrs attrs, uint32_t accumulate = 0, Phase phase = Phase::Backward) {
    Op op;
    op.kind = kind;
    op.inputs = std::move(inputs);
    op.outputs = std::move(outputs);
    op.attrs = std::move(attrs);
    op.phase = phase;
    op.forwardOp = phase == Phase::Backward ? current : kNone;
    op.accumulate = accumulate;
    if (current != kNone) { // its path is its forward op's and its kind (Graph::opPath)
      const Op &f = g.ops[current];
      op.instance = f.instance;
      op.range = f.range;
    }
    OpId id = static_cast<OpId>(g.ops.size());
    g.ops.push_back(std::move(op));
    for (TensorId t : g.ops.back().outputs) // a gradient's producer is its last writer
      if (g.tensors[t].role == TensorRole::Gradient)
        g.tensors[t].producer = id;
    return id;
  }

  /// Whether the next write of the gradient of `t` adds to what is there (step 2), and the
  /// zero fill that a mixed set of view writes needs before the first one.
  bool accumulateNext(TensorId t) {
    TensorId b = base(t);
    bool acc = true;
    switch (static_cast<Mode>(mode[b])) {
    case Accumulate: acc = true; break;
    case Overwrite: acc = written[b]; break;
    case SplitParts: acc = false; break;
    case ZeroFirst:
      if (!written[b]) {
        OpAttrs zero;
        zero.scalar = 0;
        emit(OpKind::Fill, {}, {gradOf(b)}, zero);
      }
      acc = true;
      break;
    }
    written[b] = true;
    return acc;
  }

  /// Writes `local` (computed at the op's output shape) into input `x`'s gradient: directly
  /// when the shapes agree, through reduce_to when `x` was broadcast.
  void writeGrad(TensorId x, TensorId local) {
    TensorId gx = gradOf(x);
    bool acc = accumulateNext(x);
    if (numel(g.tensors[local].shape) == numel(g.tensors[x].shape)) {
      emit(OpKind::Contiguous, {local}, {gx}, SharedAttrs(), acc ? 1 : 0);
      return;
    }
    OpAttrs a;
    a.newShape = g.tensors[x].shape;
    emit(OpKind::ReduceTo, {local}, {gx}, a, acc ? 1 : 0);
  }

  /// The output of a gradient computation for input `x` at shape `shape`: `x`'s gradient
  /// itself when no reduction is needed (then `acc` says whether to add), else a temporary.
  struct Target {
    TensorId t;
    bool direct, acc;
  };
  Target target(TensorId x, const Shape &shape) {
    if (numel(shape) == numel(g.tensors[x].shape)) {
      TensorId gx = gradOf(x);
      bool acc = accumulateNext(x);
      return {gx, true, acc};
    }
    return {temp(shape, g.activationDtype, x), false, false};
  }
  void finish(TensorId x, const Target &t) {
    if (!t.direct)
      writeGrad(x, t.t);
  }

  // ------------------------------------------------------------------------------------------
  // Step 3: the backward of one op, built by its kind's entry of the table (passes/
  // BackwardTable.h); what several kinds' builders share is here (passes/BackwardRules.cpp).
  TensorId view(TensorId t, const Shape &s, llvm::ArrayRef<int64_t> st, int64_t offset);
  TensorId transposed(TensorId t);
  TensorId flattened(TensorId t);
  TensorId copyDense(TensorId t);
  void multiBackward(const Op &op, OpKind kind, llvm::SmallVector<TensorId, 3> in,
                     llvm::ArrayRef<unsigned> which);
  void opBackward(OpId o);

  // ------------------------------------------------------------------------------------------
  // Steps 1 and 2 (passes/Backward.cpp): which ops run a backward, and how each gradient is
  // written.
  template <class F> void contributions(const Op &op, F f);
  bool runsBackward(const Op &op) const;
  void planWrites(size_t forwardOps);
};

} // namespace backward
} // namespace tally
