// tally runtime, common: per-row arithmetic (online softmax, norm statistics and gradients,
// cross-entropy, rotary angles). A launcher reduces a row however it likes (a loop on the CPU, a
// warp or block on CUDA) and calls these for the arithmetic of each element and each merge.
#pragma once

#include "tally_math.h"

namespace rt {

// ---- online softmax ------------------------------------------------------------------------

/// Running maximum m and Σ e^(x − m) of a row seen so far (Milakov & Gimelshein's online
/// softmax). Starts empty: m = −inf, s = 0. −inf entries (masked) contribute nothing.
template <class A> struct OnlineSoftmax {
  A m;
  A s;
};

/// An empty accumulator.
template <class A> TALLY_HD inline OnlineSoftmax<A> online_softmax_init() {
  OnlineSoftmax<A> r;
  r.m = -m_inf<A>();
  r.s = A(0);
  return r;
}

/// Add one value x to the accumulator.
template <class A> TALLY_HD inline void online_softmax_add(OnlineSoftmax<A>& a, A x) {
  if (x == -m_inf<A>()) return;
  if (x > a.m) {
    a.s = a.s * m_exp(a.m - x) + A(1);      // a.m may be −inf: exp(−inf) = 0
    a.m = x;
  } else {
    a.s += m_exp(x - a.m);
  }
}

/// Merge accumulator b into a (for parallel reductions).
template <class A> TALLY_HD inline void online_softmax_merge(OnlineSoftmax<A>& a, OnlineSoftmax<A> b) {
  if (b.m == -m_inf<A>()) return;
  if (a.m == -m_inf<A>()) { a = b; return; }
  if (b.m > a.m) {
    a.s = a.s * m_exp(a.m - b.m) + b.s;
    a.m = b.m;
  } else {
    a.s += b.s * m_exp(b.m - a.m);
  }
}

/// log Σ e^x of the row: m + log s (−inf for an empty or fully masked row).
template <class A> TALLY_HD inline A online_softmax_lse(OnlineSoftmax<A> a) {
  if (a.s == A(0)) return -m_inf<A>();
  return a.m + m_log(a.s);
}

/// Softmax backward for one element: dx = y · (dy − Σ_j y_j dy_j).
template <class A> TALLY_HD inline A softmax_grad(A y, A dy, A dot_y_dy) {
  return y * (dy - dot_y_dy);
}

// ---- layer norm and RMS norm ----------------------------------------------------------------

/// rstd = 1 / √(var + eps) (biased variance, eps inside the root).
template <class A> TALLY_HD inline A norm_rstd(A var, A eps) { return A(1) / m_sqrt(var + eps); }

/// Layer norm output for one element: (x − mean) · rstd · w + b.
template <class A> TALLY_HD inline A layer_norm_y(A x, A mean, A rstd, A w, A b) {
  return (x - mean) * rstd * w + b;
}

/// Layer norm input gradient for one element, with x̂ = (x − mean)·rstd, g = w·dy and the row
/// means mg = mean(g), mgx = mean(g·x̂):  dx = rstd · (g − mg − x̂ · mgx).
template <class A> TALLY_HD inline A layer_norm_dx(A xhat, A g, A mg, A mgx, A rstd) {
  return rstd * (g - mg - xhat * mgx);
}

/// RMS norm output for one element: x · rstd · w, rstd = 1/√(mean(x²) + eps).
template <class A> TALLY_HD inline A rms_norm_y(A x, A rstd, A w) { return x * rstd * w; }

/// RMS norm input gradient for one element, with x̂ = x·rstd, g = w·dy, mgx = mean(g·x̂):
/// dx = rstd · (g − x̂ · mgx).
template <class A> TALLY_HD inline A rms_norm_dx(A xhat, A g, A mgx, A rstd) {
  return rstd * (g - xhat * mgx);
}

// ---- cross-entropy ----------------------------------------------------------------------------

/// The label that marks a row as not counted (PyTorch's ignore_index, here −1).
constexpr int32_t kIgnoreLabel = -1;

/// Loss of one row: lse − logit[label] (0 for an ignored row; the caller skips it in the mean).
template <class A> TALLY_HD inline A cross_entropy_row_loss(A lse, A logit_label) {
  return lse - logit_label;
}

/// Gradient of one logit: dloss/count · (e^(x − lse) − [j == label]); 0 on ignored rows.
template <class A> TALLY_HD inline A cross_entropy_dlogit(A x, A lse, bool is_label, A dloss_over_count) {
  A p = m_exp(x - lse);
  return dloss_over_count * (p - (is_label ? A(1) : A(0)));
}

// ---- rotary embedding -------------------------------------------------------------------------

/// Inverse frequency of pair i in a head of size hd: 1 / theta^(2i/hd) (as Hugging Face computes
/// it, in the arithmetic type).
template <class A> TALLY_HD inline A rope_inv_freq(int64_t i, int64_t hd, A theta) {
  return A(1) / m_pow(theta, static_cast<A>(2 * i) / static_cast<A>(hd));
}

/// Rotation of the pair (x1 = x[i], x2 = x[i + hd/2]) by angle with cos c and sin s; the backward
/// passes −s (the rotation by the negative angle).
///   y1 = x1·c − x2·s,  y2 = x2·c + x1·s.
template <class A> TALLY_HD inline void rope_rotate(A x1, A x2, A c, A s, A& y1, A& y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}

} // namespace rt
