// One runtime call per op of the step (codegen/EmitStep.cpp, section 2): emitOp dispatches by
// op kind through the table (EmitTable.cpp) to one function per kind or family, the runtime's
// signatures (codegen/runtime/API.md) over the tensors' shapes and strides. This file holds the
// elementwise ops (broadcast strides; accumulate bits become the kernels' `+=`) and the ops that
// move or reduce data (copies, concat, broadcast, sums, embedding lookups, positions), and ends
// with their kinds' entries of the table; matmul, attention, norms and losses are in
// EmitLayers.cpp.
#include "codegen/EmitInternal.h"

#include <algorithm>

namespace tally::codegen::emit {

// ---- elementwise ---------------------------------------------------------------------------

bool Emitter::binary() {
  TensorId y = op->outputs[0];
  if (op->attrs->hasScalar) {
    TensorId x = op->inputs[0];
    if (!needDense(y, "the output") || !needDense(x, "the input") || !sameType({x, y}))
      return false;
    line(llvm::formatv("rt::binary_scalar<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7});", T(y),
                       binOp(op->kind), ptr(x), number(op->attrs->scalar),
                       boolean(op->attrs->scalarOnLeft), ptr(y), n(y), boolean(acc()))
             .str());
    return true;
  }
  TensorId ta = op->inputs[0], tb = op->inputs[1];
  if (!sameType({ta, tb, y}))
    return false;
  std::vector<int64_t> out = sizes(y);
  if (out.size() > 8)
    return fail("rank above 8");
  if (out.empty())
    out = {1};
  auto sa = shape(ta).empty() ? std::vector<int64_t>(out.size(), 0) : broadcastStrides(ta, out);
  auto sb = shape(tb).empty() ? std::vector<int64_t>(out.size(), 0) : broadcastStrides(tb, out);
  // A gradient written into a view (a split part) passes the view's strides.
  std::string os = dense(y) ? "" : ", dims{" + list(shape(y).empty() ? std::vector<int64_t>{0} : strides(y)) + "}";
  line(llvm::formatv("rt::binary<{0}>(ctx, {1}, {2}, dims{{{3}}, {4}, dims{{{5}}, {6}, dims{{{7}}, {8}, {9}{10});",
                     T(y), binOp(op->kind), ptr(ta), list(sa), ptr(tb), list(sb), ptr(y), list(out),
                     out.size(), boolean(acc()), os)
           .str());
  return true;
}

bool Emitter::divBackward() {
  TensorId out = op->outputs[0];
  if (op->attrs->hasScalar) {
    TensorId y = op->inputs[0], dy = op->inputs[1];
    if (!needDense(y, "the output") || !needDense(dy, "the output gradient") || !needDense(out, "the gradient") ||
        !sameType({y, dy, out}))
      return false;
    line(llvm::formatv("rt::div_scalar_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(out), ptr(y), ptr(dy),
                       number(op->attrs->scalar), ptr(out), n(out), boolean(acc()))
             .str());
    return true;
  }
  TensorId a = op->inputs[0], b = op->inputs[1], dy = op->inputs[2];
  if (!sameType({a, b, dy, out}))
    return false;
  std::vector<int64_t> sz = sizes(dy);
  if (sz.empty())
    sz = {1};
  if (sz.size() > 8)
    return fail("rank above 8");
  auto sa = shape(a).empty() ? std::vector<int64_t>(sz.size(), 0) : broadcastStrides(a, sz);
  auto sb = shape(b).empty() ? std::vector<int64_t>(sz.size(), 0) : broadcastStrides(b, sz);
  std::string ds = dense(dy) ? "nullptr" : "dims{" + list(strides(dy)) + "}";
  std::string os = dense(out) ? "nullptr" : "dims{" + list(strides(out)) + "}";
  if (n(out) != n(dy))
    return fail("the gradient of a division written at another shape");
  line(llvm::formatv("rt::div_bwd<{0}>(ctx, {1}, dims{{{2}}, {3}, dims{{{4}}, {5}, {6}, {7}, {8}, dims{{{9}}, {10}, {11});",
                     T(out), ptr(a), list(sa), ptr(b), list(sb), ptr(dy), ds, ptr(out), os, list(sz), sz.size(),
                     boolean(acc()))
           .str());
  return true;
}

bool Emitter::unary() {
  TensorId x = op->inputs[0], y = op->outputs[0];
  if (!needDense(x, "the input") || !needDense(y, "the output") || !sameType({x, y}))
    return false;
  if (acc() || op->phase == Phase::Backward) // a negated gradient, possibly added in place
    line(llvm::formatv("rt::unary_bwd<{0}>(ctx, {1}, nullptr, nullptr, {2}, {3}, {4}, {5});", T(y),
                       unOp(op->kind), ptr(x), ptr(y), n(y), boolean(acc()))
             .str());
  else
    line(llvm::formatv("rt::unary_fwd<{0}>(ctx, {1}, {2}, {3}, {4});", T(y), unOp(op->kind), ptr(x),
                       ptr(y), n(y))
             .str());
  return true;
}

bool Emitter::unaryBackward() {
  TensorId dx = op->outputs[0];
  TensorId dy = op->inputs.back();
  if (!needDense(dx, "the gradient") || !needDense(dy, "the output gradient"))
    return false;
  const OpEmit &of = emitFor(op->attrs->of);
  if (!of.backward)
    return fail("no " + title() + " backward for " + opName(op->attrs->of).str());
  return (this->*of.backward)();
}

bool Emitter::unaryGradient() {
  const OpAttrs &at = op->attrs;
  TensorId dx = op->outputs[0];
  TensorId dy = op->inputs.back();
  GradReads reads = unaryDef(at.of)->reads;
  if (reads == GradReads::Nothing) {
    line(llvm::formatv("rt::unary_bwd<{0}>(ctx, {1}, nullptr, nullptr, {2}, {3}, {4}, {5});", T(dx), unOp(at.of),
                       ptr(dy), ptr(dx), n(dx), boolean(acc()))
             .str());
    return true;
  }
  if (!sameType({op->inputs[0], dy, dx}))
    return false;
  if (reads == GradReads::Input)
    line(llvm::formatv("rt::unary_bwd<{0}>(ctx, {1}, {2}, nullptr, {3}, {4}, {5}, {6});", T(dx), unOp(at.of),
                       ptr(op->inputs[0]), ptr(dy), ptr(dx), n(dx), boolean(acc()))
             .str());
  else
    line(llvm::formatv("rt::unary_bwd<{0}>(ctx, {1}, nullptr, {2}, {3}, {4}, {5}, {6});", T(dx), unOp(at.of),
                       ptr(op->inputs[0]), ptr(dy), ptr(dx), n(dx), boolean(acc()))
             .str());
  return true;
}

bool Emitter::dropout() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}))
    return false;
  if (sequenceParallel() && seqDim(out[0]) >= 0) {
    // One rank's share of each row of the sequence: the Philox stream at its elements' places
    // in the whole tensor, so the mask is the one the whole tensor would draw.
    int64_t rows, chunk;
    seqRows(out[0], rows, chunk);
    line(llvm::formatv("for (int64_t row = 0; row < {0}; ++row)", rows).str());
    line(llvm::formatv("  rt::dropout_fwd<{0}>(ctx, {1} + row * {8}, {2} + row * {8}, {3}, {8}, {4}, {5}, {6}, (row * {7} + "
                       "tally_comm::tensor_rank()) * {8});",
                       T(out[0]), ptr(in[0]), ptr(out[0]),
                       out.size() > 1 ? ptr(out[1]) + " + row * " + std::to_string(chunk) : "nullptr", number(at.p),
                       seedExpr(), at.stream, plan.parallel.tensor, chunk)
             .str());
    return true;
  }
  line(llvm::formatv("rt::dropout_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7});", T(out[0]), ptr(in[0]),
                     ptr(out[0]), out.size() > 1 ? ptr(out[1]) : "nullptr", n(out[0]), number(at.p),
                     seedExpr(), at.stream)
           .str());
  return true;
}

bool Emitter::dropoutBackward() {
  const OpAttrs &at = op->attrs;
  TensorId dx = op->outputs[0];
  TensorId dy = op->inputs.back();
  line(llvm::formatv("rt::dropout_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8});", T(dx), ptr(dy),
                     ptr(op->inputs[0]), ptr(dx), n(dx), number(at.p), seedExpr(), at.stream, boolean(acc()))
           .str());
  return true;
}

bool Emitter::fill() {
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  if (!needDense(out[0], "the filled tensor"))
    return false;
  line(llvm::formatv("rt::fill<{0}>(ctx, {1}, {2}, {3});", T(out[0]), ptr(out[0]), number(at.scalar),
                     n(out[0]))
           .str());
  return true;
}

// ---- reductions, copies and data ----------------------------------------------------------

void Emitter::reduceDims(TensorId x, const OpAttrs &at, int64_t &outer, int64_t &axis, int64_t &inner) {
  outer = 1, axis = n(x), inner = 1;
  if (at.reduceAll)
    return;
  size_t d = 0;
  normalizeAxis(at.dim, shape(x).size(), d);
  outer = axis = inner = 1;
  for (size_t i = 0; i < shape(x).size(); ++i)
    (i < d ? outer : i == d ? axis : inner) *= shape(x)[i].size;
}

bool Emitter::reduction(bool mean) {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  int64_t outer, axis, inner;
  reduceDims(in[0], at, outer, axis, inner);
  if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}))
    return false;
  line(llvm::formatv("rt::sum_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(out[0]), ptr(in[0]),
                     ptr(out[0]), outer, axis, inner, boolean(mean))
           .str());
  return true;
}

bool Emitter::expand() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  TensorId dy = in[0], dx = out[0];
  if (!needDense(dx, "the gradient") || !sameType({dy, dx}))
    return false;
  int64_t outer = 1, axis = n(dx), inner = 1;
  if (!at.reduceAll) {
    size_t d = 0;
    normalizeAxis(at.dim, at.newShape.size(), d);
    outer = axis = inner = 1;
    for (size_t i = 0; i < at.newShape.size(); ++i)
      (i < d ? outer : i == d ? axis : inner) *= at.newShape[i].size;
  }
  line(llvm::formatv("rt::sum_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7});", T(dx), ptr(dy), ptr(dx),
                     outer, axis, inner, boolean(at.hasScalar), boolean(acc()))
           .str());
  return true;
}

bool Emitter::reduceTo() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  TensorId x = in[0], y = out[0];
  if (!needDense(x, "the local gradient") || !sameType({x, y}))
    return false;
  std::vector<int64_t> xs = sizes(x);
  std::vector<int64_t> ys = sizes(y), yst = strides(y), ost(xs.size(), 0);
  size_t off = xs.size() - ys.size();
  for (size_t i = 0; i < ys.size(); ++i)
    ost[off + i] = ys[i] == 1 && xs[off + i] != 1 ? 0 : yst[i];
  line(llvm::formatv("rt::reduce_to<{0}>(ctx, {1}, dims{{{2}}, {3}, {4}, dims{{{5}}, 1.0f, {6});", T(y), ptr(x),
                     list(xs), xs.size(), ptr(y), list(ost), boolean(acc()))
           .str());
  return true;
}

bool Emitter::copy(TensorId src, TensorId dst, bool accumulate) {
  std::vector<int64_t> sz = sizes(dst);
  if (sz.empty())
    sz = {1};
  if (sz.size() > 8)
    return fail("rank above 8");
  // The source is read at the destination's shape (a gradient may be written at another
  // shape with the same elements, [1, d] from [d]): dense sources reshape freely.
  std::string srcStrides;
  if (shape(dst).empty()) { // one element
    srcStrides = "dims{{0}}";
  } else if (sizes(src) == sizes(dst)) {
    srcStrides = "dims{" + list(strides(src)) + "}";
  } else if (dense(src)) {
    auto st = denseStrides(shape(dst));
    srcStrides = "dims{" + list(std::vector<int64_t>(st.begin(), st.end())) + "}";
  } else {
    return fail("a strided copy between different shapes");
  }
  std::string dstStrides = dense(dst) ? "nullptr" : "dims{" + list(strides(dst)) + "}";
  line(llvm::formatv("rt::copy<{0}, {1}>(ctx, {2}, {3}, {4}, {5}, dims{{{6}}, {7}, {8});", T(src), T(dst),
                     ptr(src), srcStrides, ptr(dst), dstStrides, list(sz), sz.size(), boolean(accumulate))
           .str());
  return true;
}

bool Emitter::concat() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  size_t axis = 0;
  normalizeAxis(at.dim, shape(out[0]).size(), axis);
  std::vector<int64_t> ost = strides(out[0]);
  int64_t at0 = 0;
  for (TensorId x : in) {
    std::vector<int64_t> sz = sizes(x);
    // The part of the output this input fills: a view at offset at0 along the axis.
    std::string dst = ptr(out[0]);
    int64_t off = at0 * ost[axis] * static_cast<int64_t>(bytesOf(s.tensors[out[0]].dtype));
    std::string partPtr = "reinterpret_cast<" + T(out[0]) + "*>(reinterpret_cast<uint8_t*>(" + dst +
                          ") + " + std::to_string(off) + ")";
    line(llvm::formatv("rt::copy<{0}, {1}>(ctx, {2}, dims{{{3}}, {4}, dims{{{5}}, dims{{{6}}, {7}, false);",
                       T(x), T(out[0]), ptr(x), list(strides(x)), partPtr, list(ost), list(sz), sz.size())
             .str());
    at0 += sz[axis];
  }
  return true;
}

bool Emitter::broadcastTo() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  std::vector<int64_t> sz = sizes(out[0]), xz = sizes(in[0]), xs = strides(in[0]);
  if (sz.empty() || sz.size() > 8 || !needDense(out[0], "the output"))
    return fail("broadcast_to needs an output of rank 1 to 8");
  std::vector<int64_t> st(sz.size(), 0);
  size_t lead = sz.size() - xz.size();
  for (size_t j = 0; j < xz.size(); ++j)
    st[lead + j] = xz[j] == 1 ? 0 : xs[j];
  line(llvm::formatv("rt::copy<{0}, {1}>(ctx, {2}, dims{{{3}}, {4}, nullptr, dims{{{5}}, {6}, false);",
                     T(in[0]), T(out[0]), ptr(in[0]), list(st), ptr(out[0]), list(sz), sz.size())
           .str());
  return true;
}

bool Emitter::embedding() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  TensorId w = in[1];
  if (!needDense(in[0], "the ids") || !sameType({w, out[0]}))
    return false;
  line(llvm::formatv("rt::embedding_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(out[0]), ptr(in[0]),
                     ptr(w), ptr(out[0]), n(in[0]), last(w), shape(w)[0].size)
           .str());
  return true;
}

bool Emitter::embeddingBackward() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  TensorId ids = in[0], dy = in[1], dw = out[0];
  if (!needDense(dy, "the output gradient") || !sameType({dy, dw}))
    return false;
  if (be.checkEmbeddingBackward) {
    std::string why = be.checkEmbeddingBackward(n(ids), shape(dw)[0].size);
    if (!why.empty())
      return fail(why);
  }
  if (!acc()) // the kernel scatter-adds: a first write starts from zero
    line(llvm::formatv("rt::fill<{0}>(ctx, {1}, 0.0f, {2});", T(dw), ptr(dw), n(dw)).str());
  line(llvm::formatv("rt::embedding_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(dw), ptr(ids), ptr(dy),
                     ptr(dw), n(ids), last(dw), shape(dw)[0].size)
           .str());
  return true;
}

bool Emitter::positions() {
  const auto &out = op->outputs;
  line(llvm::formatv("rt::positions(ctx, {0}, {1});", ptr(out[0]), n(out[0])).str());
  return true;
}

bool Emitter::nextTokens() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  int64_t S = last(in[0]);
  line(llvm::formatv("rt::next_tokens(ctx, {0}, {1}, {2}, {3});", ptr(in[0]), ptr(out[0]),
                     n(in[0]) / std::max<int64_t>(1, S), S)
           .str());
  return true;
}

// ---- the table's entries (EmitTable.cpp) ----------------------------------------------------

// The pure unary kinds, one per row of ir/ops/Unary.def, and the binary kinds, one per row of
// ir/ops/Binary.def: a new row needs no code here.
#define UNARY(ID, FWD, GRAD, READS, FWD_EXPS, GRAD_EXPS, RUNTIME)                                  \
  EMIT_ENTRY(ID, &Emitter::unary, &Emitter::unaryGradient, nullptr, nullptr, false, "rt::UnOp::" #RUNTIME)
#include "ir/ops/Unary.def"
#define BINARY(ID, RUNTIME)                                                                        \
  EMIT_ENTRY(ID, &Emitter::binary, nullptr, nullptr, nullptr, false, "rt::BinOp::" #RUNTIME)
#include "ir/ops/Binary.def"

// The rest of the elementwise family.
EMIT_WITH_BACKWARD(Dropout, dropout, dropoutBackward)
EMIT(UnaryBackward, unaryBackward)
EMIT(DivBackward, divBackward)
EMIT(Fill, fill)

// Reductions.
EMIT(Sum, sum)
EMIT(Mean, mean)
EMIT(Expand, expand)
EMIT(ReduceTo, reduceTo)

// Copies and data.
EMIT(Contiguous, contiguous)
EMIT(Concat, concat)
EMIT(BroadcastTo, broadcastTo)
EMIT(Embedding, embedding)
EMIT(EmbeddingBackward, embeddingBackward)
EMIT(Positions, positions)
EMIT(NextTokens, nextTokens)

// Views: no code.
EMIT(Split, view)
EMIT(Reshape, view)
EMIT(Transpose, view)
EMIT(Slice, view)

} // namespace tally::codegen::emit
