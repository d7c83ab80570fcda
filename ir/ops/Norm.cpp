// The normalisation family's rules: softmax, layer norm and RMS norm (shapes, FLOPs, the row
// statistics their backward reads), and their backward ops (softmax_backward,
// layer_norm_backward, rms_norm_backward). docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Softmax over one axis; layer norm and RMS norm over the last axis.

bool inferSoftmax(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "softmax dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  outs.push_back({x.shape, g.activationDtype});
  return true;
}

struct SoftmaxCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("max, subtract, exp, sum, divide per element");
    return c.lit(5) * c.n();
  }
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note("y·(g - Σ g·y) per element");
    return c.lit(4) * c.n();
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    r.transcendentals = 2 * outNumel(g, op); // the runtime evaluates exp for the sum, then again
  }
};

void savedSoftmax(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                  std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.outputs[0], "output");
}

bool isLayerNorm(const Op &op) { return op.kind == OpKind::LayerNorm; }

/// Whether a norm or its backward scales by a weight: layer_norm(x) (no weight and no bias,
/// PyTorch's elementwise_affine = False, OLMo 1) has one input, its backward
/// layer_norm_backward(x, mean, rstd, dy) four; every other form has a weight.
bool normHasWeight(const Op &op) {
  if (op.kind == OpKind::LayerNorm)
    return op.inputs.size() >= 2;
  if (op.kind == OpKind::LayerNormBackward)
    return op.inputs.size() == 5;
  return true;
}

bool inferNorm(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
               ShapeError &err) {
  if (!expectInputs(op, isLayerNorm(op) ? 1 : 2, isLayerNorm(op) ? 3 : 2, err))
    return false;
  const Shape &x = in(g, op, 0).shape;
  if (x.empty())
    return fail(err, ShapeErrorKind::Invalid, opName(op.kind).str() + " needs a tensor of rank 1 or more, got []");
  for (unsigned i = 1; i < op.inputs.size(); ++i) {
    const Shape &w = in(g, op, i).shape;
    if (w.size() != 1 || w[0].size != x.back().size)
      return fail(err, ShapeErrorKind::Mismatch,
                  opName(op.kind).str() + (i == 1 ? " weight " : " bias ") + g.formatShape(w) +
                      " does not match the last dimension of " + g.formatShape(x));
  }
  // The row statistics the backward reads, fp32 per row: (y, mean, rstd) for layer norm,
  // (y, rstd) for RMS norm.
  Shape rows(x.begin(), x.end() - 1);
  outs.push_back({x, g.activationDtype});
  if (isLayerNorm(op))
    outs.push_back({rows, Dtype::F32});
  outs.push_back({rows, Dtype::F32});
  return true;
}

/// The input gradient's FLOPs per element: 12 for layer norm (11 without a weight: no g = w·dy),
/// 8 for RMS norm; the forward's grad(0) and the backward op's count both read it.
int normDxFlops(const Op &op) {
  if (op.kind == OpKind::LayerNorm || op.kind == OpKind::LayerNormBackward)
    return normHasWeight(op) ? 12 : 11;
  return 8;
}

struct NormCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    if (isLayerNorm(c.op) && !normHasWeight(c.op)) {
      c.note("mean, variance and normalise per element (no weight, no bias)");
      return c.lit(6) * c.n();
    }
    if (isLayerNorm(c.op)) {
      c.note("mean, variance, normalise, scale and shift per element");
      return c.lit(8) * c.n();
    }
    c.note("square, mean, rsqrt-scale and weight per element");
    return c.lit(5) * c.n();
  }
  template <class C> static Num<C> written(C &c) {
    c.note(isLayerNorm(c.op)
               ? "the output, and the row statistics: mean and rstd in fp32 (out1, out2)"
               : "the output, and the row statistics: rstd in fp32 (out1)");
    return sumBytes(c, c.op.outputs, "out");
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i == 0) {
      c.note(normHasWeight(c.op) ? "the input gradient" : "the input gradient (no weight to scale dy by)");
      return c.lit(normDxFlops(c.op)) * c.n();
    }
    c.note(i == 1 ? "the weight: Σ over rows of g·x̂" : "the bias: Σ over rows of g");
    return c.n();
  }
};

void savedNorm(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
               std::vector<SavedTensor> &out) {
  if (!anyNeed(needGrad))
    return;
  keep(g, out, op.inputs[0], "input");
  for (size_t i = 1; i < op.outputs.size(); ++i)
    keep(g, out, op.outputs[i], "row statistics");
  if (need(needGrad, 0) && normHasWeight(op))
    keep(g, out, op.inputs[1], "weight"); // dx scales by the weight (a parameter, already resident)
}

// ---------------------------------------------------------------------------------------------
// The backward ops of the normalisations.

struct SoftmaxBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("y·(g - Σ g·y) per element");
    return c.lit(4) * c.n();
  }
};

/// layer_norm_backward(x, w, mean, rstd, dy) and rms_norm_backward(x, w, rstd, dy): the
/// gradients of x, the weight and the bias that gradMask asks for, in that order. Without a
/// weight, layer_norm_backward(x, mean, rstd, dy) gives dx alone.
bool inferNormBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                       ShapeError &err) {
  bool ln = op.kind == OpKind::LayerNormBackward;
  if (!expectInputs(op, 4, ln ? 5 : 4, err))
    return false;
  const Tensor &x = in(g, op, 0);
  if (gradWanted(op, 0))
    outs.push_back({x.shape, in(g, op, static_cast<unsigned>(op.inputs.size() - 1)).dtype}); // dy's
  if (!normHasWeight(op)) {
    if (op.attrs->gradMask & ~1u)
      return fail(err, ShapeErrorKind::Invalid,
                  "layer_norm_backward without a weight has no weight or bias gradient");
    return true;
  }
  const Tensor &w = in(g, op, 1);
  for (unsigned i = 1; i <= (ln ? 2u : 1u); ++i)
    if (gradWanted(op, i))
      outs.push_back({w.shape, w.dtype});
  return true;
}

struct NormBackwardCounts : BaseCounts {
  /// dx (12 per element for layer norm, 8 for RMS norm), the weight's and the bias's sums over
  /// rows (1 per element each), as gradMask asks.
  template <class C> static Num<C> flops(C &c) {
    Num<C> n = c.numelIn(0);
    Terms<C> t{c};
    if (gradWanted(c.op, 0))
      t.add(c.lit(normDxFlops(c.op)) * n);
    if (gradWanted(c.op, 1))
      t.add(n);
    if (gradWanted(c.op, 2))
      t.add(n);
    c.note("the input gradient, then Σ over rows for the weight and the bias, as asked");
    return t.total();
  }
};

// The norms' epsilon and softmax's axis, as --emit=ir prints them and explain words them.
void printEps(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {eps = " << significant(op.attrs->eps) << "}";
}
std::string describeEps(const Graph &, const Op &op) { return "eps = " + formatG(op.attrs->eps); }

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE_ATTRS(Softmax, inferSoftmax, SoftmaxCounts, executedDefault, savedSoftmax, &printDim, &describeDim)
RULE_ATTRS(LayerNorm, inferNorm, NormCounts, executedDefault, savedNorm, &printEps, &describeEps)
RULE_ATTRS(RmsNorm, inferNorm, NormCounts, executedDefault, savedNorm, &printEps, &describeEps)
RULE(SoftmaxBackward, inferLikeLast, SoftmaxBackwardCounts, executedDefault, savesNothing)
RULE(LayerNormBackward, inferNormBackward, NormBackwardCounts, executedDefault, savesNothing)
RULE(RmsNormBackward, inferNormBackward, NormBackwardCounts, executedDefault, savesNothing)

} // namespace tally::oprules
