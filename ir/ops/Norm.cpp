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

/// Whether the op is an rms_norm (or its backward) run as PyTorch model code writes it
/// (NormKernel::Eager): a kernel per PyTorch op, over an fp32 copy of the input. Its FLOPs are
/// the fused kernel's; its bytes, saved tensors, kernels and backward scratch are the
/// decomposition's (docs/time.md, "The norm as frameworks run it").
bool eagerRms(const Op &op) {
  return (op.kind == OpKind::RmsNorm || op.kind == OpKind::RmsNormBackward) && op.attrs->norm == NormKernel::Eager;
}
/// Whether the eager norm's input is already fp32, so that x.float() and the cast back are the
/// tensor itself, not a copy.
bool eagerInputFp32(const Graph &g, const Op &op) { return in(g, op, 0).dtype == Dtype::F32; }

struct NormCounts : BaseCounts {
  template <class C> static Num<C> read(C &c) {
    if (!eagerRms(c.op))
      return BaseCounts::read(c);
    Num<C> n = c.numelIn(0), r = c.rows(in(c.g, c.op, 0).shape, "rows");
    Num<C> rest = c.bytesOf(c.op.outputs[0], "out", 0) + c.bytesOf(c.op.inputs[1], "in", 1) + c.lit(12) * r;
    if (eagerInputFp32(c.g, c.op)) {
      c.note("eager (x * rsqrt(x.pow(2).mean(-1) + eps), times the weight; x fp32): pow, mean and the multiply "
             "read x; the weight's multiply the normalised x and the weight; + eps, rsqrt and the multiply the "
             "row statistic (4 bytes a row each)");
      return c.lit(3) * c.bytesOf(c.op.inputs[0], "in", 0) + rest;
    }
    c.note("eager (x.float(), pow(2), mean, + eps, rsqrt, multiply, cast back, times the weight): the cast reads "
           "x; pow, mean, the multiply and the cast back each read an fp32 tensor (4 bytes an element); the "
           "weight's multiply the cast result and the weight; + eps, rsqrt and the multiply the row statistic "
           "(4 bytes a row each)");
    return c.bytesOf(c.op.inputs[0], "in", 0) + c.lit(16) * n + rest;
  }
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
    if (eagerRms(c.op)) {
      Num<C> n = c.numelIn(0), r = c.rows(in(c.g, c.op, 0).shape, "rows");
      Num<C> rest = c.bytesOf(c.op.outputs[0], "out", 0) + c.lit(8) * r + c.bytesOf(c.op.outputs[1], "out", 1);
      if (eagerInputFp32(c.g, c.op)) {
        c.note("eager, x fp32: pow's and the multiply's fp32 results (4 bytes an element each), out0; the mean "
               "and + eps (4 bytes a row each), rsqrt's result out1");
        return c.lit(8) * n + rest;
      }
      c.note("eager: the fp32 copy, pow's and the multiply's fp32 results (4 bytes an element each), the cast "
             "back in x's dtype, out0; the mean and + eps (4 bytes a row each), rsqrt's result out1");
      return c.lit(12) * n + c.bytesOf(c.op.inputs[0], "in", 0) + rest;
    }
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
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    if (eagerRms(op)) // cast, pow, mean, + eps, rsqrt, multiply, cast back, weight
      r.kernels = eagerInputFp32(g, op) ? 6 : 8;
  }
};

/// What autograd keeps of the eager norm: for x's gradient the fp32 copy (pow's and the
/// multiply's input: one tensor) and rsqrt's result; for the weight's the normalised x in x's
/// dtype (the weight's multiply's other operand); the weight itself (a parameter).
void savedEagerRms(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad, std::vector<SavedTensor> &out) {
  const double n = numel(in(g, op, 0).shape);
  if (need(needGrad, 0)) {
    if (eagerInputFp32(g, op))
      keep(g, out, op.inputs[0], "input");
    else
      out.push_back({kNone, "fp32 copy of the input", 4 * n});
    keep(g, out, op.outputs[1], "row statistics");
    keep(g, out, op.inputs[1], "weight");
  }
  if (need(needGrad, 1))
    out.push_back({kNone, "normalised input (eager: the weight's multiply's operand)", g.bytes(op.inputs[0])});
}

void savedNorm(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
               std::vector<SavedTensor> &out) {
  if (!anyNeed(needGrad))
    return;
  if (eagerRms(op))
    return savedEagerRms(g, op, needGrad, out);
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

/// The eager rms_norm's backward as autograd runs it, per element of x (n) and per row (r):
/// the weight's multiply's backward (dy·w for x; dy times the kept normalised x, summed over
/// rows, for the weight), the cast to fp32, the multiply's backward (g·rsqrt; g·x summed over
/// the row), rsqrt's (three row kernels), the mean's (expanded over the row), pow's (x.pow(1),
/// times 2, times the gradient), the two gradients of the fp32 copy added, the cast back.
struct EagerRmsBackward {
  template <class C> static Num<C> read(C &c) {
    Num<C> n = c.numelIn(0), r = c.rows(in(c.g, c.op, 0).shape, "rows");
    Num<C> dy = c.bytesOf(c.op.inputs[3], "in", 3);
    Terms<C> t{c};
    if (gradWanted(c.op, 1))
      t.add(c.lit(3) * dy); // dy and the kept normalised x (x's dtype), then the product's sum
    if (gradWanted(c.op, 0)) {
      bool fp32 = eagerInputFp32(c.g, c.op);
      t.add(dy + c.bytesOf(c.op.inputs[1], "in", 1)); // dy·w
      if (!fp32)
        t.add(dy); // the cast to fp32
      t.add(c.lit(fp32 ? 40 : 44) * n + c.lit(24) * r);
    }
    c.note(eagerInputFp32(c.g, c.op)
               ? "eager, x fp32: the weight's multiply's backward reads dy and w (dx) and dy and the normalised x, "
                 "then their product (dw); the multiply's, pow's and the sum of the two gradients read 40 bytes an "
                 "element, the row kernels 24 bytes a row"
               : "eager: the weight's multiply's backward reads dy and w (dx) and dy and the normalised x, then "
                 "their product (dw); the cast reads dy·w; the multiply's, pow's, the sum and the cast back read "
                 "44 bytes an element, the row kernels 24 bytes a row");
    return t.total();
  }
  template <class C> static Num<C> written(C &c) {
    Num<C> n = c.numelIn(0), r = c.rows(in(c.g, c.op, 0).shape, "rows");
    Num<C> dy = c.bytesOf(c.op.inputs[3], "in", 3);
    Terms<C> t{c};
    if (gradWanted(c.op, 1))
      t.add(dy + c.bytesOf(c.op.outputs[gradWanted(c.op, 0) ? 1 : 0], "out", gradWanted(c.op, 0) ? 1 : 0));
    if (gradWanted(c.op, 0)) {
      bool fp32 = eagerInputFp32(c.g, c.op);
      t.add(dy + c.bytesOf(c.op.outputs[0], "out", 0)); // dy·w; dx
      t.add(c.lit(fp32 ? 24 : 32) * n + c.lit(16) * r);
    }
    c.note("eager: dy·w and the weight's product in dy's dtype, dw, dx; the fp32 gradients of the cast, the "
           "multiply, the mean, pow and their sum (4 bytes an element each), the row kernels' 16 bytes a row");
    return t.total();
  }
  static double kernelCount(const Graph &g, const Op &op) {
    double k = 0;
    if (gradWanted(op, 1))
      k += 2; // dy times the normalised x, its sum over rows
    if (gradWanted(op, 0)) // dy·w, the multiply's 3, rsqrt's 3, the mean's, pow's 3, the sum; the casts
      k += 12 + (eagerInputFp32(g, op) ? 0 : 2);
    return k;
  }
};

struct NormBackwardCounts : BaseCounts {
  template <class C> static Num<C> read(C &c) {
    return eagerRms(c.op) ? EagerRmsBackward::read(c) : BaseCounts::read(c);
  }
  template <class C> static Num<C> written(C &c) {
    return eagerRms(c.op) ? EagerRmsBackward::written(c) : BaseCounts::written(c);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    if (eagerRms(op))
      r.kernels = EagerRmsBackward::kernelCount(g, op);
  }
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

} // namespace

double eagerNormScratch(const Graph &g, const Op &op) {
  // At the sum of the fp32 copy's two gradients (the multiply's and pow's) both and their sum
  // are held, 4 bytes an element each; with x fp32 the sum is dx itself, a buffer of the walk.
  if (op.kind != OpKind::RmsNorm || !eagerRms(op))
    return 0;
  return (eagerInputFp32(g, op) ? 8 : 12) * numel(in(g, op, 0).shape);
}

namespace {

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
