// The calls of the ops with their own kernels (emitOp dispatches to them through the table,
// EmitTable.cpp; their kinds' entries end this file): matmul (its
// operands may be transposed views and carry batch strides; a transposed output computes
// Cᵀ = Bᵀ·Aᵀ instead), rope and attention (the backend's checks of what its runtime runs),
// softmax and the norms (a fused run's prologue, EmitFused.cpp), and the cross-entropy loss.
#include "codegen/EmitInternal.h"
#include "passes/CudnnAttention.h"

#include <algorithm>

namespace tally::codegen::emit {

// ---- matmul --------------------------------------------------------------------------------

bool Emitter::operand(TensorId t, char vectorAs, MatOperand &m) {
  std::vector<int64_t> sz = sizes(t), st = strides(t);
  if (sz.size() == 1) {
    if (vectorAs == 'r') {
      sz = {1, sz[0]};
      st = {sz[1], st[0]};
    } else {
      sz = {sz[0], 1};
      st = {st[0], 1};
    }
  } else if (sz.empty()) {
    sz = {1, 1};
    st = {1, 1};
  }
  size_t r = sz.size();
  m.rows = sz[r - 2];
  m.cols = sz[r - 1];
  if (st[r - 1] == 1 || m.cols == 1) {
    m.trans = false;
    m.ld = std::max<int64_t>({st[r - 2], m.cols, 1});
    if (m.rows == 1)
      m.ld = std::max<int64_t>(m.cols, 1);
  } else if (st[r - 2] == 1 || m.rows == 1) {
    m.trans = true;
    m.ld = std::max<int64_t>({st[r - 1], m.rows, 1});
    if (m.cols == 1)
      m.ld = std::max<int64_t>(m.rows, 1);
  } else {
    return fail("a matmul operand has neither unit row nor unit column stride");
  }
  m.batch = 1;
  m.batchStride = 0;
  for (size_t i = 0; i + 2 < r; ++i) {
    m.batch *= sz[i];
    if (sz[i] > 1)
      m.batchStride = st[i]; // acceptsLayout: the batch dimensions collapse to the innermost
  }
  m.p = ptr(t);
  return true;
}

bool Emitter::matmul() {
  TensorId ta = op->inputs[0], tb = op->inputs[1], tc = op->outputs[0];
  if (!sameType({ta, tb, tc}))
    return false;
  MatOperand A, B, C;
  char cv = shape(ta).size() == 1 ? 'r' : 'c';
  if (!operand(ta, 'r', A) || !operand(tb, 'c', B) || !operand(tc, cv, C))
    return false;
  if (C.trans) { // Cᵀ = Bᵀ·Aᵀ: swap the operands and flip every transposition
    std::swap(A, B);
    A.trans = !A.trans;
    B.trans = !B.trans;
    std::swap(A.rows, A.cols);
    std::swap(B.rows, B.cols);
    std::swap(C.rows, C.cols);
    C.trans = false;
  }
  // rows and cols are the logical op(A), op(B), C dimensions; `trans` only says how the
  // storage holds them.
  int64_t M = C.rows, N = C.cols, K = A.cols;
  if (A.rows != M || B.rows != K || B.cols != N)
    return fail("matmul operands of " + std::to_string(A.rows) + "x" + std::to_string(A.cols) + " and " +
                std::to_string(B.rows) + "x" + std::to_string(B.cols) + " do not give " +
                std::to_string(M) + "x" + std::to_string(N));
  int64_t batch = C.batch;
  if ((A.batch != batch && A.batch != 1) || (B.batch != batch && B.batch != 1))
    return fail("matmul batch dimensions broadcast partially, which the " + title() + " backend does not run");
  int64_t sA = A.batch == 1 ? 0 : A.batchStride, sB = B.batch == 1 ? 0 : B.batchStride;
  int64_t sC = batch == 1 ? 0 : C.batchStride;
  // A batch against one weight with rows that run on across the batch is one big product.
  if (batch > 1 && sB == 0 && !A.trans && sA == M * A.ld && sC == M * C.ld) {
    M *= batch;
    batch = 1;
    sA = sC = 0;
  }
  if (!epilogueBias.empty()) { // the bias epilogue: one product into the add's output
    if (batch != 1 || acc() || C.ld != N)
      return fail("internal error: a bias epilogue on a batched, accumulating or strided product");
    line(llvm::formatv("rt::matmul_bias<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12});",
                       T(tc), boolean(A.trans), boolean(B.trans), M, N, K, A.p, A.ld, B.p, B.ld, epilogueBias,
                       epilogueOut, C.ld)
             .str());
    return true;
  }
  line(llvm::formatv("rt::matmul<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, 1.0f, {6}, {7}, {8}, {9}, {10}, {11}, "
                     "{12}, {13}, {14}, {15}, {16});",
                     T(tc), boolean(A.trans), boolean(B.trans), M, N, K, A.p, A.ld, sA, B.p, B.ld, sB,
                     acc() ? "1.0f" : "0.0f", C.p, C.ld, sC, batch)
           .str());
  return true;
}

// ---- rope and attention --------------------------------------------------------------------

bool Emitter::ropeDims(TensorId x, const OpAttrs &at, int64_t &B, int64_t &S, int64_t &H, int64_t &hd) {
  if (at.fraction < 1)
    return fail("partial rotary (rope fraction < 1) has no CPU kernel yet");
  int64_t w = last(x);
  hd = at.headDim > 0 ? at.headDim : w;
  if (hd <= 0 || w % hd != 0 || hd % 2 != 0)
    return fail("rope head size " + std::to_string(hd) + " does not divide the width " +
                std::to_string(w) + " into even heads");
  H = w / hd;
  S = shape(x).size() >= 2 ? shape(x)[shape(x).size() - 2].size : 1;
  B = n(x) / std::max<int64_t>(1, S * w);
  return true;
}

bool Emitter::rope() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  int64_t B, S, H, hd;
  if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}) || !ropeDims(in[0], at, B, S, H, hd))
    return false;
  line(llvm::formatv("rt::rope_fwd<{0}>(ctx, {1}, {2}, nullptr, {3}, {4}, {5}, {6}, {7});", T(out[0]),
                     ptr(in[0]), ptr(out[0]), B, S, H, hd, number(at.theta))
           .str());
  return true;
}

/// The gradient of a rope: a unary_backward op (inputs x, dy) whose attrs are the rope's.
bool Emitter::ropeBackward() {
  const OpAttrs &at = op->attrs;
  TensorId dx = op->outputs[0];
  TensorId dy = op->inputs.back();
  int64_t B, S, H, hd;
  if (!ropeDims(dx, at, B, S, H, hd))
    return false;
  line(llvm::formatv("rt::rope_bwd<{0}>(ctx, {1}, {2}, nullptr, {3}, {4}, {5}, {6}, {7}, {8});", T(dx), ptr(dy),
                     ptr(dx), B, S, H, hd, number(at.theta), boolean(acc()))
           .str());
  return true;
}

bool Emitter::attentionDims(const Op &fwd, int64_t &B, int64_t &S, int64_t &Skv, int64_t &H, int64_t &Hkv,
                   int64_t &hd, std::string &rows) {
  TensorId q = fwd.inputs[0], k = fwd.inputs[1], v = fwd.inputs[2];
  if (shape(q).size() != 3)
    return fail("attention over rank " + std::to_string(shape(q).size()) + " q; the " + title() + " backend runs [batch, seq, heads·head]");
  B = shape(q)[0].size;
  S = shape(q)[1].size;
  Skv = shape(k)[1].size;
  H = fwd.attrs->heads;
  Hkv = fwd.attrs->kvHeads ? fwd.attrs->kvHeads : H;
  hd = shape(q)[2].size / H;
  int64_t hdv = shape(v)[2].size / Hkv; // the value heads' size: hd unless they differ (MLA)
  int64_t rq = strides(q)[1], rk = strides(k)[1], rv = strides(v)[1];
  bool strided = rq != H * hd || rk != Hkv * hd || rv != Hkv * hdv;
  rows = strided ? llvm::formatv(", rt::AttnRows{{{0}, {1}, {2}}", rq, rk, rv).str() : "";
  // A window or a soft cap: rt::AttnScores after the rows (written out, dense or not); value
  // heads of another size: that size after both.
  const OpAttrs &at = fwd.attrs;
  if (at.attnWindow > 0 || at.softcap > 0 || hdv != hd)
    rows = (strided ? rows : std::string(", rt::AttnRows{}")) +
           llvm::formatv(", rt::AttnScores{{{0}, {1}}", at.attnWindow, number(at.softcap)).str();
  if (hdv != hd) {
    if (be.device)
      return fail("value heads of " + std::to_string(hdv) + " dims beside q/k heads of " +
                  std::to_string(hd) + " (multi-head latent attention) have no " + title() +
                  " kernel yet; the CPU backend runs them");
    rows += ", " + std::to_string(hdv);
  }
  if (be.checkAttention) {
    std::string why = be.checkAttention(B, S, Skv, H, Hkv, hd, rq, rk, rv, op->kind == OpKind::AttentionBackward);
    if (!why.empty())
      return fail(why);
  }
  return true;
}

std::string Emitter::attentionEngine(const Op &fwd, bool backward, int accumulate) {
  if (!be.device)
    return "";
  std::string why = cudnnAttentionRefusal(s, fwd);
  if (why.empty() && backward && op->attrs->gradMask != 7u)
    why = "not every one of q, k, v needs a gradient (cuDNN's backward writes all three)";
  if (why.empty() && backward && accumulate == 1)
    why = "the gradients add into buffers other ops also write (cuDNN's backward overwrites them)";
  std::string line = why.empty() ? "cuDNN fused attention" : "the runtime's kernels: " + why;
  auto &n = attentionEngines[line];
  if (n.first++ == 0)
    n.second = s.opPath(*op) + (backward ? " (backward)" : " (forward)");
  return why.empty() ? "_cudnn" : "";
}

bool Emitter::attentionForward() {
  const OpAttrs &at = op->attrs;
  int64_t B, S, Skv, H, Hkv, hd;
  std::string rows;
  if (at.alibi || at.hasMask)
    return fail(std::string(at.alibi ? "ALiBi (alibi = true)" : "a padding mask (mask =)") +
                " in attention has no CPU kernel yet");
  if (!attentionDims(*op, B, S, Skv, H, Hkv, hd, rows))
    return false;
  TensorId q = op->inputs[0], k = op->inputs[1], v = op->inputs[2], o = op->outputs[0];
  if (!sameType({q, k, v, o}))
    return false;
  std::string lse = at.fused ? ptr(op->outputs[1]) : "nullptr";
  std::string scores = at.fused ? "nullptr" : ptr(op->outputs[1]);
  line(llvm::formatv("rt::attention_fwd{19}<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, "
                     "{13}, {14}, {15}, {16}, {17}{18});",
                     T(o), ptr(q), ptr(k), ptr(v), ptr(o), lse, scores, B, S, Skv, H, Hkv, hd,
                     number(at.scale), boolean(at.causal), number(at.p), seedExpr(),
                     at.stream == kNone ? 0 : at.stream, rows, attentionEngine(*op, false, 0))
           .str());
  return true;
}

bool Emitter::attentionBackward() {
  const Op &fwd = s.ops[op->forwardOp];
  const OpAttrs &at = fwd.attrs;
  if (!at.fused && be.device)
    return fail("the backward of materialised attention (fused = false) has no " + title() +
                " kernel yet; the " + title() + " backend runs fused attention only");
  int64_t B, S, Skv, H, Hkv, hd;
  std::string rows;
  if (!attentionDims(fwd, B, S, Skv, H, Hkv, hd, rows))
    return false;
  // outputs: the gradients in gradMask order.
  std::string d[3] = {"nullptr", "nullptr", "nullptr"};
  unsigned out = 0;
  int accs = -1;
  for (unsigned i = 0; i < 3; ++i)
    if (op->attrs->gradMask & (1u << i)) {
      d[i] = ptr(op->outputs[out]);
      int ai = acc(out) ? 1 : 0;
      if (accs >= 0 && ai != accs)
        return fail("attention gradients written partly in place and partly overwritten; the "
                    "runtime takes one accumulate flag");
      accs = ai;
      ++out;
    }
  // inputs: fused (q, k, v, o, lse, dO); materialised (q, k, v, P[, mask, dropped P], dO): the
  // runtime reads P and replays the dropout mask from its stream, and needs neither o nor lse.
  const auto &in = op->inputs;
  std::string o = at.fused ? ptr(in[3]) : "nullptr", lse = at.fused ? ptr(in[4]) : "nullptr";
  std::string scores = at.fused ? "nullptr" : ptr(in[3]);
  line(llvm::formatv("rt::attention_bwd{24}<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, "
                     "{12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}{23});",
                     T(in[0]), ptr(in[0]), ptr(in[1]), ptr(in[2]), o, lse, scores, ptr(in.back()),
                     d[0], d[1], d[2], B, S, Skv, H, Hkv, hd, number(at.scale), boolean(at.causal),
                     number(at.p), seedExpr(), at.stream == kNone ? 0 : at.stream,
                     boolean(accs == 1), rows, attentionEngine(fwd, true, accs))
           .str());
  return true;
}

// ---- softmax and norms --------------------------------------------------------------------

bool Emitter::softmax() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  size_t d = 0;
  normalizeAxis(at.dim, shape(in[0]).size(), d);
  if (d + 1 != shape(in[0]).size())
    return fail("softmax over a dimension other than the last");
  if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}))
    return false;
  line(llvm::formatv("rt::softmax_fwd<{0}>(ctx, {1}, {2}, {3}, {4});", T(out[0]), ptr(in[0]), ptr(out[0]),
                     n(in[0]) / std::max<int64_t>(1, last(in[0])), last(in[0]))
           .str());
  return true;
}

bool Emitter::softmaxBackward() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  TensorId y = in[0], dy = in[1], dx = out[0];
  if (!needDense(dx, "the gradient") || !needDense(dy, "the output gradient") || !sameType({y, dy, dx}))
    return false;
  line(llvm::formatv("rt::softmax_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(dx), ptr(y), ptr(dy),
                     ptr(dx), n(y) / std::max<int64_t>(1, last(y)), last(y), boolean(acc()))
           .str());
  return true;
}

bool Emitter::layerNorm() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  // inputs: x, then the weight and the bias when given (no weight: the runtime scales by 1)
  if (!needDense(in[0], "the input") || !sameType({in[0], in.size() > 1 ? in[1] : in[0], out[0]}))
    return false;
  int64_t cols = last(in[0]);
  line(llvm::formatv("rt::layer_norm_fwd{10}<{0}>(ctx, {11}{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9});", T(out[0]),
                     ptr(in[0]), in.size() > 1 ? ptr(in[1]) : "nullptr", in.size() > 2 ? ptr(in[2]) : "nullptr", ptr(out[0]),
                     ptr(out[1]), ptr(out[2]), n(in[0]) / std::max<int64_t>(1, cols), cols, number(at.eps),
                     prologue.empty() ? "" : "_fused", prologue.empty() ? "" : prologue + ", ")
           .str());
  return true;
}

bool Emitter::rmsNorm() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  const OpAttrs &at = op->attrs;
  if (!needDense(in[0], "the input") || !sameType({in[0], in[1], out[0]}))
    return false;
  int64_t cols = last(in[0]);
  line(llvm::formatv("rt::rms_norm_fwd{8}<{0}>(ctx, {9}{1}, {2}, {3}, {4}, {5}, {6}, {7});", T(out[0]), ptr(in[0]),
                     ptr(in[1]), ptr(out[0]), ptr(out[1]), n(in[0]) / std::max<int64_t>(1, cols), cols,
                     number(at.eps), prologue.empty() ? "" : "_fused", prologue.empty() ? "" : prologue + ", ")
           .str());
  return true;
}

bool Emitter::normBackward(bool layer) {
  const auto &in = op->inputs;
  // inputs: x, w, (mean,) rstd, dy (layer norm without a weight: x, mean, rstd, dy); outputs:
  // dx, dw, db as gradMask says.
  bool weight = !layer || in.size() == 5;
  TensorId x = in[0], w = weight ? in[1] : x, dy = in.back();
  unsigned stats = weight ? 2 : 1; // the first row statistic's input
  std::string d[3] = {"nullptr", "nullptr", "nullptr"};
  unsigned out = 0;
  bool accDx = false;
  for (unsigned i = 0; i < 3; ++i)
    if (op->attrs->gradMask & (1u << i)) {
      TensorId t = op->outputs[out];
      if (!needDense(t, "a norm gradient"))
        return false;
      d[i] = ptr(t);
      if (i == 0)
        accDx = acc(out);
      else if (!acc(out)) // weight and bias gradients: the kernel always adds
        line(llvm::formatv("rt::fill<{0}>(ctx, {1}, 0.0f, {2});", T(t), d[i], n(t)).str());
      ++out;
    }
  if (!needDense(x, "the input") || !needDense(dy, "the output gradient") || !sameType({x, w, dy}))
    return false;
  int64_t cols = last(x), rows = n(x) / std::max<int64_t>(1, cols);
  if (layer)
    line(llvm::formatv("rt::layer_norm_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11});",
                       T(x), ptr(x), weight ? ptr(w) : "nullptr", ptr(in[stats]), ptr(in[stats + 1]), ptr(dy),
                       d[0], d[1], d[2], rows, cols,
                       boolean(accDx))
             .str());
  else
    line(llvm::formatv("rt::rms_norm_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9});", T(x), ptr(x),
                       ptr(w), ptr(in[2]), ptr(dy), d[0], d[1], rows, cols, boolean(accDx))
             .str());
  return true;
}

// ---- losses --------------------------------------------------------------------------------

bool Emitter::crossEntropy() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  if (!needDense(in[0], "the logits") || !needDense(in[1], "the labels"))
    return false;
  line(llvm::formatv("rt::cross_entropy_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}{7});", T(in[0]), ptr(in[0]),
                     ptr(in[1]), ptr(out[0]), ptr(out[1]), n(in[1]), validColumns(in[0]), rowStride(in[0]))
           .str());
  return true;
}

int64_t Emitter::validColumns(TensorId logits) const {
  return a.headPad.applies() && logits == a.headPad.logits ? a.headPad.vocab : last(logits);
}

std::string Emitter::rowStride(TensorId logits) const {
  return validColumns(logits) == last(logits) ? "" : ", " + std::to_string(last(logits));
}

bool Emitter::crossEntropyBackward() {
  const auto &in = op->inputs;
  const auto &out = op->outputs;
  TensorId x = in[0], labels = in[1], lse = in[2], dloss = in[3], dx = out[0];
  if (!needDense(dx, "the gradient") || !sameType({x, dx}))
    return false;
  line(llvm::formatv("rt::cross_entropy_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}{9});", T(dx), ptr(x),
                     ptr(labels), ptr(lse), ptr(dloss), ptr(dx), n(labels), validColumns(x), boolean(acc()),
                     rowStride(x))
           .str());
  return true;
}

// ---- the table's entries (EmitTable.cpp) ----------------------------------------------------

EMIT(Matmul, matmul)
EMIT_WITH_BACKWARD(Rope, rope, ropeBackward)
EMIT(Attention, attentionForward)
EMIT(AttentionBackward, attentionBackward)
EMIT(Softmax, softmax)
EMIT(SoftmaxBackward, softmaxBackward)
EMIT(LayerNorm, layerNorm)
EMIT(LayerNormBackward, layerNormBackward)
EMIT(RmsNorm, rmsNorm)
EMIT(RmsNormBackward, rmsNormBackward)
EMIT(CrossEntropy, crossEntropy)
EMIT(CrossEntropyBackward, crossEntropyBackward)

} // namespace tally::codegen::emit
