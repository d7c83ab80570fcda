// The data family's rules: ops that move or generate data without arithmetic: embedding and
// its backward, positions, next_tokens, concat, broadcast_to, contiguous, fill, and the gathers
// and scatters of mixture-of-experts routing (topk, gather, scatter_add). docs/counting.md
// states the same rules as formulas.
#include "ir/ops/OpsCommon.h"

#include <cstdint>

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Embedding: ids [...] (integers) gather rows of weight [V, d].

bool inferEmbedding(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Tensor &ids = in(g, op, 0), &w = in(g, op, 1);
  if (!isInteger(ids.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "embedding ids must be integers, got " + nameOf(ids.dtype).str() +
                    g.formatShape(ids.shape));
  if (w.shape.size() != 2)
    return fail(err, ShapeErrorKind::Invalid,
                "embedding weight must be [vocab, d], got " + g.formatShape(w.shape));
  Shape shape = ids.shape;
  shape.push_back(w.shape[1]);
  outs.push_back({shape, g.activationDtype});
  return true;
}

/// A gather (embedding, gather): n elements of the table input read at the integer indices
/// of the index input. No arithmetic; reads the indices and only the gathered elements; the
/// table's gradient is a scatter-add of the output gradient, the indices have none. `Words`
/// says which input is which and what explain notes.
template <class Words> struct GatherLikeCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("a gather: no arithmetic");
    return c.lit(0);
  }
  template <class C> static Num<C> read(C &c) {
    c.note(Words::read);
    return c.bytesOf(c.op.inputs[Words::index], "in", Words::index) +
           c.n() * c.lit(static_cast<double>(bytesOf(in(c.g, c.op, Words::table).dtype)));
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i != Words::table) {
      c.note(Words::noGrad);
      return c.lit(0);
    }
    c.note(Words::grad);
    return c.n();
  }
};

/// Embedding: the ids (input 0) pick rows of the table (input 1).
struct EmbeddingWords {
  static constexpr unsigned index = 0, table = 1;
  static constexpr const char *read = "the ids, and only the gathered rows of the table: n elements";
  static constexpr const char *noGrad = "integer ids have no gradient";
  static constexpr const char *grad = "a scatter-add of the output gradient into the gathered rows";
};
using EmbeddingCounts = GatherLikeCounts<EmbeddingWords>;

void savedEmbedding(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                    std::vector<SavedTensor> &out) {
  if (need(needGrad, 1))
    keep(g, out, op.inputs[0], "ids");
}

bool inferEmbeddingBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                            ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  outs.push_back({op.attrs->newShape, in(g, op, 1).dtype});
  return true;
}

/// embedding_backward(ids, dy): the weight's gradient [vocab, d] (newShape), a scatter-add.
struct EmbeddingBackwardCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("a scatter-add: one add per element of dy");
    return c.numelIn(1);
  }
};

// ---------------------------------------------------------------------------------------------
// Index generation and concatenation: no arithmetic, only data movement.

bool inferPositions(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, 0, 0, err))
    return false;
  const Shape &s = op.attrs->newShape;
  if (s.size() != 1 || s[0].size < 0)
    return fail(err, ShapeErrorKind::Invalid,
                "positions needs a length, got shape " + g.formatShape(s));
  outs.push_back({s, Dtype::I32});
  return true;
}

bool inferNextTokens(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &t = in(g, op, 0);
  if (!isInteger(t.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "next_tokens needs integer tokens, got " + nameOf(t.dtype).str() +
                    g.formatShape(t.shape));
  outs.push_back({t.shape, Dtype::I32});
  return true;
}

bool inferConcat(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 1, SIZE_MAX, err))
    return false;
  const Tensor &first = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, first.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "concat dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(first.shape));
  Shape shape = first.shape;
  bool floating = false;
  for (unsigned i = 0; i < op.inputs.size(); ++i) {
    const Tensor &t = in(g, op, i);
    floating |= isFloat(t.dtype);
    bool same = t.shape.size() == shape.size();
    for (size_t j = 0; same && j < shape.size(); ++j)
      same = j == axis || t.shape[j].size == shape[j].size;
    if (!same)
      return fail(err, ShapeErrorKind::Mismatch,
                  "concat along dim " + std::to_string(op.attrs->dim) + " needs equal other dimensions: " +
                      g.formatShape(first.shape) + " and " + g.formatShape(t.shape));
    if (i > 0) {
      if (__builtin_add_overflow(shape[axis].size, t.shape[axis].size, &shape[axis].size))
        return fail(err, ShapeErrorKind::Overflow, "concat result is too large along dim " +
                                                       std::to_string(op.attrs->dim));
      shape[axis].sym = 0;
    }
  }
  outs.push_back({shape, floating ? g.activationDtype : first.dtype});
  return true;
}

/// positions, next_tokens, concat: data movement, no arithmetic; integers or a view of the
/// output gradient as gradient.
struct DataCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("data movement: no arithmetic");
    return c.lit(0);
  }
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note(c.op.kind == OpKind::Concat ? "the gradient is a view of the output gradient"
                                       : "integer outputs have no gradient");
    return c.lit(0);
  }
};


/// broadcast_to(x, shape): numpy's rule, x's dims aligned from the right, each equal to the
/// target's or 1; a copy (a class token [1, 1, d] brought to [batch, 1, d] for concat).
bool inferBroadcastTo(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                      ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  Shape shape = op.attrs->newShape;
  bool ok = shape.size() >= x.shape.size();
  size_t lead = ok ? shape.size() - x.shape.size() : 0;
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    ok = shape[i].size >= 1;
    if (ok && i >= lead) {
      const Dim &d = x.shape[i - lead];
      ok = d.size == shape[i].size || d.size == 1;
      if (d.size == shape[i].size)
        shape[i] = d; // keeps its name
    }
  }
  if (!ok)
    return fail(err, ShapeErrorKind::Broadcast,
                "cannot broadcast " + g.formatShape(x.shape) + " to " + g.formatShape(op.attrs->newShape));
  outs.push_back({shape, resultDtype(g, x.dtype)});
  return true;
}

/// A copy; the gradient sums the output gradient over the broadcast dims, one add per output
/// element.
struct BroadcastToCounts : DataCounts {
  template <class C> static Num<C> grad(C &c, unsigned) {
    Num<C> n = c.n();
    if (C::value(n) == numel(in(c.g, c.op, 0).shape)) {
      c.note("nothing was broadcast: the output gradient itself");
      return c.lit(0);
    }
    c.note("the output gradient summed over the broadcast dimensions: one add per element");
    return n;
  }
};

// ---------------------------------------------------------------------------------------------
// Copies the lowering and autodiff add: contiguous and fill.

bool inferContiguous(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  outs.push_back({in(g, op, 0).shape, in(g, op, 0).dtype});
  return true;
}

/// contiguous, fill: a copy or a constant written, no arithmetic. A contiguous that `shares`
/// its input's buffer (an add's gradient passed on, passes/GradientShares.h) moves nothing.
struct CopyCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note(c.op.kind == OpKind::Fill ? "writes a constant: no arithmetic" : "a copy: no arithmetic");
    return c.lit(0);
  }
  template <class C> static Num<C> read(C &c) {
    if (!c.op.attrs->shares)
      return BaseCounts::read(c);
    c.note("the output is the input's buffer: nothing read");
    return c.lit(0);
  }
  template <class C> static Num<C> written(C &c) {
    if (!c.op.attrs->shares)
      return BaseCounts::written(c);
    c.note("the output is the input's buffer: nothing written");
    return c.lit(0);
  }
};

// ---------------------------------------------------------------------------------------------
// The routing of a mixture of experts (ir/ops/Moe.cpp): topk and gather, and scatter_add,
// the backward of both.

/// topk(x, k, dim): (the k largest values along dim, their i32 indices). One comparison per
/// element (a running top-k list, as softmax's max counts one per element).
bool inferTopK(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
               ShapeError &err) {
  if (!expectInputs(op, 1, 1, err))
    return false;
  const Tensor &x = in(g, op, 0);
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "topk dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  if (op.attrs->k <= 0 || op.attrs->k > x.shape[axis].size)
    return fail(err, ShapeErrorKind::Invalid,
                "topk k = " + std::to_string(op.attrs->k) + " must be between 1 and " +
                    std::to_string(x.shape[axis].size) + ", the size of dim " +
                    std::to_string(op.attrs->dim) + " of " + g.formatShape(x.shape));
  Shape shape = x.shape;
  shape[axis] = Dim{op.attrs->k, 0};
  outs.push_back({shape, resultDtype(g, x.dtype)});
  outs.push_back({shape, Dtype::I32});
  return true;
}

struct TopKCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("one comparison per element (a running top-k list)");
    return c.numelIn(0);
  }
  /// The values' gradient scattered into a zeroed gradient of x: one add per value.
  template <class C> static Num<C> grad(C &c, unsigned) {
    c.note("the values' gradient scattered into a zeroed gradient: one add each");
    return c.n();
  }
};

void savedTopK(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
               std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.outputs[1], "indices");
}

/// gather(x, indices, dim): out[i][j] = x[i][indices[i][j]] along dim (torch.gather); indices
/// have x's rank and at most its size in every other dimension.
bool inferGather(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                 ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  const Tensor &x = in(g, op, 0), &idx = in(g, op, 1);
  if (!isInteger(idx.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "gather indices must be integers, got " + nameOf(idx.dtype).str() +
                    g.formatShape(idx.shape));
  size_t axis;
  if (!normalizeAxis(op.attrs->dim, x.shape.size(), axis))
    return fail(err, ShapeErrorKind::Invalid,
                "gather dim " + std::to_string(op.attrs->dim) + " is out of range for " +
                    g.formatShape(x.shape));
  bool fits = idx.shape.size() == x.shape.size();
  for (size_t i = 0; fits && i < x.shape.size(); ++i)
    fits = i == axis || idx.shape[i].size <= x.shape[i].size;
  if (!fits)
    return fail(err, ShapeErrorKind::Mismatch,
                "gather indices " + g.formatShape(idx.shape) + " must have the rank of " +
                    g.formatShape(x.shape) + " and be no larger outside dim " +
                    std::to_string(op.attrs->dim));
  outs.push_back({idx.shape, x.dtype});
  return true;
}

/// Gather: the indices (input 1) pick elements of x (input 0).
struct GatherWords {
  static constexpr unsigned index = 1, table = 0;
  static constexpr const char *read = "the indices, and only the gathered elements: n of them";
  static constexpr const char *noGrad = "integer indices have no gradient";
  static constexpr const char *grad = "a scatter-add of the output gradient at the indices";
};
using GatherCounts = GatherLikeCounts<GatherWords>;

void savedGather(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                 std::vector<SavedTensor> &out) {
  if (need(needGrad, 0))
    keep(g, out, op.inputs[1], "indices");
}

/// scatter_add(indices, dy): a gradient of shape newShape, dy added at the indices along dim
/// (zero elsewhere unless it accumulates): the backward of topk and gather, one add per element.
bool inferScatterAdd(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                     ShapeError &err) {
  if (!expectInputs(op, 2, 2, err))
    return false;
  outs.push_back({op.attrs->newShape, in(g, op, 1).dtype});
  return true;
}
struct ScatterAddCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    c.note("one add per element of dy");
    return c.numelIn(1);
  }
};

// The data ops' axes, k and fill value, as --emit=ir prints them (explain words concat's).
void printTopK(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {k = " << op.attrs->k << ", dim = " << op.attrs->dim << "}";
}
void printFill(const Graph &, const Op &op, llvm::raw_ostream &os) {
  os << " {value = " << significant(op.attrs->scalar) << "}";
}
/// A contiguous that shares its input's buffer (an add's gradient passed on) says so.
void printContiguous(const Graph &, const Op &op, llvm::raw_ostream &os) {
  if (op.attrs->shares)
    os << " {shares}";
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE(Embedding, inferEmbedding, EmbeddingCounts, executedDefault, savedEmbedding)
RULE(EmbeddingBackward, inferEmbeddingBackward, EmbeddingBackwardCounts, executedDefault, savesNothing)
RULE(Positions, inferPositions, DataCounts, executedDefault, savesNothing)
RULE(NextTokens, inferNextTokens, DataCounts, executedDefault, savesNothing)
RULE_ATTRS(Concat, inferConcat, DataCounts, executedDefault, savesNothing, &printDim, &describeDim)
RULE(BroadcastTo, inferBroadcastTo, BroadcastToCounts, executedDefault, savesNothing)
RULE_ATTRS(Contiguous, inferContiguous, CopyCounts, executedDefault, savesNothing, &printContiguous, nullptr)
RULE_ATTRS(Fill, inferGiven, CopyCounts, executedDefault, savesNothing, &printFill, nullptr)
RULE_ATTRS(TopK, inferTopK, TopKCounts, executedDefault, savedTopK, &printTopK, nullptr)
RULE_ATTRS(Gather, inferGather, GatherCounts, executedDefault, savedGather, &printDim, nullptr)
RULE_ATTRS(ScatterAdd, inferScatterAdd, ScatterAddCounts, executedDefault, savesNothing, &printDim, nullptr)

} // namespace tally::oprules
