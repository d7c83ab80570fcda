// The matmul family's rules: matmul's output shape with numpy's batch broadcasting, its
// 2·M·N·K FLOPs, and the operands its backward keeps. docs/counting.md states the same rules as
// formulas; keep the two in step.
#include "ir/ops/OpsCommon.h"

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Matmul: A [..., M, K] @ B [..., K, N] (batch dims broadcast); a 1-D A is [K] (no M), a 1-D B
// is [K] (no N), as in numpy.

bool inferMatmul(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Shape &a = in(g, op, 0).shape, &b = in(g, op, 1).shape;
  auto both = [&] { return g.formatShape(a) + " @ " + g.formatShape(b); }; // failures only
  if (a.empty() || b.empty())
    return fail(err, ShapeErrorKind::Matmul, "matmul needs operands of rank 1 or more: " + both());
  const Dim &ka = a.back();
  const Dim &kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka.size != kb.size)
    return fail(err, ShapeErrorKind::Matmul, "matmul inner dimensions differ: " + both());
  Shape batchA(a.begin(), a.end() - std::min<size_t>(a.size(), 2));
  Shape batchB(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  Shape shape;
  if (!broadcastShapes(batchA, batchB, shape))
    return fail(err, ShapeErrorKind::Matmul,
                "matmul batch dimensions cannot be broadcast: " + both());
  if (a.size() >= 2)
    shape.push_back(a[a.size() - 2]);
  if (b.size() >= 2)
    shape.push_back(b.back());
  outs.push_back({shape, g.activationDtype});
  return true;
}

struct MatmulCounts : BaseCounts {
  /// 2·M·N·K·batch (no M for a 1-D A, no N for a 1-D B).
  template <class C> static Num<C> product(C &c) {
    const Shape &a = in(c.g, c.op, 0).shape, &w = in(c.g, c.op, 1).shape;
    const Shape &out = out0(c.g, c.op).shape;
    bool hasM = a.size() >= 2, hasN = w.size() >= 2;
    size_t batchDims = out.size() - (hasM ? 1 : 0) - (hasN ? 1 : 0);
    Num<C> t = c.lit(2);
    if (hasM)
      t = t * c.dim("M", out[batchDims]);
    if (hasN)
      t = t * c.dim("N", out.back());
    t = t * c.dim("K", a.back());
    if (batchDims > 0)
      t = t * c.quantity("batch", c.product(out, 0, batchDims));
    return t;
  }
  template <class C> static Num<C> flops(C &c) {
    c.note("a multiply-add counts 2 FLOPs");
    return product(c);
  }
  /// dA = dC·Bᵀ and dB = Aᵀ·dC are each a matmul of the same size as the forward.
  template <class C> static Num<C> grad(C &c, unsigned i) {
    c.note(i == 0 ? "dA = dC·Bᵀ: a matmul of the forward's size"
                  : "dB = Aᵀ·dC: a matmul of the forward's size");
    return product(c);
  }
  static void finish(const Graph &, const Op &, ForwardCost &r) { r.matmulFlops = r.flops; }
};

void savedMatmul(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                 std::vector<SavedTensor> &out) {
  if (need(needGrad, 1))
    keep(g, out, op.inputs[0], "input");
  if (need(needGrad, 0))
    keep(g, out, op.inputs[1], "input");
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE(Matmul, inferMatmul, MatmulCounts, executedDefault, savedMatmul)

} // namespace tally::oprules

namespace tally {

// ---------------------------------------------------------------------------------------------
// A matmul by a weight in fp8 (Transformer Engine's Linear; ir/OpRules.h, Fp8GemmBytes).

Fp8GemmBytes fp8GemmBytes(const Graph &g, const Op &op, const Fp8Storage &s, bool dgrad,
                          bool wgrad) {
  Fp8GemmBytes r;
  if (op.kind != OpKind::Matmul || op.inputs.size() != 2 || op.outputs.empty())
    return r;
  bool w0 = g.isParamStorage(op.inputs[0]), w1 = g.isParamStorage(op.inputs[1]);
  if (w0 == w1)
    return r;
  const Tensor &x = g.tensors[op.inputs[w0 ? 1 : 0]], &w = g.tensors[op.inputs[w0 ? 0 : 1]];
  const Tensor &y = g.tensors[op.outputs[0]];
  double bx = storageBytes(x.dtype), bw = storageBytes(w.dtype), by = storageBytes(y.dtype);
  double q = s.bytes;
  r.activation = numel(x.shape);
  r.weight = numel(w.shape);
  r.output = numel(y.shape);
  r.forward = (r.activation + r.weight) * q + r.output * by;
  if (dgrad) // dX = dY·Wᵀ
    r.backward += (r.output + r.weight) * q + r.activation * bx;
  if (wgrad) // dW = Xᵀ·dY
    r.backward += (r.activation + r.output) * q + r.weight * bw;
  // X: the forward's copy, and its transpose when the weight gradient reads it; dY: one copy
  // per backward GEMM; W: the forward's copy and the transpose the data gradient reads.
  double xCopies = wgrad ? s.copies : 1, yCopies = dgrad && wgrad ? s.copies : 1;
  double wCopies = dgrad ? s.copies : 1;
  r.inputCast = r.activation * (bx + xCopies * q);
  r.gradCast = dgrad || wgrad ? r.output * (by + yCopies * q) : 0;
  r.weightCast = r.weight * (bw + wCopies * q);
  r.weightCopies = r.weight * wCopies * q;
  r.savedInput = wgrad ? r.activation * q : 0;
  return r;
}

} // namespace tally
