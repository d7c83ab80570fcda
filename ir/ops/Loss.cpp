// The loss family's rules: cross_entropy (logits and integer labels to a mean fp32 loss) and
// cross_entropy_backward. docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Cross entropy: logits [..., V] and integer labels [...] → the mean loss, a fp32 scalar.

bool inferCrossEntropy(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                       ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Tensor &logits = in(g, op, 0), &labels = in(g, op, 1);
  if (logits.shape.empty())
    return fail(err, ShapeErrorKind::Invalid, "cross_entropy logits must have a class dimension, got []");
  if (!isInteger(labels.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "cross_entropy labels must be integers, got " + nameOf(labels.dtype).str() +
                    g.formatShape(labels.shape));
  bool same = labels.shape.size() + 1 == logits.shape.size();
  for (size_t i = 0; same && i < labels.shape.size(); ++i)
    same = labels.shape[i].size == logits.shape[i].size;
  if (!same)
    return fail(err, ShapeErrorKind::Mismatch,
                "cross_entropy labels " + g.formatShape(labels.shape) +
                    " must have the shape of the logits " + g.formatShape(logits.shape) +
                    " without the last dimension");
  // (loss, logsumexp per row in fp32, which the backward reads).
  outs.push_back({Shape(), Dtype::F32});
  outs.push_back({labels.shape, Dtype::F32});
  return true;
}

/// Whether the logits are already fp32, so that the eager and Megatron losses' `.float()` is
/// the tensor itself, not a copy.
inline bool logitsFp32(const Graph &g, const Op &op) { return in(g, op, 0).dtype == Dtype::F32; }

struct CrossEntropyCounts : BaseCounts {
  /// N rows of V logits: max, subtract, exp, sum, log per logit; one add per row into the mean.
  /// The same for every kernel (CrossEntropyKernel): how the loss runs changes its bytes, not
  /// its arithmetic.
  template <class C> static Num<C> flops(C &c) {
    const Shape &logits = in(c.g, c.op, 0).shape;
    Num<C> N = c.rows(logits, "N");
    Num<C> V = c.dim("V", logits.back());
    c.note("max, subtract, exp, sum, log per logit; one add per row for the mean");
    return c.lit(5) * N * V + N;
  }
  template <class C> static Num<C> read(C &c) {
    bool fp32 = logitsFp32(c.g, c.op);
    switch (c.op.attrs->loss) {
    case CrossEntropyKernel::Eager:
      if (fp32) {
        c.note("eager (PyTorch's F.cross_entropy): log_softmax reads the fp32 logits; nll_loss the labels");
        return sumBytes(c, c.op.inputs, "in");
      }
      c.note("eager (PyTorch's F.cross_entropy on .float()): the cast reads the logits, log_softmax its "
             "fp32 copy (4 bytes each); nll_loss the labels");
      return c.bytesOf(c.op.inputs[0], "in", 0) + c.lit(4) * c.numelIn(0) + c.bytesOf(c.op.inputs[1], "in", 1);
    case CrossEntropyKernel::Megatron:
      c.note(fp32 ? "Megatron's vocab-parallel cross entropy: max, subtract, exp, sum and divide each read the "
                    "fp32 logits (4 bytes each); the labels"
                  : "Megatron's vocab-parallel cross entropy: the cast reads the logits, then max, subtract, "
                    "exp, sum and divide each read the fp32 copy (4 bytes each); the labels");
      if (fp32)
        return c.lit(5 * 4) * c.numelIn(0) + c.bytesOf(c.op.inputs[1], "in", 1);
      return c.bytesOf(c.op.inputs[0], "in", 0) + c.lit(5 * 4) * c.numelIn(0) + c.bytesOf(c.op.inputs[1], "in", 1);
    case CrossEntropyKernel::Fused: break;
    }
    return BaseCounts::read(c);
  }
  template <class C> static Num<C> written(C &c) {
    bool fp32 = logitsFp32(c.g, c.op);
    switch (c.op.attrs->loss) {
    case CrossEntropyKernel::Eager:
      c.note(fp32 ? "eager: log_softmax's fp32 output (4 bytes a logit); the loss and out1"
                  : "eager: the fp32 copy and log_softmax's fp32 output (4 bytes a logit each); the loss and out1");
      return c.lit(fp32 ? 4 : 8) * c.numelIn(0) + sumBytes(c, c.op.outputs, "out");
    case CrossEntropyKernel::Megatron:
      c.note(fp32 ? "Megatron's: subtract, exp and divide write in place (4 bytes a logit each); the loss and out1"
                  : "Megatron's: the fp32 copy, then subtract, exp and divide in place (4 bytes a logit each); the "
                    "loss and out1");
      return c.lit(fp32 ? 12 : 16) * c.numelIn(0) + sumBytes(c, c.op.outputs, "out");
    case CrossEntropyKernel::Fused: break;
    }
    c.note("the fp32 loss, and the logsumexp per row in fp32 (out1)");
    return sumBytes(c, c.op.outputs, "out");
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i != 0) {
      c.note("integer labels have no gradient");
      return c.lit(0);
    }
    c.note("exp(x - lse), minus the one-hot label, divided by N");
    return c.lit(3) * c.numelIn(0);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    const Shape &logits = in(g, op, 0).shape;
    r.transcendentals = numel(logits) + rowsOf(logits); // an exp per logit, a log per row
  }
};

void savedCrossEntropy(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                       std::vector<SavedTensor> &out) {
  if (!need(needGrad, 0))
    return;
  double fp32 = 4 * numel(in(g, op, 0).shape);
  switch (op.attrs->loss) {
  case CrossEntropyKernel::Eager: // log_softmax keeps its output, nll_loss its labels
    out.push_back({kNone, "log-probabilities (fp32)", fp32});
    keep(g, out, op.inputs[1], "labels");
    return;
  case CrossEntropyKernel::Megatron: // the softmax, computed in the fp32 copy in place
    out.push_back({kNone, "softmax (fp32)", fp32});
    keep(g, out, op.inputs[1], "labels");
    return;
  case CrossEntropyKernel::Fused: break;
  }
  keep(g, out, op.inputs[0], "logits");
  keep(g, out, op.inputs[1], "labels");
  keep(g, out, op.outputs[1], "logsumexp");
}

/// cross_entropy_backward(logits, labels, lse, dloss): dlogits.
bool inferCrossEntropyBackward(const Graph &g, const Op &op,
                               llvm::SmallVectorImpl<TensorType> &outs, ShapeError &err) {
  if (!expectInputs(op, 4, 4, err))
    return false;
  outs.push_back({in(g, op, 0).shape, in(g, op, 0).dtype});
  return true;
}
struct CrossEntropyBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("exp(x - lse), minus the one-hot label, divided by N");
    return c.lit(3) * c.numelIn(0);
  }
  // Inputs: logits, labels, logsumexp, dloss; the eager and Megatron backwards read their kept
  // fp32 buffer instead of the logits.
  template <class C> static Num<C> read(C &c) {
    bool fp32 = logitsFp32(c.g, c.op);
    Num<C> labels = c.bytesOf(c.op.inputs[1], "in", 1) + c.bytesOf(c.op.inputs[3], "in", 3);
    switch (c.op.attrs->loss) {
    case CrossEntropyKernel::Eager:
      c.note(fp32 ? "eager: log_softmax's backward reads nll_loss's fp32 gradient and the kept "
                    "log-probabilities (4 bytes a logit each); the labels and dloss"
                  : "eager: log_softmax's backward reads nll_loss's fp32 gradient and the kept "
                    "log-probabilities, the cast back reads its fp32 result (4 bytes a logit each); the "
                    "labels and dloss");
      return c.lit(fp32 ? 8 : 12) * c.numelIn(0) + labels;
    case CrossEntropyKernel::Megatron:
      c.note(fp32 ? "Megatron's: the scale in place reads the kept softmax (4 bytes a logit); the labels and dloss"
                  : "Megatron's: the scale in place reads the kept softmax, the cast back its result (4 bytes "
                    "a logit each); the labels and dloss");
      return c.lit(fp32 ? 4 : 8) * c.numelIn(0) + labels;
    case CrossEntropyKernel::Fused: break;
    }
    return BaseCounts::read(c);
  }
  template <class C> static Num<C> written(C &c) {
    bool fp32 = logitsFp32(c.g, c.op);
    switch (c.op.attrs->loss) {
    case CrossEntropyKernel::Eager:
      if (fp32) {
        c.note("eager: nll_loss's dense fp32 gradient and log_softmax's, which is out0 (4 bytes a logit each)");
        return c.lit(8) * c.numelIn(0);
      }
      c.note("eager: nll_loss's dense fp32 gradient and log_softmax's (4 bytes a logit each), then out0 in "
             "the logits' dtype");
      return c.lit(8) * c.numelIn(0) + c.bytesOf(c.op.outputs[0], "out", 0);
    case CrossEntropyKernel::Megatron:
      if (fp32) {
        c.note("Megatron's: the scale in place, which is out0 (4 bytes a logit)");
        return c.lit(4) * c.numelIn(0);
      }
      c.note("Megatron's: the scale in place (4 bytes a logit), then out0 in the logits' dtype");
      return c.lit(4) * c.numelIn(0) + c.bytesOf(c.op.outputs[0], "out", 0);
    case CrossEntropyKernel::Fused: break;
    }
    return BaseCounts::written(c);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    // p = exp(x − lse) per logit (fused), exp of the kept log-probabilities (eager); Megatron's
    // kept the softmax itself.
    if (op.attrs->loss != CrossEntropyKernel::Megatron)
      r.transcendentals = numel(in(g, op, 0).shape);
  }
};

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE(CrossEntropy, inferCrossEntropy, CrossEntropyCounts, executedDefault, savedCrossEntropy)
RULE(CrossEntropyBackward, inferCrossEntropyBackward, CrossEntropyBackwardCounts, executedDefault, savesNothing)

} // namespace tally::oprules

namespace tally {

double backwardScratch(const Graph &g, const Op &op) {
  if (op.kind == OpKind::RmsNorm)
    return oprules::eagerNormScratch(g, op); // ir/ops/Norm.cpp
  // Eager: the backward holds log_softmax's kept output (4 bytes a logit, the extra buffer
  // savedCrossEntropy keeps), nll_loss's dense fp32 gradient and log_softmax's fp32 gradient at
  // once: 12 bytes a logit, of which the kept output and the logits' gradient (their dtype's
  // bytes, after the cast back) are buffers of their own in the walk.
  if (op.kind != OpKind::CrossEntropy || op.attrs->loss != CrossEntropyKernel::Eager)
    return 0;
  const Tensor &logits = g.tensors[op.inputs[0]];
  return std::max(0.0, 8 - storageBytes(logits.dtype)) * numel(logits.shape);
}

} // namespace tally
