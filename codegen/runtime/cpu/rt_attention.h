// tally CPU runtime: scaled dot-product attention, forward and backward, causal or not,
// grouped-query (query head h reads kv head h / (H / Hkv)), with optional dropout on the
// probabilities. Fused mode (scores == null) is flash-style: an online softmax over blocks of
// keys, storing only o and lse; materialised mode writes the probabilities P [B, H, S, Skv].
// Work is split over (batch, head) pairs; each pair stages its K and V head in the arithmetic
// type once.
#pragma once

#include "rt_ctx.h"
#include "rt_elementwise.h"   // detail::KeepStream

#include <algorithm>
#include <type_traits>

namespace rt {
namespace detail {

/// Checks attention's sizes; returns the scale to use (scale <= 0 means 1/√hd).
inline float check_attention(const char* name, int64_t B, int64_t S, int64_t Skv, int64_t H,
                             int64_t Hkv, int64_t hd, float scale, float p) {
  require_sizes(name, {B, S, Skv, H, Hkv, hd});
  require(Hkv > 0 && H % Hkv == 0, name, "H = " + std::to_string(H) + " is not a multiple of Hkv = " + std::to_string(Hkv));
  require(hd > 0, name, "head size must be positive");
  require(p >= 0.0f && p < 1.0f, name, "dropout p = " + std::to_string(p) + " is not in [0, 1)");
  return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(hd));
}

/// Keys query i may see: j < visible_keys(i) (all Skv unless causal: j <= i + Skv − S).
inline int64_t visible_keys(bool causal, int64_t i, int64_t S, int64_t Skv) {
  if (!causal) return Skv;
  return std::max<int64_t>(0, std::min<int64_t>(Skv, i + (Skv - S) + 1));
}

/// Copies head `head` of a [Sx, nheads·hd] row block (batch entry b) into a dense acc buffer.
template <class T>
void stage_head(const T* x, int64_t b, int64_t Sx, int64_t nheads, int64_t head, int64_t hd, acc_t<T>* out) {
  const int64_t width = nheads * hd;
  for (int64_t j = 0; j < Sx; ++j) {
    const T* src = x + (b * Sx + j) * width + head * hd;
    for (int64_t d = 0; d < hd; ++d) out[j * hd + d] = load(src[d]);
  }
}

/// fp64 (the finite-difference tests) recomputes each row's log-sum-exp in double in the
/// backward instead of reading the fp32 one the forward saved.
template <class T> constexpr bool kExactStatsAttn = std::is_same<T, double>::value;

/// Σ a[d]·b[d].
template <class A> inline A dot(const A* a, const A* b, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

} // namespace detail

/// o = softmax(scale · q kᵀ [+ causal mask]) (with dropout) · v per (batch, head); lse [B, H, S].
template <class T>
void attention_fwd(Ctx& ctx, const T* q, const T* k, const T* v, T* o, float* lse, T* scores,
                   int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv, int64_t hd, float scale,
                   bool causal, float p, uint64_t seed, uint64_t stream) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "attention_fwd");
  const A sc = static_cast<A>(detail::check_attention("attention_fwd", B, S, Skv, H, Hkv, hd, scale, p));
  const int64_t group = H / Hkv, qw = H * hd;
  const A pd = static_cast<A>(p), keepScale = A(1) / (A(1) - pd);
  constexpr int64_t KB = 64;   // keys per online-softmax block
#pragma omp parallel num_threads(ctx.nthreads()) if (B * H * S * Skv * hd > 65536)
  {
    std::vector<A> K, Vh, qi, acc, s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      A* Kp = detail::scratch(K, Skv * hd);
      A* Vp = detail::scratch(Vh, Skv * hd);
      A* qp = detail::scratch(qi, hd);
      A* ap = detail::scratch(acc, hd);
      A* sp = detail::scratch(s, std::max<int64_t>(Skv, KB));
      detail::stage_head(k, b, Skv, Hkv, kvh, hd, Kp);
      detail::stage_head(v, b, Skv, Hkv, kvh, hd, Vp);
      detail::KeepStream keep(seed, stream, p);
      for (int64_t i = 0; i < S; ++i) {
        const T* qrow = q + (b * S + i) * qw + h * hd;
        for (int64_t d = 0; d < hd; ++d) qp[d] = load(qrow[d]);
        for (int64_t d = 0; d < hd; ++d) ap[d] = 0;
        const int64_t jmax = detail::visible_keys(causal, i, S, Skv);
        const uint64_t ebase = static_cast<uint64_t>(((b * H + h) * S + i) * Skv);
        A m = -m_inf<A>(), l = 0;
        if (scores == nullptr) {
          // Fused: blocks of keys, rescaling the running output when the maximum grows.
          for (int64_t j0 = 0; j0 < jmax; j0 += KB) {
            const int64_t j1 = std::min(jmax, j0 + KB);
            A bm = m;
            for (int64_t j = j0; j < j1; ++j) {
              sp[j - j0] = sc * detail::dot(qp, Kp + j * hd, hd);
              bm = sp[j - j0] > bm ? sp[j - j0] : bm;
            }
            const A corr = m_exp(m - bm);   // m = −inf on the first block: 0
            l *= corr;
            for (int64_t d = 0; d < hd; ++d) ap[d] *= corr;
            m = bm;
            for (int64_t j = j0; j < j1; ++j) {
              A e = m_exp(sp[j - j0] - m);
              l += e;
              if (p > 0.0f) e = keep.keep(ebase + j) ? e * keepScale : A(0);
              const A* vr = Vp + j * hd;
#pragma omp simd
              for (int64_t d = 0; d < hd; ++d) ap[d] += e * vr[d];
            }
          }
        } else {
          // Materialised: the whole row of scores, then P written in the storage type.
          for (int64_t j = 0; j < jmax; ++j) {
            sp[j] = sc * detail::dot(qp, Kp + j * hd, hd);
            m = sp[j] > m ? sp[j] : m;
          }
          for (int64_t j = 0; j < jmax; ++j) l += m_exp(sp[j] - m);
          T* prow = scores + ((b * H + h) * S + i) * Skv;
          for (int64_t j = 0; j < Skv; ++j) {
            if (j >= jmax) { prow[j] = store<T>(A(0)); continue; }
            prow[j] = store<T>(m_exp(sp[j] - m) / l);
            A e = load(prow[j]);
            if (p > 0.0f) e = keep.keep(ebase + j) ? e * keepScale : A(0);
            const A* vr = Vp + j * hd;
#pragma omp simd
            for (int64_t d = 0; d < hd; ++d) ap[d] += e * vr[d];
          }
        }
        const A norm = (scores == nullptr && l > A(0)) ? A(1) / l : A(1);
        T* orow = o + (b * S + i) * qw + h * hd;
        for (int64_t d = 0; d < hd; ++d) orow[d] = store<T>(ap[d] * norm);
        if (lse) lse[(b * H + h) * S + i] = static_cast<float>(l > A(0) ? m + m_log(l) : -m_inf<A>());
      }
    }
  }
}

/// dq, dk, dv (+)= the gradients of attention_fwd. Uses P from `scores` when materialised, else
/// exp(scale · q·k − lse) (fp64 recomputes the lse in double).
template <class T>
void attention_bwd(Ctx& ctx, const T* q, const T* k, const T* v, const T* o, const float* lse,
                   const T* scores, const T* dO, T* dq, T* dk, T* dv, int64_t B, int64_t S, int64_t Skv,
                   int64_t H, int64_t Hkv, int64_t hd, float scale, bool causal, float p, uint64_t seed,
                   uint64_t stream, bool accumulate) {
  using A = acc_t<T>;
  (void)o;   // D_i = Σ_j P_ij dP_ij is computed from P directly (equal to dO_i · o_i)
  detail::KernelScope ks(ctx, "attention_bwd");
  const A sc = static_cast<A>(detail::check_attention("attention_bwd", B, S, Skv, H, Hkv, hd, scale, p));
  detail::require(scores != nullptr || lse != nullptr || detail::kExactStatsAttn<T>, "attention_bwd",
                  "fused mode needs the lse the forward saved");
  const int64_t group = H / Hkv, qw = H * hd, kw = Hkv * hd;
  const A pd = static_cast<A>(p), keepScale = A(1) / (A(1) - pd);
  // dK and dV of every kv head in the arithmetic type; query heads of one group add into the same
  // kv head under that head's lock.
  std::vector<A> dK(static_cast<size_t>(B * Skv * kw), A(0)), dV(static_cast<size_t>(B * Skv * kw), A(0));
  std::vector<omp_lock_t> locks(static_cast<size_t>(B * Hkv));
  for (auto& lk : locks) omp_init_lock(&lk);
#pragma omp parallel num_threads(ctx.nthreads()) if (B * H * S * Skv * hd > 65536)
  {
    std::vector<A> K, Vh, tdK, tdV, qi, gi, dqi, P, dP;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      A* Kp = detail::scratch(K, Skv * hd);
      A* Vp = detail::scratch(Vh, Skv * hd);
      A* dKp = detail::scratch(tdK, Skv * hd);
      A* dVp = detail::scratch(tdV, Skv * hd);
      A* qp = detail::scratch(qi, hd);
      A* gp = detail::scratch(gi, hd);
      A* dqp = detail::scratch(dqi, hd);
      A* Pp = detail::scratch(P, Skv);
      A* dPp = detail::scratch(dP, Skv);
      detail::stage_head(k, b, Skv, Hkv, kvh, hd, Kp);
      detail::stage_head(v, b, Skv, Hkv, kvh, hd, Vp);
      std::fill(dKp, dKp + Skv * hd, A(0));
      std::fill(dVp, dVp + Skv * hd, A(0));
      detail::KeepStream keep(seed, stream, p);
      for (int64_t i = 0; i < S; ++i) {
        const T* qrow = q + (b * S + i) * qw + h * hd;
        const T* grow = dO + (b * S + i) * qw + h * hd;
        for (int64_t d = 0; d < hd; ++d) { qp[d] = load(qrow[d]); gp[d] = load(grow[d]); dqp[d] = 0; }
        const int64_t jmax = detail::visible_keys(causal, i, S, Skv);
        const uint64_t ebase = static_cast<uint64_t>(((b * H + h) * S + i) * Skv);
        // P of the row.
        if (scores != nullptr) {
          const T* prow = scores + ((b * H + h) * S + i) * Skv;
          for (int64_t j = 0; j < jmax; ++j) Pp[j] = load(prow[j]);
        } else {
          for (int64_t j = 0; j < jmax; ++j) Pp[j] = sc * detail::dot(qp, Kp + j * hd, hd);
          A l;
          if (detail::kExactStatsAttn<T> || lse == nullptr) {
            OnlineSoftmax<A> os = online_softmax_init<A>();
            for (int64_t j = 0; j < jmax; ++j) online_softmax_add(os, Pp[j]);
            l = online_softmax_lse(os);
          } else {
            l = static_cast<A>(lse[(b * H + h) * S + i]);
          }
          for (int64_t j = 0; j < jmax; ++j) Pp[j] = m_exp(Pp[j] - l);
        }
        // dP (through the dropout), dV, and D = Σ P·dP.
        A D = 0;
        for (int64_t j = 0; j < jmax; ++j) {
          A dpd = detail::dot(gp, Vp + j * hd, hd);
          A f = A(1);
          if (p > 0.0f) f = keep.keep(ebase + j) ? keepScale : A(0);
          dPp[j] = dpd * f;
          const A pdrop = Pp[j] * f;
          A* dvr = dVp + j * hd;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) dvr[d] += pdrop * gp[d];
          D += Pp[j] * dPp[j];
        }
        // dS = P (dP − D); dq = scale Σ dS k; dK += scale dS q.
        for (int64_t j = 0; j < jmax; ++j) {
          const A ds = sc * softmax_grad(Pp[j], dPp[j], D);
          const A* kr = Kp + j * hd;
          A* dkr = dKp + j * hd;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) {
            dqp[d] += ds * kr[d];
            dkr[d] += ds * qp[d];
          }
        }
        T* dqrow = dq + (b * S + i) * qw + h * hd;
        for (int64_t d = 0; d < hd; ++d) detail::put(dqrow[d], dqp[d], accumulate);
      }
      omp_lock_t& lk = locks[static_cast<size_t>(b * Hkv + kvh)];
      omp_set_lock(&lk);
      for (int64_t j = 0; j < Skv; ++j) {
        A* gk = dK.data() + (b * Skv + j) * kw + kvh * hd;
        A* gv = dV.data() + (b * Skv + j) * kw + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) { gk[d] += dKp[j * hd + d]; gv[d] += dVp[j * hd + d]; }
      }
      omp_unset_lock(&lk);
    }
  }
  for (auto& lk : locks) omp_destroy_lock(&lk);
  const int64_t n = B * Skv * kw;
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t e = 0; e < n; ++e) {
    detail::put(dk[e], dK[e], accumulate);
    detail::put(dv[e], dV[e], accumulate);
  }
}

} // namespace rt
