// The attention family's rules: attention (multi-head, grouped-query, causal, sliding window,
// logit soft-capping, ALiBi, padding mask, fused flash or materialised scores) and
// attention_backward: shapes, model and executed FLOPs, the bytes each form moves, and what the
// backward keeps. docs/counting.md states the same rules as formulas.
#include "ir/ops/OpsCommon.h"
#include "ir/Target.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Attention: q [b, s, d], k [b, s_kv, d_kv] and v [b, s_kv, d_v], h query heads of size dh =
// d/h, kvHeads key/value heads (d_kv = kvHeads·dh), values of head size dv = d_v / kvHeads (dh
// unless written otherwise: DeepSeek's MLA has q/k heads of 192 and value heads of 128); the
// output is [b, s, h·dv]. S = b·h·s·s_kv is the number of attention scores (the
// score matrix); F, the scores model FLOPs count: S, or b·h·s·w_kv with a sliding window of w
// keys (w_kv = min(w, s_kv): the window is each query's key span, counted dense within it as
// causal attention counts the whole s_kv).

/// The attention sizes: b, s, s_kv, h, dh = d / h, S = b·h·s·s_kv scores and F, those model
/// FLOPs count.
template <class C> struct AttnTerms {
  Num<C> b, s, skv, h, dh, dv, S, F;
  bool sameHead = true; ///< dv == dh: the formulas are written with dh alone
};

/// The value head size: v's width over the key/value heads.
int64_t valueHead(const Graph &g, const Op &op) {
  int64_t kvh = op.attrs->kvHeads ? op.attrs->kvHeads : op.attrs->heads;
  return kvh > 0 ? in(g, op, 2).shape[2].size / kvh : 0;
}

template <class C> AttnTerms<C> attentionTerms(C &c) {
  const Shape &q = in(c.g, c.op, 0).shape, &k = in(c.g, c.op, 1).shape;
  AttnTerms<C> t;
  t.b = c.dim("b", q[0]);
  t.s = c.dim("s", q[1]);
  t.skv = c.dim("s_kv", k[1]);
  t.h = c.quantity("h", c.lit(static_cast<double>(c.op.attrs->heads)));
  t.dh = c.quantity("dh", c.named("d", c.lit(static_cast<double>(q[2].size))) / t.h);
  int64_t kvh = c.op.attrs->kvHeads ? c.op.attrs->kvHeads : c.op.attrs->heads;
  int64_t dv = valueHead(c.g, c.op);
  t.sameHead = kvh <= 0 || dv * c.op.attrs->heads == q[2].size;
  t.dv = t.sameHead ? t.dh
                    : c.quantity("dv", c.named("d_v", c.lit(static_cast<double>(
                                                          in(c.g, c.op, 2).shape[2].size))) /
                                           c.named("kv_heads", c.lit(static_cast<double>(kvh))));
  t.S = c.quantity("S", t.b * t.h * t.s * t.skv);
  t.F = t.S;
  if (int64_t w = c.op.attrs->attnWindow; w > 0) {
    double keys = std::min(static_cast<double>(w), static_cast<double>(k[1].size));
    Num<C> wkv = c.quantity("w_kv", c.named("min(window, s_kv)", c.lit(keys)));
    t.F = c.quantity("S_w", t.b * t.h * t.s * wkv);
  }
  return t;
}

using AttnDims = AttnTerms<Count>;
AttnDims attnDims(const Graph &g, const Op &op) {
  Count c(g, op);
  return attentionTerms(c);
}

/// Σ over i in [0, s) of clamp(i + c, 0, n): the sum, over s queries, of the keys below a
/// bound that moves one key per query (doubles: exact below 2^53).
double clampedSum(double s, double c, double n) {
  double last = c + s - 1;                            // x = i + c runs over [c, last]
  double lo = std::max(c, 1.0), hi = std::min(last, n - 1);
  double middle = hi >= lo ? (lo + hi) * (hi - lo + 1) / 2 : 0; // 0 < x < n: x each
  double from = std::max(c, n);
  double top = last >= from ? (last - from + 1) * n : 0;        // x >= n: n each
  return middle + top;
}

/// The scores a causal kernel computes: query i (its position i + s_kv − s among the keys, the
/// kernels' convention) sees keys i + s_kv − s − w < j <= i + s_kv − s; w = 0: no window.
double bandScores(double s, double skv, double w) {
  double o = skv - s;
  return clampedSum(s, o + 1, skv) - (w > 0 ? clampedSum(s, o + 1 - w, skv) : 0);
}

/// The share of the scores model FLOPs count (F) that the kernel computes. Causal flash: the
/// lower triangle with its diagonal, (s+1)/(2s) of the dense matrix (s == s_kv; 1 otherwise);
/// with a window, the band (bandScores) of the s·w_kv counted. Unfused attention computes the
/// dense matrix and then masks it: 1, or s_kv / w_kv with a window.
double computedFraction(const Graph &g, const Op &op) {
  AttnDims d = attnDims(g, op);
  if (!op.attrs->causal || d.s == 0 || d.skv == 0)
    return 1;
  if (op.attrs->attnWindow > 0) {
    double keys = d.F / (d.b * d.h * d.s);
    if (!(keys > 0))
      return 1;
    if (!op.attrs->fused)
      return d.skv / keys;
    return bandScores(d.s, d.skv, static_cast<double>(op.attrs->attnWindow)) / (d.s * keys);
  }
  if (!op.attrs->fused || d.s != d.skv)
    return 1;
  return (d.s + 1) / (2 * d.s);
}

/// latent = r, latent_rope = p (MLA): the cache holds c_kv and the decoupled RoPE key of a
/// self-attention, and the RoPE key is part of every q/k head of dh dims.
bool checkLatent(const Graph &g, const Op &op, int64_t dh, ShapeError &err) {
  const OpAttrs &a = op.attrs;
  if (a.latent == 0 && a.latentRope == 0)
    return true;
  const Shape &q = in(g, op, 0).shape, &k = in(g, op, 1).shape;
  if (a.latent < 0 || a.latentRope < 0 || (a.latent == 0 && a.latentRope > 0))
    return fail(err, ShapeErrorKind::Invalid,
                "attention latent = " + std::to_string(a.latent) + ", latent_rope = " +
                    std::to_string(a.latentRope) + ": the latent must be positive and the RoPE "
                    "key at least 0");
  if (k[1].size != q[1].size)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention with a latent cache (latent = " + std::to_string(a.latent) +
                    ") is a self-attention: k and v as long as q, got " + g.formatShape(q) +
                    " and " + g.formatShape(k));
  if (a.latentRope >= dh)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention latent_rope = " + std::to_string(a.latentRope) +
                    " is the RoPE part of each q/k head, so it must be below the head size " +
                    std::to_string(dh) + " (qk_nope_head_dim + qk_rope_head_dim)");
  return true;
}

bool inferAttention(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                    ShapeError &err) {
  if (!expectInputs(op, op.attrs->hasMask ? 4 : 3, op.attrs->hasMask ? 4 : 3, err))
    return false;
  const Shape &q = in(g, op, 0).shape, &k = in(g, op, 1).shape, &v = in(g, op, 2).shape;
  auto all = [&] { // failures only
    return g.formatShape(q) + ", " + g.formatShape(k) + ", " + g.formatShape(v);
  };
  if (q.size() != 3 || k.size() != 3 || v.size() != 3)
    return fail(err, ShapeErrorKind::Invalid,
                "attention expects q [batch, seq, d] and k, v [batch, seq_kv, d_kv], got " + all());
  if (k[0].size != q[0].size || v[0].size != q[0].size || k[1].size != v[1].size)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention q, k and v disagree: " + all() +
                    " (batch must match, and k and v must have the same length)");
  int64_t h = op.attrs->heads, kvh = op.attrs->kvHeads ? op.attrs->kvHeads : op.attrs->heads;
  if (h <= 0 || kvh <= 0)
    return fail(err, ShapeErrorKind::Invalid,
                "attention needs heads > 0 and kv_heads > 0, got heads = " + std::to_string(h) +
                    ", kv_heads = " + std::to_string(kvh));
  if (q[2].size % h != 0)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention width " + std::to_string(q[2].size) + " of " + g.formatShape(q) +
                    " is not divisible by heads = " + std::to_string(h));
  if (h % kvh != 0)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention heads = " + std::to_string(h) + " is not a multiple of kv_heads = " +
                    std::to_string(kvh));
  int64_t dh = q[2].size / h;
  if (k[2].size != kvh * dh)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention key/value width " + std::to_string(k[2].size) + " of " +
                    g.formatShape(k) + " should be kv_heads × head size = " + std::to_string(kvh) +
                    " × " + std::to_string(dh) + " = " + std::to_string(kvh * dh));
  if (v[2].size % kvh != 0)
    return fail(err, ShapeErrorKind::Mismatch,
                "attention value width " + std::to_string(v[2].size) + " of " + g.formatShape(v) +
                    " is not divisible by kv_heads = " + std::to_string(kvh));
  int64_t dv = v[2].size / kvh;
  if (!checkLatent(g, op, dh, err))
    return false;
  if (!(op.attrs->p >= 0 && op.attrs->p < 1))
    return fail(err, ShapeErrorKind::Invalid,
                "attention dropout must be in [0, 1), got " + std::to_string(op.attrs->p));
  if (op.attrs->attnWindow < 0 || (op.attrs->attnWindow > 0 && !op.attrs->causal))
    return fail(err, ShapeErrorKind::Invalid,
                "attention window = " + std::to_string(op.attrs->attnWindow) +
                    " must be 0 (none) or a positive number of keys with causal = true");
  if (!(op.attrs->softcap >= 0) || !std::isfinite(op.attrs->softcap))
    return fail(err, ShapeErrorKind::Invalid,
                "attention softcap must be 0 (none) or a positive number, got " +
                    std::to_string(op.attrs->softcap));
  if (op.attrs->hasMask) { // a padding mask: which keys each sequence of the batch has
    const Tensor &m = in(g, op, 3);
    if (isFloat(m.dtype) || m.shape.size() != 2 || m.shape[0].size != q[0].size ||
        m.shape[1].size != k[1].size)
      return fail(err, ShapeErrorKind::Mismatch,
                  "attention mask must be integers or booleans of shape [batch, seq_kv] = " +
                      g.formatShape(Shape{q[0], k[1]}) + ", got " + nameOf(m.dtype).str() +
                      g.formatShape(m.shape));
  }
  // What the backward reads besides q, k, v and o: the logsumexp of each query row (fp32
  // [b, h, s]) when fused; the probabilities [b, h, s, s_kv] when materialised, with the
  // dropout mask and the dropped probabilities when p > 0.
  Shape o = q; // [b, s, h·dv]: q's shape unless the value heads differ from q's
  if (dv != dh)
    o[2] = Dim{h * dv, 0};
  outs.push_back({o, g.activationDtype});
  if (op.attrs->fused) {
    outs.push_back({Shape{q[0], Dim{h, 0}, q[1]}, Dtype::F32});
  } else {
    Shape scores{q[0], Dim{h, 0}, q[1], k[1]};
    if (!checkedNumel(scores))
      return fail(err, ShapeErrorKind::Overflow, "the attention score matrix " +
                                                     Graph::formatSizes(scores) +
                                                     " has more elements than fit in a 64-bit integer");
    outs.push_back({scores, g.activationDtype});
    if (op.attrs->p > 0) {
      outs.push_back({scores, Dtype::U8});
      outs.push_back({scores, g.activationDtype});
    }
  }
  return true;
}

/// Per-score FLOPs outside the matmuls: scale and softmax (5), and dropout (1) when p > 0.
double attnPerScore(const Op &op) { return 5 + (op.attrs->p > 0 ? 1 : 0); }
/// ALiBi adds slope_h·(j − i) to each score in the kernel: a multiply and an add per score
/// (the distance is index arithmetic, like the causal mask, and costs no FLOPs). The bias
/// has no parameters and no gradient; flash attention recomputes it in the backward.
double alibiPerScore(const Op &op) { return op.attrs->alibi ? 2 : 0; }
/// Soft-capping (Gemma 2) makes each score c·tanh(score / c): a divide, the tanh (4, as the
/// `tanh` op counts it) and a multiply; its gradient multiplies dS by 1 − tanh² (3, as `tanh`'s).
double softcapPerScore(const Op &op) { return op.attrs->softcap > 0 ? 6 : 0; }
double softcapGradPerScore(const Op &op) { return op.attrs->softcap > 0 ? 3 : 0; }
/// Transcendentals per computed score: the softmax's exp, and the cap's tanh.
double expsPerScore(const Op &op) { return op.attrs->softcap > 0 ? 2 : 1; }

/// explain's remark on a windowed op: what model FLOPs count, what the kernel computes.
std::string windowNote(const Graph &g, const Op &op) {
  const Shape &q = in(g, op, 0).shape, &k = in(g, op, 1).shape;
  int64_t w = op.attrs->attnWindow;
  std::string ws = std::to_string(w);
  std::string model = "sliding window of " + ws + " keys (query i sees keys i - " + ws +
                      " < j <= i): model FLOPs count w_kv = min(window, s_kv) keys per query, "
                      "the window as each query's span (dense within it, as causal attention "
                      "counts s_kv)";
  if (!op.attrs->fused)
    return model + "; unfused, the dense score matrix is computed, then masked: executed "
                   "FLOPs count all s·s_kv scores";
  double s = static_cast<double>(q[1].size), skv = static_cast<double>(k[1].size);
  double keys = std::min(static_cast<double>(w), skv);
  double band = bandScores(s, skv, static_cast<double>(w));
  return model + "; the flash kernel executes the band, " + formatFormulaNumber(band) +
         " of the s·w_kv = " + formatFormulaNumber(s * keys) + " scores per head";
}

/// explain's remark on a causal op: model FLOPs count the dense score matrix.
std::string causalNote(const Graph &g, const Op &op) {
  const Shape &q = in(g, op, 0).shape, &k = in(g, op, 1).shape;
  if (!op.attrs->causal)
    return "";
  if (op.attrs->attnWindow > 0)
    return windowNote(g, op);
  if (!op.attrs->fused)
    return "causal, unfused: the dense score matrix is computed, then masked; model FLOPs "
           "count all s·s_kv scores";
  if (q[1].size != k[1].size)
    return "causal with s != s_kv: executed FLOPs are the dense count";
  std::string s = formatFormulaNumber(static_cast<double>(q[1].size));
  return "model FLOPs count all s·s_kv scores (Narayanan et al.); the causal flash kernel "
         "executes the lower triangle, (s + 1)/(2s) = (" + s + " + 1)/(2 · " + s + ") of them";
}

struct AttentionCounts : BaseCounts {
  /// QKᵀ and P·V, 2·F·dh each (2·F·dv for P·V when the value heads differ): the part done
  /// as matrix products.
  template <class C> static Num<C> products(C &c, const AttnTerms<C> &t) {
    if (t.sameHead)
      return c.lit(4) * t.F * t.dh;
    return c.lit(2) * t.F * t.dh + c.lit(2) * t.F * t.dv;
  }
  /// The products, then per score: scale and softmax (5), dropout (1) when p > 0, the ALiBi
  /// bias (2) when asked, the soft cap (6) when asked. Over F: the window's scores.
  template <class C> static Num<C> flops(C &c) {
    AttnTerms<C> t = attentionTerms(c);
    const Op &op = c.op;
    if constexpr (C::kExplains) {
      std::string sc = op.attrs->attnWindow > 0 ? "S_w" : "S";
      std::string note = (t.sameHead ? "Q·Kᵀ and P·V are 2·" + sc + "·dh each"
                                     : "Q·Kᵀ is 2·" + sc + "·dh, P·V 2·" + sc + "·dv") +
                         "; scale and softmax 5 per score" +
                         std::string(op.attrs->p > 0 ? ", dropout 1" : "") +
                         std::string(op.attrs->alibi ? ", the ALiBi bias 2" : "") +
                         std::string(op.attrs->softcap > 0
                                         ? ", the soft cap c·tanh(score / c) 6 (÷, tanh 4, ×)"
                                         : "");
      std::string causal = causalNote(c.g, op);
      c.note(causal.empty() ? note : note + "; " + causal);
    }
    return products(c, t) +
           c.lit(attnPerScore(op) + alibiPerScore(op) + softcapPerScore(op)) * t.F;
  }
  /// Unfused, the score matrices (scores, probabilities, and the dropped probabilities with
  /// dropout) are each written by one kernel and read by the next.
  template <class C> static Num<C> matrices(C &c, const AttnTerms<C> &t) {
    return c.lit(c.op.attrs->p > 0 ? 3 : 2) * t.S *
           c.lit(static_cast<double>(bytesOf(c.g.activationDtype)));
  }
  template <class C> static Num<C> read(C &c) {
    Num<C> qkv = sumBytes(c, c.op.inputs, "in");
    if (c.op.attrs->fused) {
      c.note("q, k and v once each; the scores stay on chip (flash)");
      return qkv;
    }
    c.note(c.op.attrs->p > 0 ? "unfused: the score matrix, the probabilities and the dropped "
                              "probabilities are each read once by the next kernel"
                            : "unfused: the score matrix, the probabilities are each read once "
                              "by the next kernel");
    AttnTerms<C> t = attentionTerms(c);
    return qkv + matrices(c, t);
  }
  template <class C> static Num<C> written(C &c) {
    if (c.op.attrs->fused) {
      c.note("the output, and the logsumexp per query row in fp32 (out1)");
      return sumBytes(c, c.op.outputs, "out");
    }
    AttnTerms<C> t = attentionTerms(c);
    Num<C> w = c.bytesOf(c.op.outputs[0], "out", 0) + matrices(c, t);
    if (c.op.attrs->p <= 0) {
      c.note("unfused: the output, the scores, the probabilities");
      return w;
    }
    c.note("unfused: the output, the scores, the probabilities, the dropped probabilities and "
           "the 1-byte dropout mask");
    return w + t.S;
  }
  /// dQ: dP = dO·Vᵀ (2·S·dh), dropout backward (S when p > 0), softmax backward (4·S), dS·K
  /// (2·S·dh). dK = dSᵀ·Q and dV = Pᵀ·dO (2·S·dh each) reuse dS from dQ's count.
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i >= 3) {
      c.note("the padding mask is data: no gradient");
      return c.lit(0);
    }
    AttnTerms<C> t = attentionTerms(c);
    if (i == 0) {
      if constexpr (C::kExplains) {
        std::string sc = c.op.attrs->attnWindow > 0 ? "S_w" : "S";
        c.note((t.sameHead ? "dP = dO·Vᵀ and dQ = dS·K (2·" + sc + "·dh each)"
                           : "dP = dO·Vᵀ (2·" + sc + "·dv) and dQ = dS·K (2·" + sc + "·dh)") +
               ", the softmax backward (4 per score)" + std::string(c.op.attrs->p > 0 ? ", dropout (1 per score)" : "") +
               std::string(c.op.attrs->softcap > 0 ? ", the soft cap's 1 − tanh² (3 per score)"
                                                   : "") +
               "; dK and dV reuse dS");
      }
      return products(c, t) + c.lit(attnPerScore(c.op) - 1 + softcapGradPerScore(c.op)) * t.F;
    }
    c.note(i == 1 ? "dK = dSᵀ·Q" : "dV = Pᵀ·dO");
    return c.lit(2) * t.F * (i == 2 ? t.dv : t.dh);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    AttnDims d = attentionTerms(c);
    r.matmulFlops = products(c, d);
    r.executedFlops = r.flops * computedFraction(g, op);
    // an exp per computed score, and the cap's tanh
    r.transcendentals = expsPerScore(op) * d.F * computedFraction(g, op);
  }
};

double gradAttention(const Graph &g, const Op &op, unsigned i) {
  return gradOf<AttentionCounts>(g, op, i);
}

double executedBackwardAttention(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad) {
  if (!anyNeed(needGrad))
    return 0;
  AttnDims d = attnDims(g, op);
  double S = d.F;
  double f = 0;
  for (unsigned i = 0; i < 3; ++i)
    if (need(needGrad, i))
      f += gradAttention(g, op, i);
  // dK needs dS even when q needs no gradient: count dP and the softmax backward once there.
  if (!need(needGrad, 0) && need(needGrad, 1))
    f += 2 * S * d.dv + (attnPerScore(op) - 1 + softcapGradPerScore(op)) * S;
  // Flash attention recomputes the scores, their cap, the softmax and the dropout mask from q,
  // k and the saved logsumexp; materialised attention with a cap recomputes the capped scores
  // (P alone does not give the cap's derivative).
  if (op.attrs->fused)
    f += 2 * S * d.dh + (attnPerScore(op) + alibiPerScore(op) + softcapPerScore(op)) * S;
  else if (op.attrs->softcap > 0)
    f += 2 * S * d.dh + softcapPerScore(op) * S;
  return f * computedFraction(g, op);
}

void savedAttention(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                    std::vector<SavedTensor> &out) {
  if (!anyNeed(needGrad))
    return;
  keep(g, out, op.inputs[0], "query");
  keep(g, out, op.inputs[1], "key");
  keep(g, out, op.inputs[2], "value");
  if (op.attrs->hasMask)
    keep(g, out, op.inputs[3], "padding mask");
  if (op.attrs->fused) {
    keep(g, out, op.outputs[0], "output");
    keep(g, out, op.outputs[1], "logsumexp");
    return;
  }
  keep(g, out, op.outputs[1], "attention probabilities");
  if (op.attrs->p > 0) {
    keep(g, out, op.outputs[2], "attention dropout mask");
    keep(g, out, op.outputs[3], "dropped probabilities");
  }
}

// ---------------------------------------------------------------------------------------------
// attention_backward.

/// attention_backward(q, k, v, o, lse, dO) when fused, (q, k, v, P[, mask, dropped], dO)
/// when not: dq, dk, dv as gradMask asks. A padding mask comes right after v.
bool inferAttentionBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                            ShapeError &err) {
  if (!expectInputs(op, 5, 8, err))
    return false;
  for (unsigned i = 0; i < 3; ++i)
    if (gradWanted(op, i))
      outs.push_back({in(g, op, i).shape, g.tensors[op.inputs.back()].dtype});
  return true;
}

/// Bytes: q, k, v, o, dO and what the forward saved, read once, and dq, dk, dv written —
/// all a flash kernel moves. A materialised backward also moves the score-sized matrices
/// between its kernels (the forward's counting convention): dP = dO·Vᵀ written (1), the
/// softmax backward reading P and dP and writing dS (3), dS read for dQ and dK (2) and P read
/// for dV (1); with dropout, dP read and rewritten through the mask (2, + the mask's S bytes)
/// and the dropped probabilities read for dV instead of P.
struct AttentionBackwardCounts : BaseCounts {
  /// The gradients gradMask asks for, as the forward op's rule counts them.
  template <class C> static Num<C> flops(C &c) {
    Terms<C> t{c};
    for (unsigned i = 0; i < 3; ++i)
      if (gradWanted(c.op, i))
        t.add(AttentionCounts::grad(c, i));
    c.note("dq, dk and dv as asked, each as the attention rule counts it");
    return t.total();
  }
  /// S·act bytes of the score-sized matrices a materialised backward moves.
  template <class C> static Num<C> scoreBytes(C &c, double matrices) {
    AttnTerms<C> t = attentionTerms(c);
    return c.lit(matrices) * t.S * c.lit(static_cast<double>(bytesOf(c.g.activationDtype)));
  }
  template <class C> static Num<C> read(C &c) {
    const Op &op = c.op;
    if (op.attrs->fused) {
      c.note("q, k, v, o, the logsumexp and dO once each (flash)");
      return sumBytes(c, op.inputs, "in");
    }
    // Every input once except the saved matrices (P, and with dropout the mask and the dropped
    // P), which are counted among the score-sized reads below.
    size_t firstSaved = op.attrs->hasMask ? 4 : 3;
    Terms<C> t{c};
    for (unsigned i = 0; i < op.inputs.size(); ++i)
      if (i < firstSaved || i + 1 == op.inputs.size())
        t.add(c.bytesOf(op.inputs[i], "in", i));
    bool drop = op.attrs->p > 0;
    c.note(drop ? "unfused: P and dP read by the softmax backward, dS for dQ and dK, the dropped "
                  "P for dV, dP through the mask (read twice) and the 1-byte mask"
                : "unfused: P and dP read by the softmax backward, dS for dQ and dK, P for dV");
    Num<C> r = t.total() + scoreBytes(c, drop ? 6 : 5);
    if (!drop)
      return r;
    return r + attentionTerms(c).S;
  }
  template <class C> static Num<C> written(C &c) {
    Num<C> w = sumBytes(c, c.op.outputs, "out");
    if (c.op.attrs->fused) {
      c.note("dq, dk and dv as asked");
      return w;
    }
    c.note("dq, dk, dv, and the score-sized dP and dS (and with dropout dP after the mask)");
    return w + scoreBytes(c, c.op.attrs->p > 0 ? 3 : 2);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    llvm::SmallVector<bool, 3> need = maskBits(op, 3);
    r.executedFlops = executedBackwardAttention(g, op, need);
    AttnDims d = attnDims(g, op);
    r.matmulFlops = 0;
    // the products of each gradient: 2·F·(dh + dv) for dq, 2·F·dh for dk, 2·F·dv for dv
    for (unsigned i = 0; i < 3; ++i)
      if (need[i])
        r.matmulFlops += 2 * d.F * (i == 0 ? d.dh + d.dv : i == 1 ? d.dh : d.dv);
    // Flash attention recomputes P = exp(s − lse): an exp per computed score (and the cap's
    // tanh); materialised attention reads the saved P (and recomputes the cap's tanh).
    if (op.attrs->fused && anyNeed(need))
      r.transcendentals = expsPerScore(op) * d.F * computedFraction(g, op);
    else if (op.attrs->softcap > 0 && anyNeed(need))
      r.transcendentals = d.F * computedFraction(g, op);
  }
};

// The attributes that change attention's counts, as --emit=ir prints them and explain words them.
void printAttention(const Graph &, const Op &op, llvm::raw_ostream &os) {
  const OpAttrs &a = op.attrs;
  os << " {heads = " << a.heads << ", kv_heads = " << a.kvHeads
     << ", causal = " << (a.causal ? "true" : "false") << ", fused = " << (a.fused ? "true" : "false");
  if (a.p > 0)
    os << ", dropout = " << significant(a.p);
  if (a.attnWindow > 0)
    os << ", window = " << a.attnWindow;
  if (a.softcap > 0)
    os << ", softcap = " << significant(a.softcap);
  if (a.latent > 0)
    os << ", latent = " << a.latent << ", latent_rope = " << a.latentRope;
  os << "}";
}
std::string describeAttention(const Graph &, const Op &op) {
  const OpAttrs &at = op.attrs;
  return "heads = " + std::to_string(at.heads) +
         ", kv_heads = " + std::to_string(at.kvHeads ? at.kvHeads : at.heads) + ", " +
         (at.causal ? "causal" : "not causal") + ", " +
         (at.fused ? "fused (flash)" : "unfused (scores materialised)") +
         (at.p > 0 ? ", dropout = " + formatFormulaNumber(at.p) : std::string()) +
         (at.attnWindow > 0 ? ", window = " + std::to_string(at.attnWindow) : std::string()) +
         (at.softcap > 0 ? ", softcap = " + formatFormulaNumber(at.softcap) : std::string()) +
         (at.latent > 0 ? ", a latent KV cache of " + std::to_string(at.latent) + " + " +
                              std::to_string(at.latentRope) + " values per token (MLA)"
                        : std::string());
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE_ATTRS(Attention, inferAttention, AttentionCounts, executedBackwardAttention, savedAttention, &printAttention, &describeAttention)
RULE(AttentionBackward, inferAttentionBackward, AttentionBackwardCounts, executedDefault, savesNothing)

} // namespace tally::oprules

namespace tally {

double tiledScoreRatio(const Graph &g, const Op &op, double tile) {
  if (op.kind != OpKind::Attention || !op.attrs->fused || !op.attrs->causal || op.attrs->attnWindow > 0)
    return 1;
  oprules::AttnDims d = oprules::attnDims(g, op);
  if (d.s != d.skv || !(d.s > 0))
    return 1;
  return std::max(1.0, tiledCausalScores(d.s, tile) / (d.s * (d.s + 1) / 2));
}

} // namespace tally
