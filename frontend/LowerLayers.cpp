// Lowering of the layer families: matmul (ir/ops/Matmul.cpp), moe (Moe.cpp), attention
// (Attention.cpp), softmax and the norms (Norm.cpp), cross entropy (Loss.cpp), convolution and
// pooling (Conv.cpp), and their backward ops, which only the autodiff makes. Each kind's table
// entry follows the code that reads its arguments; frontend/LowerOps.cpp indexes them.
#include "frontend/Lowerer.h"

#include "support/Format.h"

#include <cmath>

namespace tally {
namespace lowering {

// ---------------------------------------------------------------------------------------------
// Matrix products: matmul, and moe (each token through its experts' gate, up and down
// matmuls).

Value Lowerer::matmulOp(const Bound &b, const Expr &e, Scope &scope) {
  TensorId x = kNone, y = kNone;
  if (!tensorArg(b, "a", x) || !tensorArg(b, "b", y))
    return {};
  return op1(OpKind::Matmul, {x, y}, OpAttrs(), e, scope);
}
LOWERING(Matmul, &Lowerer::matmulOp)

Value Lowerer::moeOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  llvm::SmallVector<TensorId, 3> ins(6, kNone);
  static const char *const names[] = {"x", "gates", "indices", "w_gate", "w_up", "w_down"};
  for (unsigned i = 0; i < 6; ++i)
    if (!tensorArg(b, names[i], ins[i]))
      return {};
  auto cf = numberArg(b, "capacity_factor");
  if (!cf)
    return {};
  if (*cf < 0 || *cf > 1e6) {
    const Value &v = b.values[slot(b, "capacity_factor")];
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "capacity_factor is 0 (no cap) or a positive factor such as 1.25, not " +
                     significant(*cf))
        .range(v.range);
    return {};
  }
  attrs.capacity = *cf;
  return op1(OpKind::Moe, ins, attrs, e, scope);
}
LOWERING(Moe, &Lowerer::moeOp)
NO_LOWERING(MoeBackward, "the autodiff's: moe's gradients")

// ---------------------------------------------------------------------------------------------
// attention(q, k, v, heads, ...): its heads, mask, dropout and flags.

/// `window = w` (a sliding window: query i sees keys i − w < j ≤ i; 0, the default, none) and
/// `softcap = c` (scores become c·tanh(scores / c); 0, the default, none). A window needs
/// `causal = true`: it is Mistral's and Gemma 2's band below the diagonal, and a window without
/// the causal mask (both sides of the diagonal) is not defined here.
bool Lowerer::attentionScores(const Bound &b, bool causal, OpAttrs &attrs) {
  auto window = intArg(b, "window");
  auto cap = numberArg(b, "softcap");
  if (!window || !cap)
    return false;
  if (*window < 0) {
    const Value &v = b.values[slot(b, "window")];
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "'window' is how many keys each query sees (itself included): a positive "
                 "whole number, or 0 for no window, not " +
                     std::to_string(*window))
        .range(v.range);
    return false;
  }
  if (*window > 0 && !causal) {
    const Value &v = b.values[slot(b, "window")];
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "a sliding window (window = " + std::to_string(*window) +
                     ") needs causal = true: query i sees keys i - w < j <= i")
        .range(v.range);
    return false;
  }
  if (!(*cap >= 0) || !std::isfinite(*cap)) {
    const Value &v = b.values[slot(b, "softcap")];
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "'softcap' caps the scores at ±c (c·tanh(score / c)): a positive number, or 0 "
                 "for no cap, not " +
                     significant(*cap))
        .range(v.range);
    return false;
  }
  attrs.attnWindow = *window;
  attrs.softcap = *cap;
  return attentionLatent(b, attrs);
}

/// latent = r, latent_rope = p: multi-head latent attention (DeepSeek-V2's MLA) caches, per
/// token, the compressed c_kv of r values and the decoupled RoPE key of p, not K and V; the
/// decode step is priced in the absorbed form (passes/Inference.cpp). Checked against q, k and
/// v's shapes by the op's rule.
bool Lowerer::attentionLatent(const Bound &b, OpAttrs &attrs) {
  auto latent = intArg(b, "latent");
  auto rope = intArg(b, "latent_rope");
  if (!latent || !rope)
    return false;
  auto bad = [&](llvm::StringRef param, const std::string &msg) {
    const Value &v = b.values[slot(b, param)];
    auto d = diags.report(DiagKind::InvalidValue, v.range.Start, msg);
    d.range(v.range);
    context(d);
    return false;
  };
  if (*latent < 0)
    return bad("latent", "'latent' is the width of the compressed KV the cache holds per token "
                         "(MLA's kv_lora_rank): a positive whole number, or 0 for K and V, not " +
                             std::to_string(*latent));
  if (*rope < 0 || (*rope > 0 && *latent == 0))
    return bad("latent_rope",
               *rope < 0 ? "'latent_rope' is the width of the RoPE key cached beside the latent "
                           "(MLA's qk_rope_head_dim): a whole number >= 0, not " +
                               std::to_string(*rope)
                         : "'latent_rope' = " + std::to_string(*rope) +
                               " is the RoPE key cached beside a latent: it needs latent > 0");
  attrs.latent = *latent;
  attrs.latentRope = *rope;
  return true;
}

Value Lowerer::attentionOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone, y = kNone, z = kNone;
  if (!tensorArg(b, "q", x) || !tensorArg(b, "k", y) || !tensorArg(b, "v", z))
    return {};
  auto heads = intArg(b, "heads");
  auto kv = intArg(b, "kv_heads", heads ? *heads : 1); // kv_heads = heads
  auto causal = boolArg(b, "causal");
  auto fused = boolArg(b, "fused");
  auto p = probability(b, "dropout");
  auto alibi = boolArg(b, "alibi");
  if (!heads || !kv || !causal || !fused || !p || !alibi)
    return {};
  TensorId mask = kNone;
  size_t maskSlot = slot(b, "mask");
  if (b.has(maskSlot) && !tensorArg(b, "mask", mask))
    return {};
  if (mask != kNone && isFloat(g.tensors[mask].dtype)) {
    diags.report(DiagKind::TypeMismatch, b.values[maskSlot].range.Start,
                 "'mask' of 'attention' is a padding mask of integers or booleans "
                 "[batch, seq_kv] (nonzero: attend), not " +
                     nameOf(g.tensors[mask].dtype).str())
        .range(b.values[maskSlot].range);
    return {};
  }
  if (*heads <= 0 || *kv <= 0) {
    diags.report(DiagKind::InvalidValue, e.range.Start,
                 "attention needs a positive number of heads")
        .range(e.range);
    return {};
  }
  if (!attentionScores(b, *causal, attrs))
    return {};
  attrs.heads = *heads;
  attrs.kvHeads = *kv;
  attrs.causal = *causal;
  attrs.fused = *fused;
  attrs.p = *p;
  attrs.alibi = *alibi;
  attrs.hasMask = mask != kNone;
  if (mask != kNone)
    return op1(OpKind::Attention, {x, y, z, mask}, attrs, e, scope);
  return op1(OpKind::Attention, {x, y, z}, attrs, e, scope);
}
LOWERING(Attention, &Lowerer::attentionOp)
NO_LOWERING(AttentionBackward, "the autodiff's: attention's gradients")

// ---------------------------------------------------------------------------------------------
// Softmax and the normalizations: softmax, layer_norm and rms_norm.

Value Lowerer::softmaxOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
  if (!tensorArg(b, "x", x))
    return {};
  auto dim = intArg(b, "dim");
  if (!dim)
    return {};
  attrs.dim = *dim;
  return op1(OpKind::Softmax, {x}, attrs, e, scope);
}
LOWERING(Softmax, &Lowerer::softmaxOp)

Value Lowerer::layerNormOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone, y = kNone, z = kNone;
  if (!tensorArg(b, "x", x))
    return {};
  bool weight = b.has(slot(b, "weight")), bias = b.has(slot(b, "bias"));
  if ((weight && !tensorArg(b, "weight", y)) || (bias && !tensorArg(b, "bias", z)))
    return {};
  if (bias && !weight) { // the op's inputs are (x), (x, weight) or (x, weight, bias)
    const Value &v = b.values[slot(b, "bias")];
    auto d = diags.report(DiagKind::WrongArgCount, v.range.Start,
                          "'layer_norm' has a bias but no weight: a layer norm without a weight "
                          "(LayerNorm(d, affine = false)) has no bias either");
    d.range(v.range);
    context(d);
    return {};
  }
  auto eps = numberArg(b, "eps");
  if (!eps)
    return {};
  attrs.eps = *eps;
  if (!weight)
    return op1(OpKind::LayerNorm, {x}, attrs, e, scope);
  if (!bias)
    return op1(OpKind::LayerNorm, {x, y}, attrs, e, scope);
  return op1(OpKind::LayerNorm, {x, y, z}, attrs, e, scope);
}
LOWERING(LayerNorm, &Lowerer::layerNormOp)

Value Lowerer::rmsNormOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone, y = kNone;
  if (!tensorArg(b, "x", x) || !tensorArg(b, "weight", y))
    return {};
  auto eps = numberArg(b, "eps");
  if (!eps)
    return {};
  attrs.eps = *eps;
  attrs.norm = key.norm; // how the plan's step runs it (ir/Plan.h normKernel)
  return op1(OpKind::RmsNorm, {x, y}, attrs, e, scope);
}
LOWERING(RmsNorm, &Lowerer::rmsNormOp)
NO_LOWERING(SoftmaxBackward, "the autodiff's: softmax's gradient")
NO_LOWERING(LayerNormBackward, "the autodiff's: layer_norm's gradients")
NO_LOWERING(RmsNormBackward, "the autodiff's: rms_norm's gradients")

// ---------------------------------------------------------------------------------------------
// The loss: cross_entropy(logits, labels).

Value Lowerer::crossEntropyOp(const Bound &b, const Expr &e, Scope &scope) {
  TensorId x = kNone, y = kNone;
  if (!tensorArg(b, "logits", x) || !tensorArg(b, "labels", y))
    return {};
  OpAttrs attrs;
  attrs.loss = key.loss; // how the plan's step runs it (ir/Plan.h crossEntropyKernel)
  return op1(OpKind::CrossEntropy, {x, y}, attrs, e, scope);
}
LOWERING(CrossEntropy, &Lowerer::crossEntropyOp)
NO_LOWERING(CrossEntropyBackward, "the autodiff's: cross_entropy's gradient")

// ---------------------------------------------------------------------------------------------
// Convolutions and pooling over the last two dims: conv2d, max_pool2d, avg_pool2d.

Value Lowerer::conv2dOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone, y = kNone, z = kNone;
  if (!tensorArg(b, "x", x) || !tensorArg(b, "weight", y))
    return {};
  if (b.has(slot(b, "bias")) && !tensorArg(b, "bias", z))
    return {};
  if (!pairArg(b, "stride", 1, attrs.strides) || !pairArg(b, "padding", 0, attrs.pads))
    return {};
  const Shape &w = g.tensors[y].shape;
  if (w.size() == 4) {
    attrs.window[0] = w[2].size;
    attrs.window[1] = w[3].size;
  }
  if (z == kNone)
    return op1(OpKind::Conv2d, {x, y}, attrs, e, scope);
  return op1(OpKind::Conv2d, {x, y, z}, attrs, e, scope);
}
LOWERING(Conv2d, &Lowerer::conv2dOp)

/// max_pool2d and avg_pool2d(x, kernel, stride, padding).
Value Lowerer::poolOp(const Bound &b, const Expr &e, Scope &scope) {
  OpAttrs attrs;
  TensorId x = kNone;
  if (!tensorArg(b, "x", x) || !pairArg(b, "kernel", 1, attrs.window))
    return {};
  // The stride defaults to the window, as in PyTorch.
  if (!pairArg(b, "stride", 1, attrs.strides, attrs.window[0]) ||
      !pairArg(b, "padding", 0, attrs.pads))
    return {};
  if (!b.has(slot(b, "stride")))
    attrs.strides[1] = attrs.window[1];
  return op1(b.prim->kind, {x}, attrs, e, scope);
}
LOWERING(MaxPool2d, &Lowerer::poolOp)
LOWERING(AvgPool2d, &Lowerer::poolOp)
NO_LOWERING(Conv2dBackward, "the autodiff's: conv2d's gradients")
NO_LOWERING(PoolBackward, "the autodiff's: a pooling's gradient")

} // namespace lowering
} // namespace tally
