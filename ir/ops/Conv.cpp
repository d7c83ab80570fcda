// The convolution family's rules: conv2d, max_pool2d and avg_pool2d (NCHW), and their backward
// ops (conv2d_backward, pool2d_backward). docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

#include <cstdint>

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Convolution and pooling, NCHW: x [N, C, H, W]; conv2d's weight is [Cout, Cin, kh, kw] and
// its optional bias [Cout] (PyTorch's layout). Each spatial output size is
// floor((H + 2·pad − k) / stride) + 1.

/// The output extent of a window sliding over `n` with `k`, `stride`, `pad`; 0 when none fits.
int64_t windowOut(int64_t n, int64_t k, int64_t stride, int64_t pad) {
  int64_t padded = 0;
  if (stride <= 0 || k <= 0 || pad < 0 || __builtin_mul_overflow(pad, 2, &padded) ||
      __builtin_add_overflow(n, padded, &padded) || padded < k)
    return 0;
  return (padded - k) / stride + 1;
}

bool inferConv2d(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 2, 3, err))
    return false;
  const Shape &x = in(g, op, 0).shape, &w = in(g, op, 1).shape;
  auto both = [&] { return g.formatShape(x) + " and weight " + g.formatShape(w); }; // failures only
  if (x.size() != 4 || w.size() != 4)
    return fail(err, ShapeErrorKind::Invalid,
                "conv2d expects x [batch, channels, height, width] and weight [out, in, kh, kw], got " +
                    both());
  if (w[1].size != x[1].size)
    return fail(err, ShapeErrorKind::Mismatch,
                "conv2d weight has " + std::to_string(w[1].size) + " input channels, x has " +
                    std::to_string(x[1].size) + ": " + both());
  if (op.inputs.size() == 3) {
    const Shape &b = in(g, op, 2).shape;
    if (b.size() != 1 || b[0].size != w[0].size)
      return fail(err, ShapeErrorKind::Mismatch,
                  "conv2d bias " + g.formatShape(b) + " should be [" + std::to_string(w[0].size) +
                      "], one per output channel");
  }
  int64_t ho = windowOut(x[2].size, w[2].size, op.attrs->strides[0], op.attrs->pads[0]);
  int64_t wo = windowOut(x[3].size, w[3].size, op.attrs->strides[1], op.attrs->pads[1]);
  if (ho <= 0 || wo <= 0)
    return fail(err, ShapeErrorKind::Invalid,
                "conv2d kernel " + std::to_string(w[2].size) + "x" + std::to_string(w[3].size) +
                    " does not fit in " + g.formatShape(x) + " with padding " +
                    std::to_string(op.attrs->pads[0]) + ", " + std::to_string(op.attrs->pads[1]));
  outs.push_back({Shape{x[0], w[0], Dim{ho, 0}, Dim{wo, 0}}, g.activationDtype});
  return true;
}

struct Conv2dCounts : BaseCounts {
  /// 2·n·Cin·kh·kw: n = N·Cout·Hout·Wout output points, each a dot product of Cin·kh·kw.
  template <class C> static Num<C> conv(C &c) {
    const Shape &w = in(c.g, c.op, 1).shape;
    Num<C> t = c.lit(2) * c.n(); // one term at a time: the named quantities list in this order
    t = t * c.dim("Cin", w[1]);
    t = t * c.dim("kh", w[2]);
    return t * c.dim("kw", w[3]);
  }
  template <class C> static Num<C> flops(C &c) {
    if (c.op.inputs.size() < 3) {
      c.note("each output point is a dot product of Cin·kh·kw; a multiply-add counts 2 FLOPs");
      return conv(c);
    }
    c.note("each output point is a dot product of Cin·kh·kw (a multiply-add counts 2 FLOPs), "
           "plus its bias");
    return conv(c) + c.n();
  }
  /// dx (a transposed convolution) and dw (a correlation of x with dy) cost what the forward
  /// does; the bias's gradient sums dy over N, H, W.
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i == 2) {
      c.note("the bias: Σ of the output gradient over N, H and W");
      return c.n();
    }
    c.note(i == 0 ? "dx: a transposed convolution of the forward's size"
                  : "dw: a correlation of x with dy, of the forward's size");
    return conv(c);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    r.matmulFlops = conv(c);
  }
};

void savedConv2d(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                 std::vector<SavedTensor> &out) {
  if (need(needGrad, 1))
    keep(g, out, op.inputs[0], "input");
  if (need(needGrad, 0))
    keep(g, out, op.inputs[1], "weight");
}

/// max_pool2d and avg_pool2d over (kh, kw) windows; max also returns the int32 index of each
/// window's maximum, which its backward reads.
bool inferPool(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
               ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  const OpAttrs &a = op.attrs;
  std::string name = opName(op.kind).str();
  if (x.shape.size() != 4)
    return fail(err, ShapeErrorKind::Invalid,
                name + " expects x [batch, channels, height, width], got " + g.formatShape(x.shape));
  for (int i = 0; i < 2; ++i)
    if (a.window[i] <= 0 || a.strides[i] <= 0 || a.pads[i] < 0 || a.pads[i] > a.window[i] / 2)
      return fail(err, ShapeErrorKind::Invalid,
                  name + " needs a positive window and stride, and padding at most half the "
                         "window, got window " + std::to_string(a.window[i]) + ", stride " +
                      std::to_string(a.strides[i]) + ", padding " + std::to_string(a.pads[i]));
  int64_t ho = windowOut(x.shape[2].size, a.window[0], a.strides[0], a.pads[0]);
  int64_t wo = windowOut(x.shape[3].size, a.window[1], a.strides[1], a.pads[1]);
  if (ho <= 0 || wo <= 0)
    return fail(err, ShapeErrorKind::Invalid,
                name + " window " + std::to_string(a.window[0]) + "x" + std::to_string(a.window[1]) +
                    " does not fit in " + g.formatShape(x.shape));
  Shape shape{x.shape[0], x.shape[1], Dim{ho, 0}, Dim{wo, 0}};
  outs.push_back({shape, resultDtype(g, x.dtype)});
  if (op.kind == OpKind::MaxPool2d)
    outs.push_back({shape, Dtype::I32});
  return true;
}

struct PoolCounts : BaseCounts {
  /// w = kh·kw, the window's elements.
  template <class C> static Num<C> window(C &c) {
    return c.quantity("w", c.named("kh", c.lit(static_cast<double>(c.op.attrs->window[0]))) *
                               c.named("kw", c.lit(static_cast<double>(c.op.attrs->window[1]))));
  }
  /// One comparison (max) or add (avg, whose last add is the division) per window element.
  template <class C> static Num<C> flops(C &c) {
    c.note(c.op.kind == OpKind::MaxPool2d ? "one comparison per window element"
                                          : "one add per window element (the last one divides)");
    Num<C> w = window(c);
    return w * c.n();
  }
  template <class C> static Num<C> written(C &c) {
    if (c.op.kind != OpKind::MaxPool2d)
      return BaseCounts::written(c);
    c.note("the output, and the int32 index of each window's maximum (out1)");
    return sumBytes(c, c.op.outputs, "out");
  }
  /// max: each output gradient added at its argmax (windows may overlap); avg: each output
  /// gradient divided by the window and added to every element of its window.
  template <class C> static Num<C> grad(C &c, unsigned) {
    if (c.op.kind == OpKind::MaxPool2d || c.op.attrs->of == OpKind::MaxPool2d) {
      c.note("each output gradient added at its window's maximum");
      return c.n();
    }
    c.note("each output gradient divided by the window, then added to each of its elements");
    Num<C> w = window(c);
    return (w + c.lit(1)) * c.n();
  }
};

void savedPool(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
               std::vector<SavedTensor> &out) {
  if (need(needGrad, 0) && op.kind == OpKind::MaxPool2d)
    keep(g, out, op.outputs[1], "argmax indices");
}

// ---------------------------------------------------------------------------------------------
// The backward ops of convolution and pooling.

/// conv2d_backward(x, w, dy): dx, dw, db as gradMask asks, in that order.
bool inferConv2dBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                         ShapeError &err) {
  if (!expectInputs(op, 3, 3, err))
    return false;
  Dtype dt = in(g, op, 2).dtype;
  if (gradWanted(op, 0))
    outs.push_back({in(g, op, 0).shape, dt});
  if (gradWanted(op, 1))
    outs.push_back({in(g, op, 1).shape, in(g, op, 1).dtype});
  if (gradWanted(op, 2))
    outs.push_back({Shape{in(g, op, 1).shape[0]}, in(g, op, 1).dtype});
  return true;
}

struct Conv2dBackwardCounts : BaseCounts {
  /// The forward's count from dy's shape (the forward output) and the weight: 2·n_dy·Cin·kh·kw.
  template <class C> static Num<C> conv(C &c) {
    const Shape &w = in(c.g, c.op, 1).shape;
    Num<C> t = c.lit(2) * c.numelIn(2);
    t = t * c.dim("Cin", w[1]);
    t = t * c.dim("kh", w[2]);
    return t * c.dim("kw", w[3]);
  }
  template <class C> static Num<C> flops(C &c) {
    Terms<C> t{c};
    if (gradWanted(c.op, 0))
      t.add(conv(c));
    if (gradWanted(c.op, 1))
      t.add(conv(c));
    if (gradWanted(c.op, 2))
      t.add(c.numelIn(2));
    c.note("dx and dw the forward's size each, the bias Σ of dy over N, H and W, as asked");
    return t.total();
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    double f = conv(c);
    r.matmulFlops = (gradWanted(op, 0) ? f : 0) + (gradWanted(op, 1) ? f : 0);
  }
};

/// pool2d_backward([indices,] dy): dx at attrs.newShape (x's shape); attrs.of is the pool.
bool inferPoolBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                       ShapeError &err) {
  if (!expectInputs(op, 1, 2, err))
    return false;
  outs.push_back({op.attrs->newShape, g.tensors[op.inputs.back()].dtype});
  return true;
}

struct PoolBackwardCounts : BaseCounts {
  /// max: one add per output gradient (at its argmax); avg: a divide and w adds per output
  /// gradient. attrs.of is the pool.
  template <class C> static Num<C> flops(C &c) {
    Num<C> dy = c.numelIn(static_cast<unsigned>(c.op.inputs.size() - 1));
    if (c.op.attrs->of == OpKind::MaxPool2d) {
      c.note("each output gradient added at its window's maximum");
      return dy;
    }
    c.note("each output gradient divided by the window, then added to each of its elements");
    return (PoolCounts::window(c) + c.lit(1)) * dy;
  }
};

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE(Conv2d, inferConv2d, Conv2dCounts, executedDefault, savedConv2d)
RULE(MaxPool2d, inferPool, PoolCounts, executedDefault, savedPool)
RULE(AvgPool2d, inferPool, PoolCounts, executedDefault, savedPool)
RULE(Conv2dBackward, inferConv2dBackward, Conv2dBackwardCounts, executedDefault, savesNothing)
RULE(PoolBackward, inferPoolBackward, PoolBackwardCounts, executedDefault, savesNothing)

} // namespace tally::oprules
