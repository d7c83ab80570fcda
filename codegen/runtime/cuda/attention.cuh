// CUDA runtime: attention, forward and backward (API.md), flash-style: causal, sliding window,
// logit soft-cap, grouped-query, online softmax, fp32 arithmetic in shared memory, only o and lse stored. Scalar FMA code (no
// tensor cores): correctness first; its speed on an H100/H200 has not been measured yet.
//
// Forward (grid: query tiles × B·H): a block of `warps` warps owns warps·rowsPerWarp query rows;
// key/value tiles of 32 rows are staged in shared memory; in a tile, lane l scores key l for
// each of the warp's rows, the warp merges the tile into the row's running max and sum, and each
// lane accumulates its ceil(hd/32) output elements.
// Backward, FlashAttention-2's split: D = rowsum(dO ∘ O) first; dQ over query tiles (as the
// forward, recomputing P from lse); dK/dV over key tiles, each lane owning one key and its dK/dV
// rows in shared memory, looping over all query rows of every query head that reads the key's
// kv head (so grouped-query gradients are summed without atomics).
// Materialised mode (scores != null): the forward also writes P = softmax (undropped) to scores,
// and the backward reads P from scores instead of recomputing it.
// With Ctx::attentionTensorCores, bf16/fp16 forwards of head size 64 or 128 run on tensor cores
// instead (attention_tc.cuh), unless they have a window or a soft cap.
// A window (AttnScores) masks keys before i + Skv − S − window + 1 (key tiles wholly before a
// row's window are skipped); a soft cap makes each scaled score c·tanh(s / c), and the backward
// multiplies dS by 1 − tanh². The materialised backward (HAS_P) does not take a soft cap: it
// would need the scores P does not give (attention_bwd refuses it).
#pragma once

#include "rows.cuh"

namespace rt {
namespace cu {

/// Shapes shared by the attention kernels. qRow, kRow, vRow: the row strides of q/dq, k/dk,
/// v/dv in elements (AttnRows resolved: H·hd and Hkv·hd when dense); o, dO, lse, P are dense.
struct AttnShape {
  int64_t B, S, Skv, H, Hkv, hd;
  float scale;
  bool causal;
  float p;
  uint64_t seed, stream;
  int64_t qRow, kRow, vRow;
  int64_t window;   // 0: none (AttnScores)
  float softcap;    // 0: none
};

/// Whether query i sees key j.
__device__ inline bool attnVisible(const AttnShape& a, int64_t i, int64_t j) {
  return j < a.Skv && (!a.causal || j <= i + (a.Skv - a.S)) &&
         (a.window <= 0 || j > i + (a.Skv - a.S) - a.window);
}

/// Whether the 32 keys from kt are all before query i's window.
__device__ inline bool attnTileBeforeWindow(const AttnShape& a, int64_t i, int64_t kt) {
  return a.window > 0 && kt + 31 <= i + (a.Skv - a.S) - a.window;
}

/// The first key tile (of 32) a block of queries from q0 needs: 0, or the one holding the first
/// key of q0's window.
__device__ inline int64_t attnFirstTile(const AttnShape& a, int64_t q0) {
  const int64_t first = q0 + (a.Skv - a.S) + 1 - a.window;
  return a.window > 0 && first > 0 ? first / 32 * 32 : 0;
}

/// The soft-capped score c·tanh(s / c), and t = tanh(s / c) for the backward (0 without a cap).
__device__ inline float attnCap(const AttnShape& a, float s, float& t) {
  if (a.softcap <= 0.f) { t = 0.f; return s; }
  t = m_tanh(s / a.softcap);
  return a.softcap * t;
}

/// The dropout scale of probability (b, h, i, j): 1/(1−p) kept, 0 dropped, 1 without dropout.
__device__ inline float attnDropScale(const AttnShape& a, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (a.p <= 0.f) return 1.f;
  const uint64_t e = static_cast<uint64_t>(((b * a.H + h) * a.S + i) * a.Skv + j);
  return dropout_keep(a.seed, a.stream, e, a.p) ? 1.f / (1.f - a.p) : 0.f;
}

/// Stages rows [r0, r0 + n) of head `head` of a [B, rows, ·] tensor whose rows are `rowStride`
/// elements apart into sh[n][ld] (fp32, zero beyond the end), times `mul`.
template <class T>
__device__ inline void stageRows(float* sh, int ld, const T* src, int64_t b, int64_t rows, int64_t rowStride,
                                 int64_t head, int64_t hd, int64_t r0, int n, float mul) {
  for (int64_t idx = threadIdx.x; idx < int64_t(n) * hd; idx += blockDim.x) {
    const int64_t r = idx / hd, d = idx % hd, row = r0 + r;
    sh[r * ld + d] = row < rows ? load(src[(b * rows + row) * rowStride + head * hd + d]) * mul : 0.f;
  }
}

/// Forward. NC = ceil(hd/32) elements per lane, RPW query rows per warp, 4 warps.
template <class T, int NC, int RPW>
__global__ void __launch_bounds__(128) attnFwdKernel(const T* q, const T* k, const T* v, T* o, float* lse,
                                                     AttnShape a) {
  constexpr int W = 4, R = W * RPW;
  extern __shared__ float smem[];
  const int hd = static_cast<int>(a.hd);
  float* Qs = smem;                     // [R][hd], pre-scaled
  float* Ks = Qs + R * hd;              // [32][hd + 1]
  float* Vs = Ks + 32 * (hd + 1);       // [32][hd]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.y / a.H, h = blockIdx.y % a.H, kh = h / (a.H / a.Hkv);
  const int64_t q0 = int64_t(blockIdx.x) * R;
  stageRows(Qs, hd, q, b, a.S, a.qRow, h, a.hd, q0, R, a.scale);
  float m[RPW], l[RPW], acc[RPW][NC];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    m[r] = -m_inf<float>();
    l[r] = 0.f;
#pragma unroll
    for (int t = 0; t < NC; ++t) acc[r][t] = 0.f;
  }
  const int64_t lastQ = min(q0 + R, a.S) - 1;
  const int64_t kEnd = a.causal ? min(a.Skv, lastQ + (a.Skv - a.S) + 1) : a.Skv;
  for (int64_t kt = attnFirstTile(a, q0); kt < kEnd; kt += 32) {
    __syncthreads();
    stageRows(Ks, hd + 1, k, b, a.Skv, a.kRow, kh, a.hd, kt, 32, 1.f);
    stageRows(Vs, hd, v, b, a.Skv, a.vRow, kh, a.hd, kt, 32, 1.f);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr;
      const int64_t i = q0 + r, j = kt + lane;
      if (i >= a.S) continue;                               // warp-uniform
      if (a.causal && kt > i + (a.Skv - a.S)) continue;     // the whole tile is in the future
      if (attnTileBeforeWindow(a, i, kt)) continue;          // or before the window
      const float* qr = Qs + r * hd;
      const float* kr = Ks + lane * (hd + 1);
      float s = 0.f, t;
      for (int d = 0; d < hd; ++d) s += qr[d] * kr[d];
      s = attnCap(a, s, t);
      const bool vis = attnVisible(a, i, j);
      s = vis ? s : -m_inf<float>();
      const float mNew = fmaxf(m[rr], warpMax(s));
      if (mNew == -m_inf<float>()) continue;
      const float pe = vis ? m_exp(s - mNew) : 0.f;
      const float corr = m_exp(m[rr] - mNew);
      l[rr] = l[rr] * corr + warpSum(pe);
      const float pd = vis ? pe * attnDropScale(a, b, h, i, j) : 0.f;
#pragma unroll
      for (int t = 0; t < NC; ++t) acc[rr][t] *= corr;
      for (int jj = 0; jj < 32; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, pd, jj);
        const float* vr = Vs + jj * hd;
#pragma unroll
        for (int t = 0; t < NC; ++t) {
          const int d = lane + 32 * t;
          if (d < hd) acc[rr][t] += pj * vr[d];
        }
      }
      m[rr] = mNew;
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int64_t i = q0 + warp * RPW + rr;
    if (i >= a.S) continue;
    const float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f;
    T* orow = o + (b * a.S + i) * a.H * a.hd + h * a.hd;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int d = lane + 32 * t;
      if (d < hd) orow[d] = store<T>(acc[rr][t] * inv);
    }
    if (lane == 0) lse[(b * a.H + h) * a.S + i] = l[rr] > 0.f ? m[rr] + m_log(l[rr]) : -m_inf<float>();
  }
}

/// Materialised mode: P[b, h, i, j] = exp(scale·q·k − lse) (0 where masked), one thread each.
template <class T>
__global__ void attnWritePKernel(const T* q, const T* k, const float* lse, T* P, AttnShape a, int64_t n) {
  TALLY_GRID_STRIDE(e, n) {
    const int64_t j = e % a.Skv, i = (e / a.Skv) % a.S, bh = e / (a.Skv * a.S);
    const int64_t b = bh / a.H, h = bh % a.H, kh = h / (a.H / a.Hkv);
    float pv = 0.f;
    if (attnVisible(a, i, j)) {
      const T* qr = q + (b * a.S + i) * a.qRow + h * a.hd;
      const T* kr = k + (b * a.Skv + j) * a.kRow + kh * a.hd;
      float s = 0.f;
      for (int64_t d = 0; d < a.hd; ++d) s += load(qr[d]) * load(kr[d]);
      float t;
      pv = m_exp(attnCap(a, s * a.scale, t) - lse[bh * a.S + i]);
    }
    P[e] = store<T>(pv);
  }
}

/// D[b, h, i] = Σ_d dO · O, one warp per row.
template <class T>
__global__ void attnDotKernel(const T* o, const T* dO, float* D, AttnShape a) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (b·H + h)·S + i
  const int lane = threadIdx.x & 31;
  if (row >= a.B * a.H * a.S) return;
  const int64_t i = row % a.S, bh = row / a.S, b = bh / a.H, h = bh % a.H;
  const int64_t off = (b * a.S + i) * a.H * a.hd + h * a.hd;
  float s = 0.f;
  for (int64_t d = lane; d < a.hd; d += 32) s += load(o[off + d]) * load(dO[off + d]);
  s = warpSum(s);
  if (lane == 0) D[row] = s;
}

/// dQ, over query tiles (same layout as the forward). HAS_P: P read from the scores buffer.
template <class T, int NC, int RPW, bool HAS_P>
__global__ void __launch_bounds__(128) attnDqKernel(const T* q, const T* k, const T* v, const float* lse,
                                                    const T* P, const T* dO, const float* D, T* dq, AttnShape a,
                                                    bool accumulate) {
  constexpr int W = 4, R = W * RPW;
  extern __shared__ float smem[];
  const int hd = static_cast<int>(a.hd);
  float* Qs = smem;                  // [R][hd], pre-scaled
  float* dOs = Qs + R * hd;          // [R][hd]
  float* Ks = dOs + R * hd;          // [32][hd + 1]
  float* Vs = Ks + 32 * (hd + 1);    // [32][hd + 1]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.y / a.H, h = blockIdx.y % a.H, kh = h / (a.H / a.Hkv);
  const int64_t q0 = int64_t(blockIdx.x) * R;
  if (!HAS_P) stageRows(Qs, hd, q, b, a.S, a.qRow, h, a.hd, q0, R, a.scale);
  stageRows(dOs, hd, dO, b, a.S, a.H * a.hd, h, a.hd, q0, R, 1.f);
  float acc[RPW][NC], li[RPW], Di[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int64_t i = q0 + warp * RPW + rr;
    li[rr] = (!HAS_P && i < a.S) ? lse[(b * a.H + h) * a.S + i] : 0.f;  // lse may be null with P
    Di[rr] = i < a.S ? D[(b * a.H + h) * a.S + i] : 0.f;
#pragma unroll
    for (int t = 0; t < NC; ++t) acc[rr][t] = 0.f;
  }
  const int64_t lastQ = min(q0 + R, a.S) - 1;
  const int64_t kEnd = a.causal ? min(a.Skv, lastQ + (a.Skv - a.S) + 1) : a.Skv;
  for (int64_t kt = attnFirstTile(a, q0); kt < kEnd; kt += 32) {
    __syncthreads();
    stageRows(Ks, hd + 1, k, b, a.Skv, a.kRow, kh, a.hd, kt, 32, 1.f);
    stageRows(Vs, hd + 1, v, b, a.Skv, a.vRow, kh, a.hd, kt, 32, 1.f);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr;
      const int64_t i = q0 + r, j = kt + lane;
      if (i >= a.S) continue;
      if (a.causal && kt > i + (a.Skv - a.S)) continue;
      if (attnTileBeforeWindow(a, i, kt)) continue;
      const bool vis = attnVisible(a, i, j);
      float pv = 0.f, t = 0.f;
      if (HAS_P) {
        pv = vis ? load(P[((b * a.H + h) * a.S + i) * a.Skv + j]) : 0.f;
      } else {
        const float* qr = Qs + r * hd;
        const float* kr = Ks + lane * (hd + 1);
        float s = 0.f;
        for (int d = 0; d < hd; ++d) s += qr[d] * kr[d];
        pv = vis ? m_exp(attnCap(a, s, t) - li[rr]) : 0.f;
      }
      const float* dor = dOs + r * hd;
      const float* vr = Vs + lane * (hd + 1);
      float dp = 0.f;
      for (int d = 0; d < hd; ++d) dp += dor[d] * vr[d];
      const float ds = vis ? pv * (dp * attnDropScale(a, b, h, i, j) - Di[rr]) * (1.f - t * t) : 0.f;
      for (int jj = 0; jj < 32; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
        const float* kr = Ks + jj * (hd + 1);
#pragma unroll
        for (int t = 0; t < NC; ++t) {
          const int d = lane + 32 * t;
          if (d < hd) acc[rr][t] += dsj * kr[d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int64_t i = q0 + warp * RPW + rr;
    if (i >= a.S) continue;
    T* row = dq + (b * a.S + i) * a.qRow + h * a.hd;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int d = lane + 32 * t;
      if (d < hd) put(row + d, acc[rr][t] * a.scale, accumulate);
    }
  }
}

/// dK and dV over key tiles: thread = key; the block loops over every query head of the kv head.
template <class T, bool HAS_P>
__global__ void attnDkvKernel(const T* q, const T* k, const T* v, const float* lse, const T* P, const T* dO,
                              const float* D, T* dk, T* dv, AttnShape a, int qTile, bool accumulate) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(a.hd), keys = blockDim.x, ld = hd + 1;
  float* Ks = smem;                 // [keys][hd + 1]
  float* Vs = Ks + keys * ld;
  float* dKs = Vs + keys * ld;
  float* dVs = dKs + keys * ld;
  float* Qs = dVs + keys * ld;      // [qTile][hd], unscaled
  float* dOs = Qs + qTile * hd;     // [qTile][hd]
  float* Ls = dOs + qTile * hd;     // [qTile]
  float* Ds = Ls + qTile;           // [qTile]
  const int64_t b = blockIdx.y / a.Hkv, kh = blockIdx.y % a.Hkv, G = a.H / a.Hkv;
  const int64_t k0 = int64_t(blockIdx.x) * keys, j = k0 + threadIdx.x;
  stageRows(Ks, ld, k, b, a.Skv, a.kRow, kh, a.hd, k0, keys, 1.f);
  stageRows(Vs, ld, v, b, a.Skv, a.vRow, kh, a.hd, k0, keys, 1.f);
  for (int64_t idx = threadIdx.x; idx < int64_t(keys) * ld; idx += blockDim.x) dKs[idx] = dVs[idx] = 0.f;
  float* kr = Ks + threadIdx.x * ld;
  float* vr = Vs + threadIdx.x * ld;
  float* dkr = dKs + threadIdx.x * ld;
  float* dvr = dVs + threadIdx.x * ld;
  // Queries before iStart see none of this block's keys (causal).
  const int64_t iStart = a.causal ? (k0 - (a.Skv - a.S) > 0 ? k0 - (a.Skv - a.S) : int64_t(0)) : 0;
  // Queries from iEnd on have the whole block before their window.
  const int64_t lastKey = k0 + keys - 1, wEnd = lastKey - (a.Skv - a.S) + a.window;
  const int64_t iEnd = a.window > 0 ? (wEnd < a.S ? (wEnd > 0 ? wEnd : int64_t(0)) : a.S) : a.S;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = kh * G + g;
    for (int64_t it = iStart; it < iEnd; it += qTile) {
      __syncthreads();
      stageRows(Qs, hd, q, b, a.S, a.qRow, h, a.hd, it, qTile, 1.f);
      stageRows(dOs, hd, dO, b, a.S, a.H * a.hd, h, a.hd, it, qTile, 1.f);
      for (int r = threadIdx.x; r < qTile; r += blockDim.x) {
        const int64_t i = it + r;
        Ls[r] = (!HAS_P && i < a.S) ? lse[(b * a.H + h) * a.S + i] : 0.f;  // lse may be null with P
        Ds[r] = i < a.S ? D[(b * a.H + h) * a.S + i] : 0.f;
      }
      __syncthreads();
      const int n = static_cast<int>((iEnd - it < qTile ? iEnd - it : int64_t(qTile)));
      for (int r = 0; r < n; ++r) {
        const int64_t i = it + r;
        if (!attnVisible(a, i, j)) continue;
        const float* qr = Qs + r * hd;
        const float* dor = dOs + r * hd;
        float pv, t = 0.f;
        if (HAS_P) {
          pv = load(P[((b * a.H + h) * a.S + i) * a.Skv + j]);
        } else {
          float s = 0.f;
          for (int d = 0; d < hd; ++d) s += qr[d] * kr[d];
          pv = m_exp(attnCap(a, s * a.scale, t) - Ls[r]);
        }
        float dp = 0.f;
        for (int d = 0; d < hd; ++d) dp += dor[d] * vr[d];
        const float z = attnDropScale(a, b, h, i, j);
        const float pz = pv * z, ds = pv * (dp * z - Ds[r]) * (1.f - t * t) * a.scale;
        for (int d = 0; d < hd; ++d) {
          dvr[d] += pz * dor[d];
          dkr[d] += ds * qr[d];
        }
      }
    }
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < int64_t(keys) * hd; idx += blockDim.x) {
    const int64_t r = idx / hd, d = idx % hd, row = k0 + r;
    if (row >= a.Skv) continue;
    const int64_t col = kh * a.hd + d;
    put(dk + (b * a.Skv + row) * a.kRow + col, dKs[r * ld + d], accumulate);
    put(dv + (b * a.Skv + row) * a.vRow + col, dVs[r * ld + d], accumulate);
  }
}

/// Calls f.template operator()<NC, RPW>() for the tile shape of head size hd (NC = 1..8).
template <class F> inline void dispatchChunks(int nc, F&& f) {
  switch (nc) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

/// Checks attention's arguments and resolves the row strides (0 = dense); throws cu::Error.
inline AttnShape attnShape(const char* kernel, const char* where, int64_t B, int64_t S, int64_t Skv, int64_t H,
                           int64_t Hkv, int64_t hd, float scale, bool causal, float p, uint64_t seed,
                           uint64_t stream, AttnRows rows, AttnScores sm) {
  const std::string bad = cuda_plan::checkAttention(B, S, Skv, H, Hkv, hd);
  if (!bad.empty()) fail(kernel, where, bad);
  if (!(p >= 0.f && p < 1.f)) fail(kernel, where, "dropout probability must be in [0, 1)");
  const std::string badRows = cuda_plan::checkAttentionRows(H, Hkv, hd, rows.q, rows.k, rows.v);
  if (!badRows.empty()) fail(kernel, where, badRows);
  if (sm.window < 0 || (sm.window > 0 && !causal)) fail(kernel, where, "a sliding window needs the causal mask and window > 0");
  if (!(sm.softcap >= 0.f && sm.softcap < m_inf<float>())) fail(kernel, where, "softcap must be 0 or a positive number");
  AttnShape a{B, S, Skv, H, Hkv, hd, scale, causal, p, seed, stream,
              rows.q ? rows.q : H * hd, rows.k ? rows.k : Hkv * hd, rows.v ? rows.v : Hkv * hd,
              sm.window, sm.softcap};
  if (!(scale > 0.f)) a.scale = 1.f / m_sqrt(static_cast<float>(hd));  // not given: 1/sqrt(hd)
  return a;
}

}  // namespace cu
}  // namespace rt

#include "attention_tc.cuh"

namespace rt {

template <class T>
void attention_fwd(Ctx& ctx, const T* q, const T* k, const T* v, T* o, float* lse, T* scores, int64_t B, int64_t S,
                   int64_t Skv, int64_t H, int64_t Hkv, int64_t hd, float scale, bool causal, float p, uint64_t seed,
                   uint64_t stream, AttnRows rows = {}, AttnScores sm = {}) {
  const char* kn = "attention_fwd";
  const cu::AttnShape a = cu::attnShape(kn, ctx.where, B, S, Skv, H, Hkv, hd, scale, causal, p, seed, stream, rows, sm);
  const cuda_plan::AttentionTiles t = cuda_plan::attentionTiles(hd);
  if (!lse) {  // allowed in materialised mode: P needs the lse, kept in the workspace meanwhile
    if (!scores) cu::fail(kn, ctx.where, "lse may be null only when scores are materialised");
    lse = static_cast<float*>(cu::scratch(ctx, kn, cuda_plan::attentionScratchBytes(B, H, S)));
  }
  if (!cu::attentionFwdTensorCores(ctx, q, k, v, o, lse, a))
  cu::dispatchChunks(t.chunks, [&](auto nc) {
    constexpr int NC = decltype(nc)::value, RPW = NC <= 4 ? 8 : 4;
    auto* kernel = cu::attnFwdKernel<T, NC, RPW>;
    cu::allowShared(ctx, kn, kernel, t.fwdSharedBytes);
    const dim3 grid(static_cast<unsigned>((S + 4 * RPW - 1) / (4 * RPW)), static_cast<unsigned>(B * H));
    cu::launch(ctx, kn, kernel, grid, 128, static_cast<size_t>(t.fwdSharedBytes), q, k, v, o, lse, a);
  });
  if (scores) {
    const int64_t n = B * H * S * Skv;
    cu::launch(ctx, kn, cu::attnWritePKernel<T>, cu::grid1(n), cu::kThreads, 0, q, k,
               static_cast<const float*>(lse), scores, a, n);
  }
}

template <class T>
void attention_bwd(Ctx& ctx, const T* q, const T* k, const T* v, const T* o, const float* lse, const T* scores,
                   const T* dO, T* dq, T* dk, T* dv, int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv,
                   int64_t hd, float scale, bool causal, float p, uint64_t seed, uint64_t stream, bool accumulate,
                   AttnRows rows = {}, AttnScores sm = {}) {
  const char* kn = "attention_bwd";
  const cu::AttnShape a = cu::attnShape(kn, ctx.where, B, S, Skv, H, Hkv, hd, scale, causal, p, seed, stream, rows, sm);
  if (scores && sm.softcap > 0.f)
    cu::fail(kn, ctx.where, "a soft cap with materialised scores: the backward needs the scores, which P does not give");
  const cuda_plan::AttentionTiles t = cuda_plan::attentionTiles(hd);
  if (!lse && !scores) cu::fail(kn, ctx.where, "lse may be null only when scores are materialised");
  float* D = static_cast<float*>(cu::scratch(ctx, kn, cuda_plan::attentionScratchBytes(B, H, S)));
  const int64_t nrows = B * H * S;
  cu::launch(ctx, kn, cu::attnDotKernel<T>, dim3(static_cast<unsigned>((nrows * 32 + 255) / 256)), 256, 0, o, dO, D, a);
  auto run = [&](auto hasP) {
    constexpr bool HP = decltype(hasP)::value;
    cu::dispatchChunks(t.chunks, [&](auto nc) {
      constexpr int NC = decltype(nc)::value, RPW = NC <= 4 ? 8 : 4;
      auto* kernel = cu::attnDqKernel<T, NC, RPW, HP>;
      cu::allowShared(ctx, kn, kernel, t.dqSharedBytes);
      const dim3 grid(static_cast<unsigned>((S + 4 * RPW - 1) / (4 * RPW)), static_cast<unsigned>(B * H));
      cu::launch(ctx, kn, kernel, grid, 128, static_cast<size_t>(t.dqSharedBytes), q, k, v, lse, scores, dO,
                 static_cast<const float*>(D), dq, a, accumulate);
    });
    auto* kv = cu::attnDkvKernel<T, HP>;
    cu::allowShared(ctx, kn, kv, t.kvSharedBytes);
    const int keys = 32 * t.kvWarps;
    const dim3 grid(static_cast<unsigned>((Skv + keys - 1) / keys), static_cast<unsigned>(B * Hkv));
    cu::launch(ctx, kn, kv, grid, keys, static_cast<size_t>(t.kvSharedBytes), q, k, v, lse, scores, dO,
               static_cast<const float*>(D), dk, dv, a, t.qTile, accumulate);
  };
  if (scores) run(std::true_type{});
  else run(std::false_type{});
}

}  // namespace rt
