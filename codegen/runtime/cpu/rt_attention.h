// tally CPU runtime: scaled dot-product attention, forward and backward, causal or not, with an
// optional sliding window and logit soft-cap (AttnScores), grouped-query (query head h reads kv
// head h / (H / Hkv)), with optional dropout on the probabilities. Work is split over (batch, head) pairs; each pair stages its q, k, v (and dO)
// head in the arithmetic type and walks blocks of 64 queries × 64 keys whose products are
// single-threaded OpenBLAS calls (sgemm, or dgemm for the fp64 tests).
// Fused mode (scores == null) is flash-style: an online softmax over the key blocks, storing only
// o and lse; the backward recomputes P = exp(s − lse). Materialised mode writes the
// probabilities P [B, H, S, Skv] (rounded to T) and the backward reads them.
#pragma once

#include "rt_ctx.h"
#include "rt_elementwise.h"   // detail::KeepStream
#include "rt_matmul.h"        // detail::gemm, detail::blas_single_threaded

#include <algorithm>
#include <type_traits>

namespace rt {
namespace detail {

/// Checks attention's sizes; returns the scale to use (scale <= 0 means 1/√hd).
inline float check_attention(const char* name, int64_t B, int64_t S, int64_t Skv, int64_t H,
                             int64_t Hkv, int64_t hd, float scale, float p) {
  require_sizes(name, {B, S, Skv, H, Hkv, hd});
  require(Hkv > 0 && H % Hkv == 0, name, [&] { return "H = " + std::to_string(H) + " is not a multiple of Hkv = " + std::to_string(Hkv); });
  require(hd > 0, name, "head size must be positive");
  require(p >= 0.0f && p < 1.0f, name, [&] { return "dropout p = " + std::to_string(p) + " is not in [0, 1)"; });
  return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(hd));
}

/// The row strides of q, k and v: `rows` with 0 replaced by the dense width (H·hd, Hkv·hd,
/// Hkv·hdv). Throws rt::Error for a stride smaller than its width. Call after check_attention.
inline AttnRows attention_rows(const char* name, AttnRows rows, int64_t H, int64_t Hkv, int64_t hd,
                               int64_t hdv) {
  require(hdv > 0, name, "value head size must be positive");
  require(H <= INT64_MAX / hd && H <= INT64_MAX / hdv, name, "H·hd overflows int64");   // hd > 0, H >= Hkv > 0 here
  const int64_t qw = H * hd, kw = Hkv * hd, vw = Hkv * hdv;
  auto one = [&](const char* what, int64_t s, int64_t width) {
    if (s == 0) return width;
    require(s >= width, name, [&] {
      return std::string(what) + " row stride " + std::to_string(s) + " is smaller than its width " +
             std::to_string(width);
    });
    return s;
  };
  return AttnRows{one("q", rows.q, qw), one("k", rows.k, kw), one("v", rows.v, vw)};
}

/// Keys query i may see: j < visible_keys(i) (all Skv unless causal: j <= i + Skv − S).
inline int64_t visible_keys(bool causal, int64_t i, int64_t S, int64_t Skv) {
  if (!causal) return Skv;
  return std::max<int64_t>(0, std::min<int64_t>(Skv, i + (Skv - S) + 1));
}

/// The first key query i may see: j >= first_key(i) (0 unless a sliding window of w keys:
/// j > i + Skv − S − w).
inline int64_t first_key(int64_t window, int64_t i, int64_t S, int64_t Skv) {
  if (window <= 0) return 0;
  return std::max<int64_t>(0, i + (Skv - S) + 1 - window);
}

/// Checks the window and the cap (AttnScores); a window needs the causal mask.
inline void check_scores(const char* name, AttnScores sm, bool causal) {
  require(sm.window >= 0, name, [&] { return "window = " + std::to_string(sm.window) + " is negative"; });
  require(sm.window == 0 || causal, name, "a sliding window needs the causal mask");
  require(sm.softcap >= 0.0f && sm.softcap < m_inf<float>(), name,
          [&] { return "softcap = " + std::to_string(sm.softcap) + " is not 0 or a positive number"; });
}

/// The soft-capped score c·tanh(s / c) (c > 0), or s.
template <class A> inline A soft_cap(A s, A c) { return c > A(0) ? c * m_tanh(s / c) : s; }

/// Copies head `head` of batch entry b of a [B, Sx, ·] tensor whose rows are `rowStride` apart
/// into a dense [Sx, hd] buffer in the arithmetic type, multiplied by `mul`.
template <class T>
void stage_head(const T* x, int64_t b, int64_t Sx, int64_t rowStride, int64_t head, int64_t hd, acc_t<T> mul,
                acc_t<T>* out) {
  for (int64_t j = 0; j < Sx; ++j) {
    const T* src = x + (b * Sx + j) * rowStride + head * hd;
    for (int64_t d = 0; d < hd; ++d) out[j * hd + d] = mul * load(src[d]);
  }
}

/// fp64 (the finite-difference tests) recomputes each row's log-sum-exp in double in the
/// backward instead of reading the fp32 one the forward saved.
template <class T> constexpr bool kExactStatsAttn = std::is_same<T, double>::value;

/// Blocks of queries and keys.
constexpr int64_t kAttnQB = 64, kAttnKB = 64;

/// The log-sum-exp of the (masked) scores of queries [i0, i1) of one head: Qs scaled q [S, hd],
/// K [Skv, hd]; Sb scratch of kAttnQB × kAttnKB.
template <class A>
void attention_rows_lse(const A* Qs, const A* K, int64_t i0, int64_t i1, int64_t S, int64_t Skv, int64_t hd,
                        bool causal, AttnScores sm, A* Sb, A* lse) {
  const int64_t qb = i1 - i0;
  std::vector<OnlineSoftmax<A>> os(static_cast<size_t>(qb), online_softmax_init<A>());
  const int64_t jend = visible_keys(causal, i1 - 1, S, Skv);
  const A cap = static_cast<A>(sm.softcap);
  for (int64_t j0 = std::min(jend, first_key(sm.window, i0, S, Skv)); j0 < jend; j0 += kAttnKB) {
    const int64_t kb = std::min(kAttnKB, jend - j0);
    gemm(false, true, qb, kb, hd, 1.0f, Qs + i0 * hd, hd, K + j0 * hd, hd, 0.0f, Sb, kb);
    for (int64_t r = 0; r < qb; ++r) {
      const int64_t jm = std::min(j0 + kb, visible_keys(causal, i0 + r, S, Skv));
      for (int64_t j = std::max(j0, first_key(sm.window, i0 + r, S, Skv)); j < jm; ++j)
        online_softmax_add(os[r], soft_cap(Sb[r * kb + (j - j0)], cap));
    }
  }
  for (int64_t r = 0; r < qb; ++r) lse[r] = online_softmax_lse(os[r]);
}

/// P of the key block [j0, j0 + kb) for queries [i0, i0 + qb) of one head, 0 where masked: read
/// from the saved probabilities Ph [S, Skv] of the head when materialised, else exp(cap(s) − L)
/// of the scores s = Qs·Kᵀ; with a soft cap also t = tanh(s / cap) in Tc (the scores are then
/// computed in either mode, for the cap's derivative). P and Tc are [qb, kb].
template <class T, class A>
void attention_block_p(const A* Qs, const A* K, int64_t i0, int64_t qb, int64_t j0, int64_t kb, int64_t S,
                       int64_t Skv, int64_t hd, bool causal, AttnScores sm, const A* L, const T* Ph, A* P,
                       A* Tc) {
  const A cap = static_cast<A>(sm.softcap);
  const bool capped = cap > A(0);
  A* R = Ph != nullptr ? Tc : P;   // the scores
  if (Ph == nullptr || capped) gemm(false, true, qb, kb, hd, 1.0f, Qs + i0 * hd, hd, K + j0 * hd, hd, 0.0f, R, kb);
  for (int64_t r = 0; r < qb; ++r) {
    const int64_t i = i0 + r, jm = std::min(j0 + kb, visible_keys(causal, i, S, Skv));
    const int64_t jl = std::min(jm, std::max(j0, first_key(sm.window, i, S, Skv)));
    A* prow = P + r * kb;
    A* trow = Tc + r * kb;
    for (int64_t j = jl; j < jm; ++j) {
      A x = Ph == nullptr || capped ? R[r * kb + (j - j0)] : A(0);
      if (capped) {
        const A t = m_tanh(x / cap);
        trow[j - j0] = t;
        x = cap * t;
      }
      prow[j - j0] = Ph != nullptr ? load(Ph[i * Skv + j]) : m_exp(x - L[r]);
    }
    for (int64_t j = j0; j < j0 + kb; ++j) {
      if (j >= jl && j < jm) continue;
      prow[j - j0] = 0;
      if (capped) trow[j - j0] = 0;
    }
  }
}

} // namespace detail

/// o = softmax(cap(scale · q kᵀ) [+ causal mask, window]) (with dropout) · v per (batch, head);
/// lse [B, H, S]. hdv > 0: value heads of hdv dims (o is [B, S, H·hdv]; MLA), else hd.
template <class T>
void attention_fwd(Ctx& ctx, const T* q, const T* k, const T* v, T* o, float* lse, T* scores,
                   int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv, int64_t hd, float scale,
                   bool causal, float p, uint64_t seed, uint64_t stream, AttnRows rows = {},
                   AttnScores sm = {}, int64_t hdv = 0) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "attention_fwd");
  const A sc = static_cast<A>(detail::check_attention("attention_fwd", B, S, Skv, H, Hkv, hd, scale, p));
  const int64_t dv = hdv > 0 ? hdv : hd;
  const AttnRows rs = detail::attention_rows("attention_fwd", rows, H, Hkv, hd, dv);
  detail::check_scores("attention_fwd", sm, causal);
  const A cap = static_cast<A>(sm.softcap);
  detail::blas_single_threaded();
  const int64_t group = H / Hkv, ow = H * dv;
  const A keepScale = A(1) / (A(1) - static_cast<A>(p));
  const bool materialised = scores != nullptr;
  constexpr int64_t QB = detail::kAttnQB, KB = detail::kAttnKB;
  // On the team above 65,536 (B·H·S·S_kv·hd), as the estimate prices it (kForkAttentionWork).
  detail::region(ctx.nthreads(), B * H * S * Skv * hd > 65536, [&] {
    std::vector<A> Qv, Kv, Vv, Ov, Sv, mv, lv, lsv;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      A* Q = detail::scratch(Qv, S * hd);
      A* K = detail::scratch(Kv, Skv * hd);
      A* V = detail::scratch(Vv, Skv * dv);
      A* O = detail::scratch(Ov, QB * dv);
      A* Sb = detail::scratch(Sv, QB * (materialised ? std::max<int64_t>(Skv, 1) : KB));
      A* m = detail::scratch(mv, QB);
      A* l = detail::scratch(lv, QB);
      A* ls = detail::scratch(lsv, QB);   // materialised: each row's lse, known once its P is
      detail::stage_head(q, b, S, rs.q, h, hd, sc, Q);   // scaled: Q·Kᵀ are the scores
      detail::stage_head(k, b, Skv, rs.k, kvh, hd, A(1), K);
      detail::stage_head(v, b, Skv, rs.v, kvh, dv, A(1), V);
      detail::KeepStream keep(seed, stream, p);
      for (int64_t i0 = 0; i0 < S; i0 += QB) {
        const int64_t qb = std::min(QB, S - i0);
        const int64_t jend = detail::visible_keys(causal, i0 + qb - 1, S, Skv);   // keys any row sees
        // The first key any row sees (the window of the block's first row); materialised mode
        // takes each row whole from key 0.
        const int64_t jbeg = materialised ? 0 : std::min(jend, detail::first_key(sm.window, i0, S, Skv));
        std::fill(O, O + qb * dv, A(0));
        for (int64_t r = 0; r < qb; ++r) { m[r] = -m_inf<A>(); l[r] = 0; }
        const int64_t blk = materialised ? std::max<int64_t>(jend, 1) : KB;
        for (int64_t j0 = jbeg; j0 < jend; j0 += blk) {
          const int64_t kb = std::min(blk, jend - j0);
          detail::gemm(false, true, qb, kb, hd, 1.0f, Q + i0 * hd, hd, K + j0 * hd, hd, 0.0f, Sb, kb);
          for (int64_t r = 0; r < qb; ++r) {
            const int64_t i = i0 + r, jm = std::min(j0 + kb, detail::visible_keys(causal, i, S, Skv));
            const int64_t jl = std::max(j0, detail::first_key(sm.window, i, S, Skv));
            A* srow = Sb + r * kb;
            if (jm <= jl) {   // this row sees none of the block
              for (int64_t j = j0; j < j0 + kb; ++j) srow[j - j0] = 0;
              continue;
            }
            for (int64_t j = j0; j < jl; ++j) srow[j - j0] = 0;
            if (cap > A(0))
              for (int64_t j = jl; j < jm; ++j) srow[j - j0] = detail::soft_cap(srow[j - j0], cap);
            A bm = m[r];
            for (int64_t j = jl; j < jm; ++j) bm = srow[j - j0] > bm ? srow[j - j0] : bm;
            const A corr = m_exp(m[r] - bm);   // m = −inf on the row's first block: 0
            l[r] *= corr;
            for (int64_t d = 0; d < dv; ++d) O[r * dv + d] *= corr;
            m[r] = bm;
            A sum = 0;
            for (int64_t j = jl; j < jm; ++j) {
              srow[j - j0] = m_exp(srow[j - j0] - bm);
              sum += srow[j - j0];
            }
            l[r] += sum;
            for (int64_t j = jm; j < j0 + kb; ++j) srow[j - j0] = 0;
            if (materialised) {
              // The row's only block: P rounded to T is written for the backward, and o uses the
              // same rounded values (so O comes out normalised: l = 1 below).
              T* prow = scores + ((b * H + h) * S + i) * Skv;
              const A inv = A(1) / l[r];
              for (int64_t j = 0; j < Skv; ++j) prow[j] = store<T>(j >= jl && j < jm ? srow[j] * inv : A(0));
              for (int64_t j = 0; j < jm; ++j) srow[j] = load(prow[j]);
              ls[r] = m[r] + m_log(l[r]);
              l[r] = A(1);
            }
            if (p > 0.0f) {
              const uint64_t ebase = static_cast<uint64_t>(((b * H + h) * S + i) * Skv);
              for (int64_t j = jl; j < jm; ++j)
                srow[j - j0] = keep.keep(ebase + j) ? srow[j - j0] * keepScale : A(0);
            }
          }
          detail::gemm(false, false, qb, dv, kb, 1.0f, Sb, kb, V + j0 * dv, dv, 1.0f, O, dv);
        }
        for (int64_t r = 0; r < qb; ++r) {
          const int64_t i = i0 + r;
          const bool none = detail::first_key(sm.window, i, S, Skv) >=
                            detail::visible_keys(causal, i, S, Skv);   // o = 0, lse = −inf
          if (materialised && none) {
            T* prow = scores + ((b * H + h) * S + i) * Skv;
            for (int64_t j = 0; j < Skv; ++j) prow[j] = store<T>(A(0));
          }
          const A norm = none ? A(0) : A(1) / l[r];
          T* orow = o + (b * S + i) * ow + h * dv;
          for (int64_t d = 0; d < dv; ++d) orow[d] = store<T>(O[r * dv + d] * norm);
          if (lse) {
            const A lv2 = none ? -m_inf<A>() : (materialised ? ls[r] : m[r] + m_log(l[r]));
            lse[(b * H + h) * S + i] = static_cast<float>(lv2);
          }
        }
      }
    }
  });
}

/// dq, dk, dv (+)= the gradients of attention_fwd. Uses P from `scores` when materialised, else
/// exp(cap(scale · q·k) − lse) (fp64 recomputes the lse in double). With a soft cap the scores
/// are recomputed in either mode for the cap's derivative 1 − tanh². D_i = Σ_j P_ij dP_ij (dP after the
/// dropout factor), which equals dO_i · o_i: fused mode reads o for it; materialised mode takes o
/// = nullptr (the plan keeps P, not o) and sums P·dP over the whole row, one block of all keys.
template <class T>
void attention_bwd(Ctx& ctx, const T* q, const T* k, const T* v, const T* o, const float* lse,
                   const T* scores, const T* dO, T* dq, T* dk, T* dvo, int64_t B, int64_t S, int64_t Skv,
                   int64_t H, int64_t Hkv, int64_t hd, float scale, bool causal, float p, uint64_t seed,
                   uint64_t stream, bool accumulate, AttnRows rows = {}, AttnScores sm = {},
                   int64_t hdv = 0) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "attention_bwd");
  const A sc = static_cast<A>(detail::check_attention("attention_bwd", B, S, Skv, H, Hkv, hd, scale, p));
  const int64_t dv = hdv > 0 ? hdv : hd;
  const AttnRows rs = detail::attention_rows("attention_bwd", rows, H, Hkv, hd, dv);
  detail::check_scores("attention_bwd", sm, causal);
  const A cap = static_cast<A>(sm.softcap);
  const bool capped = cap > A(0);
  const bool materialised = scores != nullptr;
  detail::require(materialised || o != nullptr, "attention_bwd", "fused mode needs o");
  detail::require(scores != nullptr || lse != nullptr || detail::kExactStatsAttn<T>, "attention_bwd",
                  "fused mode needs the lse the forward saved");
  detail::blas_single_threaded();
  const int64_t group = H / Hkv, ow = H * dv, kw = Hkv * hd, vw = Hkv * dv;
  const A keepScale = A(1) / (A(1) - static_cast<A>(p));
  constexpr int64_t QB = detail::kAttnQB, KB = detail::kAttnKB;
  // Query heads of one group add into the same kv head's dK/dV under that head's lock. When T is
  // the arithmetic type (fp32, fp64) they add straight into dk/dv (zeroed first unless
  // accumulating); 16-bit types sum in dense fp32 buffers [B, Skv, Hkv·hd] and round once at the
  // end. With row strides (AttnRows) only the kw columns of each row of dk/dv are touched.
  const int64_t n = B * Skv * kw, nv = B * Skv * vw, kvRows = B * Skv;
  constexpr bool direct = std::is_same<T, A>::value;
  std::vector<A> dK(direct ? 0 : static_cast<size_t>(n), A(0)), dV(direct ? 0 : static_cast<size_t>(nv), A(0));
  A* dKacc = direct ? reinterpret_cast<A*>(dk) : dK.data();
  A* dVacc = direct ? reinterpret_cast<A*>(dvo) : dV.data();
  const int64_t ldK = direct ? rs.k : kw, ldV = direct ? rs.v : vw;   // row strides of dKacc, dVacc
  if (direct && !accumulate) {
    for (int64_t r = 0; r < kvRows; ++r) {
      std::fill(dKacc + r * ldK, dKacc + r * ldK + kw, A(0));
      std::fill(dVacc + r * ldV, dVacc + r * ldV + vw, A(0));
    }
  }
  std::vector<omp_lock_t> locks(static_cast<size_t>(B * Hkv));
  for (auto& lk : locks) omp_init_lock(&lk);
  // On the team above 65,536 (B·H·S·S_kv·hd), as the estimate prices it (kForkAttentionWork).
  detail::region(ctx.nthreads(), B * H * S * Skv * hd > 65536, [&] {
    std::vector<A> Qv, Qsv, Kv, Vv, Gv, dQv, dKv, dVv, Pv, Pdv, dPv, Lv, Dv, Tv;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      A* Q = detail::scratch(Qv, S * hd);
      A* Qs = detail::scratch(Qsv, S * hd);
      A* K = detail::scratch(Kv, Skv * hd);
      A* V = detail::scratch(Vv, Skv * dv);
      A* G = detail::scratch(Gv, S * dv);
      A* dQ = detail::scratch(dQv, QB * hd);
      A* dKh = detail::scratch(dKv, Skv * hd);
      A* dVh = detail::scratch(dVv, Skv * dv);
      // Materialised mode takes each row's keys in one block (D needs the whole row of P·dP).
      const int64_t KBlk = materialised ? std::max<int64_t>(Skv, 1) : KB;
      A* P = detail::scratch(Pv, QB * KBlk);
      A* dP = detail::scratch(dPv, QB * KBlk);
      A* Pd = detail::scratch(Pdv, QB * KBlk);
      A* Tc = detail::scratch(Tv, capped ? QB * KBlk : 1);   // tanh(score / cap) of the block
      A* L = detail::scratch(Lv, QB);
      A* D = detail::scratch(Dv, QB);
      detail::stage_head(q, b, S, rs.q, h, hd, A(1), Q);
      detail::stage_head(q, b, S, rs.q, h, hd, sc, Qs);
      detail::stage_head(k, b, Skv, rs.k, kvh, hd, A(1), K);
      detail::stage_head(v, b, Skv, rs.v, kvh, dv, A(1), V);
      detail::stage_head(dO, b, S, ow, h, dv, A(1), G);
      std::fill(dKh, dKh + Skv * hd, A(0));
      std::fill(dVh, dVh + Skv * dv, A(0));
      detail::KeepStream keep(seed, stream, p);
      for (int64_t i0 = 0; i0 < S; i0 += QB) {
        const int64_t qb = std::min(QB, S - i0);
        const int64_t jend = detail::visible_keys(causal, i0 + qb - 1, S, Skv);
        const int64_t jbeg = materialised ? 0 : std::min(jend, detail::first_key(sm.window, i0, S, Skv));
        std::fill(dQ, dQ + qb * hd, A(0));
        for (int64_t r = 0; r < qb; ++r) {
          A s = 0;
          if (!materialised) {
            const T* orow = o + (b * S + i0 + r) * ow + h * dv;
            for (int64_t d = 0; d < dv; ++d) s += G[(i0 + r) * dv + d] * load(orow[d]);
          }
          D[r] = s;
          L[r] = (scores == nullptr && lse != nullptr) ? static_cast<A>(lse[(b * H + h) * S + i0 + r]) : A(0);
        }
        if (scores == nullptr && (detail::kExactStatsAttn<T> || lse == nullptr))
          detail::attention_rows_lse(Qs, K, i0, i0 + qb, S, Skv, hd, causal, sm, P, L);
        const int64_t blk = materialised ? std::max<int64_t>(jend, 1) : KB;
        for (int64_t j0 = jbeg; j0 < jend; j0 += blk) {
          const int64_t kb = std::min(blk, jend - j0);
          detail::attention_block_p(Qs, K, i0, qb, j0, kb, S, Skv, hd, causal, sm, L,
                                    scores != nullptr ? scores + (b * H + h) * S * Skv : nullptr, P, Tc);
          // dP' = dO Vᵀ; through the dropout (factor f = keep/(1−p)): dP = dP'·f, Pdrop = P·f.
          detail::gemm(false, true, qb, kb, dv, 1.0f, G + i0 * dv, dv, V + j0 * dv, dv, 0.0f, dP, kb);
          const A* Pdrop = P;
          if (p > 0.0f) {
            for (int64_t r = 0; r < qb; ++r) {
              const uint64_t ebase = static_cast<uint64_t>(((b * H + h) * S + i0 + r) * Skv);
              for (int64_t j = j0; j < j0 + kb; ++j) {
                const A f = keep.keep(ebase + j) ? keepScale : A(0);
                dP[r * kb + (j - j0)] *= f;
                Pd[r * kb + (j - j0)] = P[r * kb + (j - j0)] * f;
              }
            }
            Pdrop = Pd;
          }
          if (materialised) // the block is the whole visible row (P is 0 past each row's keys)
            for (int64_t r = 0; r < qb; ++r) {
              A s = 0;
              for (int64_t j = 0; j < kb; ++j) s += P[r * kb + j] * dP[r * kb + j];
              D[r] = s;
            }
          // dV += Pdropᵀ dO.
          detail::gemm(true, false, kb, dv, qb, 1.0f, Pdrop, kb, G + i0 * dv, dv, 1.0f, dVh + j0 * dv, dv);
          // dS = scale · P (dP − D) (· (1 − t²) through the cap), into dP.
          for (int64_t r = 0; r < qb; ++r)
            for (int64_t j = 0; j < kb; ++j) {
              const A g = sc * softmax_grad(P[r * kb + j], dP[r * kb + j], D[r]);
              dP[r * kb + j] = capped ? g * (A(1) - Tc[r * kb + j] * Tc[r * kb + j]) : g;
            }
          detail::gemm(false, false, qb, hd, kb, 1.0f, dP, kb, K + j0 * hd, hd, 1.0f, dQ, hd);
          detail::gemm(true, false, kb, hd, qb, 1.0f, dP, kb, Q + i0 * hd, hd, 1.0f, dKh + j0 * hd, hd);
        }
        for (int64_t r = 0; r < qb; ++r) {
          T* dqrow = dq + (b * S + i0 + r) * rs.q + h * hd;
          for (int64_t d = 0; d < hd; ++d) detail::put(dqrow[d], dQ[r * hd + d], accumulate);
        }
      }
      omp_lock_t& lk = locks[static_cast<size_t>(b * Hkv + kvh)];
      omp_set_lock(&lk);
      for (int64_t j = 0; j < Skv; ++j) {
        A* gk = dKacc + (b * Skv + j) * ldK + kvh * hd;
        A* gv = dVacc + (b * Skv + j) * ldV + kvh * dv;
        for (int64_t d = 0; d < hd; ++d) gk[d] += dKh[j * hd + d];
        for (int64_t d = 0; d < dv; ++d) gv[d] += dVh[j * dv + d];
      }
      omp_unset_lock(&lk);
    }
  });
  for (auto& lk : locks) omp_destroy_lock(&lk);
  if (direct) return;
  detail::region(ctx.nthreads(), n > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < kvRows; ++r) {
    for (int64_t c = 0; c < kw; ++c) detail::put(dk[r * rs.k + c], dK[r * kw + c], accumulate);
    for (int64_t c = 0; c < vw; ++c) detail::put(dvo[r * rs.v + c], dV[r * vw + c], accumulate);
  }
  });
}

} // namespace rt
