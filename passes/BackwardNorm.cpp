// The backward of the fused row-wise kinds (ir/ops Norm, Attention and Loss): softmax, layer
// and RMS norm, attention and cross entropy, one backward kind each, reading what the forward
// kept (the output, the row statistics, the logsumexp or probabilities). Their backward kinds have
// none. The table is passes/BackwardTable.h.
#include "passes/BackwardBuilder.h"

namespace tally {
namespace backward {

namespace {

/// softmax_backward(y, dy) → dx.
void softmaxBackward(Builder &b, const Op &op, TensorId dy) {
  TensorId x = op.inputs[0];
  if (!b.needs(x))
    return;
  Builder::Target t = b.target(x, b.g.tensors[dy].shape);
  b.emit(OpKind::SoftmaxBackward, {op.outputs[0], dy}, {t.t}, op.attrs, t.acc);
  b.finish(x, t);
}

/// layer_norm_backward(x, weight, mean, rstd, dy) → dx, dweight, dbias; without a weight
/// (layer_norm(x)) layer_norm_backward(x, mean, rstd, dy) → dx.
void layerNormBackward(Builder &b, const Op &op, TensorId dy) {
  llvm::SmallVector<TensorId, 3> in{op.inputs[0]};
  if (op.inputs.size() > 1)
    in.push_back(op.inputs[1]);
  in.append({op.outputs[1], op.outputs[2], dy});
  b.multiBackward(op, OpKind::LayerNormBackward, in, {0u, 1u, 2u});
}

/// rms_norm_backward(x, weight, rstd, dy) → dx, dweight.
void rmsNormBackward(Builder &b, const Op &op, TensorId dy) {
  b.multiBackward(op, OpKind::RmsNormBackward, {op.inputs[0], op.inputs[1], op.outputs[1], dy},
                  {0u, 1u});
}

/// attention_backward(q, k, v, [mask,] what the forward kept, dy) → dq, dk, dv: fused (flash)
/// attention its output and logsumexp, the unfused one every output after the first (the
/// probabilities, and the dropout mask and dropped probabilities when p > 0).
void attentionBackward(Builder &b, const Op &op, TensorId dy) {
  llvm::SmallVector<TensorId, 3> in{op.inputs[0], op.inputs[1], op.inputs[2]};
  if (op.attrs->hasMask)
    in.push_back(op.inputs[3]);
  if (op.attrs->fused) {
    in.push_back(op.outputs[0]);
    in.push_back(op.outputs[1]);
  } else {
    for (size_t i = 1; i < op.outputs.size(); ++i)
      in.push_back(op.outputs[i]);
  }
  in.push_back(dy);
  b.multiBackward(op, OpKind::AttentionBackward, in, {0u, 1u, 2u});
}

/// cross_entropy_backward(logits, labels, logsumexp, dy) → dlogits.
void crossEntropyBackward(Builder &b, const Op &op, TensorId dy) {
  TensorId x = op.inputs[0];
  if (!b.needs(x))
    return;
  bool acc = b.accumulateNext(x);
  b.emit(OpKind::CrossEntropyBackward, {x, op.inputs[1], op.outputs[1], dy}, {b.gradOf(x)},
         op.attrs, acc ? 1 : 0); // the forward's: how the loss runs (OpAttrs::loss)
}

} // namespace

BACKWARD(Softmax, softmaxBackward)
BACKWARD(LayerNorm, layerNormBackward)
BACKWARD(RmsNorm, rmsNormBackward)
BACKWARD(Attention, attentionBackward)
BACKWARD(CrossEntropy, crossEntropyBackward)
NO_BACKWARD(SoftmaxBackward, "a backward op: autodiff adds it and never differentiates it")
NO_BACKWARD(LayerNormBackward, "a backward op: autodiff adds it and never differentiates it")
NO_BACKWARD(RmsNormBackward, "a backward op: autodiff adds it and never differentiates it")
NO_BACKWARD(AttentionBackward, "a backward op: autodiff adds it and never differentiates it")
NO_BACKWARD(CrossEntropyBackward, "a backward op: autodiff adds it and never differentiates it")

} // namespace backward
} // namespace tally
