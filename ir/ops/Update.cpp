// The optimizer step's rules: the ops step assembly adds after the backward
// (passes/Backward.cpp): sum_squares (the overflow check of loss scaling), scale,
// optimizer_update and zero_grad. docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

namespace tally::oprules {

namespace {

/// sum_squares(g...): Σ g² in fp32 over the gradients (the overflow check of loss scaling).
bool inferSumSquares(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &) {
  outs.push_back({Shape(), Dtype::F32});
  return true;
}
struct SumSquaresCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    Terms<C> t{c};
    for (unsigned i = 0; i < c.op.inputs.size(); ++i)
      t.add(c.lit(2) * c.numelIn(i));
    c.note("a square and an add per gradient element");
    return t.total();
  }
};

/// zero_grad writes every gradient once.
struct ZeroGradCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("writes in place: no arithmetic counted");
    return c.lit(0);
  }
  template <class C> static Num<C> read(C &c) {
    c.note("reads nothing");
    return c.lit(0);
  }
  template <class C> static Num<C> written(C &c) {
    c.note("each gradient written once");
    return sumBytes(c, c.op.outputs, "out");
  }
};

/// optimizer_update(grads…) → params, in place: attrs.scalar FLOPs per parameter (the
/// optimizer's count, passes/Backward.cpp). Bytes: the gradients and parameters read, the
/// parameters written; the fp32 master copy and state traffic are priced by StepTime's
/// optimizer time from the precision policy.
struct OptimizerUpdateCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    Terms<C> params{c};
    for (TensorId t : c.op.outputs)
      params.add(c.product(c.g.tensors[t].shape, 0, c.g.tensors[t].shape.size()));
    c.note("the optimizer's FLOPs per parameter × the parameters");
    return c.lit(c.op.attrs->scalar) * c.quantity("P", params.total());
  }
  template <class C> static Num<C> read(C &c) {
    c.note("the gradients and the parameters");
    Terms<C> t{c};
    for (unsigned i = 0; i < c.op.inputs.size(); ++i)
      t.add(c.bytesOf(c.op.inputs[i], "in", i));
    for (unsigned i = 0; i < c.op.outputs.size(); ++i)
      t.add(c.bytesOf(c.op.outputs[i], "out", i));
    return t.total();
  }
  template <class C> static Num<C> written(C &c) {
    c.note("the parameters, in place");
    return sumBytes(c, c.op.outputs, "out");
  }
};

// The optimizer an update runs.
void printOptimizerUpdate(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {optimizer = " << op.attrs->optimizer << "}";
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE(ZeroGrad, inferGiven, ZeroGradCounts, executedDefault, savesNothing)
RULE(SumSquares, inferSumSquares, SumSquaresCounts, executedDefault, savesNothing)
RULE(Scale, inferGiven, ZeroGradCounts, executedDefault, savesNothing)
RULE_ATTRS(OptimizerUpdate, inferGiven, OptimizerUpdateCounts, executedDefault, savesNothing, &printOptimizerUpdate, nullptr)

} // namespace tally::oprules
