// The reduction family's rules: sum and mean, and the ops autodiff adds around them: reduce_to
// (a gradient summed over broadcast dimensions) and expand (the gradient of sum and mean).
// docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Reductions: sum and mean, over everything or one axis.

bool inferReduce(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  Dtype dt = op.kind == OpKind::Mean ? g.activationDtype : resultDtype(g, x.dtype);
  if (op.attrs->reduceAll) {
    outs.push_back({Shape(), dt});
    return true;
  }
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                opName(op.kind).str() + " dim " + std::to_string(op.attrs->dim) +
                    " is out of range for " + g.formatShape(x.shape));
  Shape shape = x.shape;
  if (op.attrs->keepDim)
    shape[axis] = Dim{1, 0};
  else
    shape.erase(shape.begin() + axis);
  outs.push_back({shape, dt});
  return true;
}

struct ReduceCounts : BaseCounts {
  /// One add per input element; mean also divides each output by the count.
  template <class C> static Num<C> flops(C &c) {
    if (c.op.kind == OpKind::Mean) {
      c.note("one add per input element, one divide per output");
      return c.numelIn(0) + c.n();
    }
    c.note("one add per input element");
    return c.numelIn(0);
  }
  /// sum: the gradient is broadcast, no arithmetic; mean: broadcast and divide by the count.
  template <class C> static Num<C> grad(C &c, unsigned) {
    if (c.op.kind == OpKind::Mean) {
      c.note("broadcast and divide by the count");
      return c.numelIn(0);
    }
    c.note("the gradient is broadcast: no arithmetic");
    return c.lit(0);
  }
};

// ---------------------------------------------------------------------------------------------
// The reductions and broadcasts of gradients autodiff adds.

/// reduce_to and expand: the target shape is an attribute (the shape of the gradient's tensor).
bool inferToShape(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  outs.push_back({op.attrs->newShape, in(g, op, 0).dtype});
  return true;
}

/// Summing the output gradient over broadcast dimensions: one add per element read.
struct ReduceToCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("one add per element read: the sum over the broadcast dimensions");
    return c.numelIn(0);
  }
};

/// The gradient of sum/mean: a broadcast, and for mean one multiply per element.
struct ExpandCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    if (!c.op.attrs->hasScalar) {
      c.note("a broadcast: no arithmetic");
      return c.lit(0);
    }
    c.note("a broadcast and one multiply per element (by 1 / count)");
    return c.n();
  }
};

// A reduction's axis, unless it reduces every element.
void printReduce(const Graph &, const Op &op, llvm::raw_ostream &os) {
  const OpAttrs &a = op.attrs;
  if (!a.reduceAll)
    os << " {dim = " << a.dim << ", keepdim = " << (a.keepDim ? "true" : "false") << "}";
}
std::string describeReduce(const Graph &, const Op &op) {
  const OpAttrs &a = op.attrs;
  return a.reduceAll ? "over every element"
                     : "dim = " + std::to_string(a.dim) + (a.keepDim ? ", keepdim" : "");
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE_ATTRS(Sum, inferReduce, ReduceCounts, executedDefault, savesNothing, &printReduce, &describeReduce)
RULE_ATTRS(Mean, inferReduce, ReduceCounts, executedDefault, savesNothing, &printReduce, &describeReduce)
RULE(ReduceTo, inferToShape, ReduceToCounts, executedDefault, savesNothing)
RULE(Expand, inferToShape, ExpandCounts, executedDefault, savesNothing)

} // namespace tally::oprules
