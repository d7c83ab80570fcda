// The view family's rules: split, reshape, transpose and slice, which share their input's
// storage: shape rules only, no FLOPs, no bytes. docs/counting.md states the same rules.
#include "ir/ops/OpsCommon.h"

#include <cstdint>
#include <optional>

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Views: split, reshape, transpose share their input's storage. They keep its dtype.

bool inferSplit(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "split dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  int64_t parts = op.attrs->parts;
  if (parts <= 0 || x.shape[axis].size % parts != 0)
    return fail(err, ShapeErrorKind::Mismatch,
                "cannot split dimension " + std::to_string(x.shape[axis].size) + " of " +
                    g.formatShape(x.shape) + " into " + std::to_string(parts) + " equal parts");
  Shape shape = x.shape;
  if (parts != 1)
    shape[axis] = Dim{x.shape[axis].size / parts, 0};
  for (int64_t i = 0; i < parts; ++i)
    outs.push_back({shape, x.dtype});
  return true;
}

bool inferReshape(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                  ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  Shape shape = op.attrs->newShape;
  // Failures only: formatting both shapes for every reshape was most of its cost.
  auto both = [&] { return g.formatShape(x.shape) + " to " + g.formatShape(shape); };
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i].size == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
      continue;
    }
    if (shape[i].size < 0)
      return fail(err, ShapeErrorKind::Invalid,
                  "cannot reshape " + both() + ": only one dimension may be -1, and none negative");
    if (__builtin_mul_overflow(known, shape[i].size, &known))
      return fail(err, ShapeErrorKind::Overflow,
                  "cannot reshape " + both() + ": too many elements");
  }
  std::optional<int64_t> total = checkedNumel(x.shape);
  if (!total)
    return fail(err, ShapeErrorKind::Overflow, "cannot reshape " + both() + ": too many elements");
  if (inferred >= 0) {
    if (known == 0 || *total % known != 0)
      return fail(err, ShapeErrorKind::Mismatch,
                  "cannot reshape " + both() + ": " + std::to_string(*total) +
                      " elements do not divide into the other dimensions");
    shape[inferred] = Dim{*total / known, 0};
  } else if (known != *total) {
    return fail(err, ShapeErrorKind::Mismatch,
                "cannot reshape " + both() + ": " + std::to_string(*total) + " elements, not " +
                    std::to_string(known));
  }
  outs.push_back({shape, x.dtype});
  return true;
}

bool inferTranspose(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t a, b;
  if (!normalizeAxis(op.attrs->transposeA, x.shape.size(), a) ||
      !normalizeAxis(op.attrs->transposeB, x.shape.size(), b))
    return fail(err, ShapeErrorKind::Invalid,
                "transpose axes " + std::to_string(op.attrs->transposeA) + " and " +
                    std::to_string(op.attrs->transposeB) + " are out of range for " +
                    g.formatShape(x.shape));
  Shape shape = x.shape;
  std::swap(shape[a], shape[b]);
  outs.push_back({shape, x.dtype});
  return true;
}

/// slice: `x[:, 0]`, `x[:, 1:]`, `x[::2]`. attrs.slices covers the leading axes; each keeps
/// `count` indices from `start` every `step`, and an integer subscript (drop) removes its axis.
bool inferSlice(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  const auto &sl = op.attrs->slices;
  if (sl.size() > x.shape.size())
    return fail(err, ShapeErrorKind::Invalid,
                std::to_string(sl.size()) + " subscripts for " + g.formatShape(x.shape) +
                    ", a tensor of rank " + std::to_string(x.shape.size()));
  Shape shape;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (i >= sl.size()) {
      shape.push_back(x.shape[i]);
      continue;
    }
    const SliceDim &d = sl[i];
    int64_t n = x.shape[i].size, span = 0, last = 0;
    bool bad = d.step <= 0 || d.start < 0 || d.count <= 0 || (d.drop && d.count != 1) ||
               __builtin_mul_overflow(d.count - 1, d.step, &span) ||
               __builtin_add_overflow(d.start, span, &last) || last >= n;
    if (bad)
      return fail(err, ShapeErrorKind::Invalid,
                  "subscript " + std::to_string(i) + " selects outside dimension " +
                      std::to_string(n) + " of " + g.formatShape(x.shape));
    if (!d.drop)
      shape.push_back(Dim{d.count, d.count == n ? x.shape[i].sym : 0});
  }
  outs.push_back({shape, x.dtype});
  return true;
}

struct ViewCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("a view: no arithmetic, no data moves");
    return c.lit(0);
  }
  template <class C> static Num<C> read(C &c) {
    c.note("a view shares its input's storage");
    return c.lit(0);
  }
  template <class C> static Num<C> written(C &c) { return read(c); }
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note("the gradient is a view of the output gradient");
    return c.lit(0);
  }
};

// The attributes of the views, as --emit=ir prints them and explain words them.
void printSplit(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {parts = " << op.attrs->parts << ", dim = " << op.attrs->dim << "}";
}
std::string describeSplit(const Graph &, const Op &op) {
  return "parts = " + std::to_string(op.attrs->parts) + ", dim = " + std::to_string(op.attrs->dim);
}
void printTranspose(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {dims = (" << op.attrs->transposeA << ", " << op.attrs->transposeB << ")}";
}
std::string describeTranspose(const Graph &, const Op &op) {
  return "axes " + std::to_string(op.attrs->transposeA) + " and " +
         std::to_string(op.attrs->transposeB);
}
void printReshape(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {shape = " << Graph::formatSizes(op.attrs->newShape) << "}";
}
std::string describeReshape(const Graph &g, const Op &op) {
  return "shape = " + g.formatShape(op.attrs->newShape);
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE_ATTRS(Split, inferSplit, ViewCounts, executedDefault, savesNothing, &printSplit, &describeSplit)
RULE_ATTRS(Reshape, inferReshape, ViewCounts, executedDefault, savesNothing, &printReshape, &describeReshape)
RULE_ATTRS(Transpose, inferTranspose, ViewCounts, executedDefault, savesNothing, &printTranspose, &describeTranspose)
RULE(Slice, inferSlice, ViewCounts, executedDefault, savesNothing)

} // namespace tally::oprules
