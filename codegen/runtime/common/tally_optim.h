// tally runtime, common: one element of every optimizer's update, as torch.optim computes it
// (single-tensor path, PyTorch 1.13 formulas and defaults). State buffers start at zero, which
// gives PyTorch's first step too (its momentum buffer starts as a copy of the first gradient,
// and μ·0 + g = g). g arrives already multiplied by gscale (loss-scale and clip factor).
#pragma once

#include "tally_math.h"

namespace rt {

/// SGD: g += wd·p; with momentum μ ≠ 0: buf = μ·buf + g, step along buf; p −= lr·step.
/// (dampening 0, no Nesterov: torch.optim.SGD's defaults.) `buf` is null without momentum.
TALLY_HD inline void sgd_element(float& p, float g, float* buf, float lr, float mu, float wd) {
  if (wd != 0.0f) g += wd * p;
  if (buf != nullptr && mu != 0.0f) {
    *buf = mu * *buf + g;
    g = *buf;
  }
  p -= lr * g;
}

/// AdaGrad (lr_decay 0, initial accumulator 0): g += wd·p; sum += g²; p −= lr · g / (√sum + eps).
TALLY_HD inline void adagrad_element(float& p, float g, float& sum, float lr, float eps, float wd) {
  if (wd != 0.0f) g += wd * p;
  sum += g * g;
  p -= lr * (g / (sqrtf(sum) + eps));
}

/// RMSprop (not centered): g += wd·p; sq = α·sq + (1−α)·g²; d = √sq + eps;
/// with momentum μ > 0: buf = μ·buf + g/d, p −= lr·buf; else p −= lr·g/d.
TALLY_HD inline void rmsprop_element(float& p, float g, float& sq, float* buf, float lr, float alpha,
                                     float eps, float wd, float mu) {
  if (wd != 0.0f) g += wd * p;
  sq = alpha * sq + (1.0f - alpha) * g * g;
  float d = sqrtf(sq) + eps;
  if (buf != nullptr && mu > 0.0f) {
    *buf = mu * *buf + g / d;
    p -= lr * *buf;
  } else {
    p -= lr * (g / d);
  }
}

/// The per-step scalars of Adam, computed in double as PyTorch does in Python:
/// step_size = lr / (1 − β1^t), bc2_sqrt = √(1 − β2^t).
struct AdamScalars {
  float step_size;
  float bc2_sqrt;
};

/// Adam's bias-correction scalars for 1-based step t.
TALLY_HD inline AdamScalars adam_scalars(float lr, float b1, float b2, int64_t step) {
  double t = static_cast<double>(step);
  double bc1 = 1.0 - pow(static_cast<double>(b1), t);
  double bc2 = 1.0 - pow(static_cast<double>(b2), t);
  AdamScalars s;
  s.step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  s.bc2_sqrt = static_cast<float>(sqrt(bc2));
  return s;
}

/// Adam / AdamW, one element. Adam (decoupled = false): g += wd·p. AdamW: p *= 1 − lr·wd first.
/// m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;  p −= step_size · m / (√v / bc2_sqrt + eps).
TALLY_HD inline void adam_element(float& p, float g, float& m, float& v, float lr, float b1, float b2,
                                  float eps, float wd, bool decoupled, AdamScalars s) {
  // The weight decay as selects of the same arithmetic, not branches: a loop of these then
  // vectorises (the CPU runtime's update loop; branches kept it scalar, ~3 ns per element).
  const bool decay = wd != 0.0f && decoupled, l2 = wd != 0.0f && !decoupled;
  p = decay ? p * (1.0f - lr * wd) : p;
  g = l2 ? g + wd * p : g;
  m = b1 * m + (1.0f - b1) * g;
  v = b2 * v + (1.0f - b2) * g * g;
  float denom = sqrtf(v) / s.bc2_sqrt + eps;
  p -= s.step_size * (m / denom);
}

/// Lion (Chen et al. 2023): c = β1·m + (1−β1)·g; p = p·(1 − lr·wd) − lr·sign(c);
/// m = β2·m + (1−β2)·g. sign(0) = 0.
TALLY_HD inline void lion_element(float& p, float g, float& m, float lr, float b1, float b2, float wd) {
  float c = b1 * m + (1.0f - b1) * g;
  float sg = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
  if (wd != 0.0f) p *= 1.0f - lr * wd;
  p -= lr * sg;
  m = b2 * m + (1.0f - b2) * g;
}

} // namespace rt
