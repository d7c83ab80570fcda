// CUDA runtime: attention forward on tensor cores (WMMA 16×16×16, bf16/fp16 inputs, fp32
// accumulation) for head sizes 64 and 128. Opt-in (Ctx::attentionTensorCores) until
// tests/step/cuda_check has compared it with the CPU on a GPU; the backward stays scalar.
//
// A block of 4 warps owns 64 query rows (16 per warp); key/value tiles of 64 rows are staged in
// shared memory as 16-bit values. Per tile each warp computes S = Q·Kᵀ (16×64) with WMMA into
// shared memory, two lanes per row apply scale, mask and the online-softmax update (fp32),
// write P (dropout applied) as 16-bit values, rescale the warp's fp32 output rows, and add P·V
// with WMMA. Only o and lse are written, as the scalar kernel does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

// Included by attention.cuh after AttnShape and its helpers (not on its own).

namespace rt {
namespace cu {

template <class T> struct WmmaType;
template <> struct WmmaType<bf16> { using type = __nv_bfloat16; };
template <> struct WmmaType<f16> { using type = __half; };

template <class T, int HD>
__global__ void __launch_bounds__(128) attnFwdTcKernel(const T* q, const T* k, const T* v, T* o, float* lse,
                                                       AttnShape a) {
  using namespace nvcuda;
  using H = typename WmmaType<T>::type;
  constexpr int BR = 64, BC = 64, LDH = HD + 8, LDS = BC + 4, LDP = BC + 8, LDO = HD + 4;
  extern __shared__ __align__(128) unsigned char tcSmem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(tcSmem);   // [BR][LDH] 16-bit bits
  uint16_t* Ks = Qs + BR * LDH;                          // [BC][LDH]
  uint16_t* Vs = Ks + BC * LDH;                          // [BC][LDH]
  float* Ss = reinterpret_cast<float*>(Vs + BC * LDH);   // [4][16][LDS]
  uint16_t* Ps = reinterpret_cast<uint16_t*>(Ss + 4 * 16 * LDS);  // [4][16][LDP]
  float* Os = reinterpret_cast<float*>(Ps + 4 * 16 * LDP);        // [4][16][LDO]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.y / a.H, h = blockIdx.y % a.H, kh = h / (a.H / a.Hkv);
  const int64_t q0 = int64_t(blockIdx.x) * BR, off = a.Skv - a.S;
  const int64_t ldq = a.qRow, ldk = a.kRow, ldv = a.vRow, ldo = a.H * HD;  // o is dense
  const uint16_t* q16 = reinterpret_cast<const uint16_t*>(q);
  const uint16_t* k16 = reinterpret_cast<const uint16_t*>(k);
  const uint16_t* v16 = reinterpret_cast<const uint16_t*>(v);
  for (int idx = threadIdx.x; idx < BR * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int64_t i = q0 + r;
    Qs[r * LDH + d] = i < a.S ? q16[(b * a.S + i) * ldq + h * HD + d] : uint16_t(0);
  }
  float* Sw = Ss + warp * 16 * LDS;
  uint16_t* Pw = Ps + warp * 16 * LDP;
  float* Ow = Os + warp * 16 * LDO;
  for (int idx = lane; idx < 16 * LDO; idx += 32) Ow[idx] = 0.f;
  const int rr = lane >> 1, half = lane & 1;  // two lanes per row, 32 columns each
  const int64_t w0 = q0 + warp * 16, i = w0 + rr;
  float m = -m_inf<float>(), l = 0.f;
  const int64_t lastQ = min(q0 + BR, a.S) - 1;
  const int64_t kEnd = a.causal ? min(a.Skv, lastQ + off + 1) : a.Skv;
  for (int64_t kt = 0; kt < kEnd; kt += BC) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < BC * HD; idx += blockDim.x) {
      const int r = idx / HD, d = idx % HD;
      const int64_t j = kt + r;
      const bool in = j < a.Skv;
      Ks[r * LDH + d] = in ? k16[(b * a.Skv + j) * ldk + kh * HD + d] : uint16_t(0);
      Vs[r * LDH + d] = in ? v16[(b * a.Skv + j) * ldv + kh * HD + d] : uint16_t(0);
    }
    __syncthreads();
    if (w0 >= a.S) continue;                                         // the warp has no rows
    if (a.causal && kt > min(w0 + 15, a.S - 1) + off) continue;      // the tile is in its future
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc[BC / 16];
#pragma unroll
    for (int n = 0; n < BC / 16; ++n) wmma::fill_fragment(sacc[n], 0.f);
#pragma unroll
    for (int kk = 0; kk < HD; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, reinterpret_cast<const H*>(Qs + (warp * 16) * LDH + kk), LDH);
#pragma unroll
      for (int n = 0; n < BC / 16; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, reinterpret_cast<const H*>(Ks + (n * 16) * LDH + kk), LDH);
        wmma::mma_sync(sacc[n], fa, fb, sacc[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < BC / 16; ++n) wmma::store_matrix_sync(Sw + n * 16, sacc[n], LDS, wmma::mem_row_major);
    __syncwarp();
    // Online softmax for row rr, columns half·32 … half·32 + 31.
    float sv[32];
    float mx = -m_inf<float>();
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      const bool vis = i < a.S && attnVisible(a, i, kt + col);
      sv[c] = vis ? Sw[rr * LDS + col] * a.scale : -m_inf<float>();
      mx = fmaxf(mx, sv[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mNew = fmaxf(m, mx);
    float corr = 1.f, rowSum = 0.f;
    if (mNew == -m_inf<float>()) {
#pragma unroll
      for (int c = 0; c < 32; ++c) Pw[rr * LDP + half * 32 + c] = 0;
    } else {
      corr = m_exp(m - mNew);
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const int col = half * 32 + c;
        const float p = sv[c] == -m_inf<float>() ? 0.f : m_exp(sv[c] - mNew);
        rowSum += p;
        const float pd = p == 0.f ? 0.f : p * attnDropScale(a, b, h, i, kt + col);
        Pw[rr * LDP + col] = store<T>(pd).bits;
      }
      m = mNew;
    }
    rowSum += __shfl_xor_sync(0xffffffffu, rowSum, 1);
    l = l * corr + rowSum;
    for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); ++d) Ow[rr * LDO + d] *= corr;
    __syncwarp();
#pragma unroll
    for (int dn = 0; dn < HD; dn += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc;
      wmma::load_matrix_sync(oacc, Ow + dn, LDO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < BC; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, reinterpret_cast<const H*>(Pw + kk), LDP);
        wmma::load_matrix_sync(vb, reinterpret_cast<const H*>(Vs + kk * LDH + dn), LDH);
        wmma::mma_sync(oacc, pa, vb, oacc);
      }
      wmma::store_matrix_sync(Ow + dn, oacc, LDO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
  if (i < a.S) {
    const float inv = l > 0.f ? 1.f / l : 0.f;
    T* orow = o + (b * a.S + i) * ldo + h * HD;
    for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); ++d) orow[d] = store<T>(Ow[rr * LDO + d] * inv);
    if (half == 0) lse[(b * a.H + h) * a.S + i] = l > 0.f ? m + m_log(l) : -m_inf<float>();
  }
}

/// Runs the tensor-core forward when it applies (16-bit storage, head size 64 or 128, opted in);
/// returns false to let the caller run the scalar kernel.
template <class T>
inline bool attentionFwdTensorCores(Ctx& ctx, const T* q, const T* k, const T* v, T* o, float* lse, const AttnShape& a) {
  if constexpr (std::is_same<T, float>::value) {
    return false;
  } else {
    // A sliding window or a soft cap runs on the scalar kernel (attention.cuh).
    if (!ctx.attentionTensorCores || (a.hd != 64 && a.hd != 128) || a.window > 0 || a.softcap > 0.f) return false;
    const char* kn = "attention_fwd";
    const int64_t smem = cuda_plan::attentionTcShared(a.hd);
    const dim3 grid(static_cast<unsigned>((a.S + 63) / 64), static_cast<unsigned>(a.B * a.H));
    if (a.hd == 64) {
      allowShared(ctx, kn, attnFwdTcKernel<T, 64>, smem);
      launch(ctx, kn, attnFwdTcKernel<T, 64>, grid, 128, static_cast<size_t>(smem), q, k, v, o, lse, a);
    } else {
      allowShared(ctx, kn, attnFwdTcKernel<T, 128>, smem);
      launch(ctx, kn, attnFwdTcKernel<T, 128>, grid, 128, static_cast<size_t>(smem), q, k, v, o, lse, a);
    }
    return true;
  }
}

}  // namespace cu
}  // namespace rt
