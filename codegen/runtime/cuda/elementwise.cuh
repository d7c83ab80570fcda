// CUDA runtime: elementwise, broadcast, copy, index, reduction and optimizer kernels
// (API.md). Arithmetic per element comes from codegen/runtime/common/ (the CPU runtime's too);
// the warp/block reductions here are the device-only helpers.
#pragma once

#include "ctx.cuh"

namespace rt {
namespace cu {

/// Up to 8 dimensions passed by value to a kernel (shapes and strides of the broadcast kernels).
struct Dims8 {
  int64_t d[8];
};

inline Dims8 dims8(const int64_t* v, int rank, int64_t fill = 0) {
  Dims8 r;
  for (int i = 0; i < 8; ++i) r.d[i] = (v && i < rank) ? v[i] : fill;
  return r;
}

/// Element count of a shape, checked: rank 0..8, no negative extent, no int64 overflow.
inline int64_t checkedCount(const char* kernel, const char* where, const int64_t* shape, int rank) {
  if (rank < 0 || rank > 8) fail(kernel, where, "rank " + std::to_string(rank) + " is outside 0..8");
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] < 0) fail(kernel, where, "negative extent in the shape");
    if (shape[i] != 0 && n > INT64_MAX / shape[i]) fail(kernel, where, "element count overflows int64");
    n *= shape[i];
  }
  return n;
}

/// Dense row-major strides of a shape.
inline Dims8 denseStrides(const int64_t* shape, int rank) {
  Dims8 s;
  int64_t acc = 1;
  for (int i = 7; i >= 0; --i) {
    if (i < rank) {
      s.d[i] = acc;
      acc *= shape[i];
    } else {
      s.d[i] = 0;
    }
  }
  return s;
}

inline dim3 grid1(int64_t n) { return dim3(static_cast<unsigned>(cuda_plan::elementwise(n).blocks)); }
constexpr int kThreads = cuda_plan::kElementwiseThreads;

/// Offset of the element with dense index `e` over `shape` under `strides`.
__device__ inline int64_t offsetOf(int64_t e, const Dims8& shape, const Dims8& strides, int rank) {
  int64_t off = 0;
  for (int i = rank - 1; i >= 0; --i) {
    const int64_t ext = shape.d[i];
    const int64_t c = e % ext;
    e /= ext;
    off += c * strides.d[i];
  }
  return off;
}

#define TALLY_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// ---- warp and block reductions (device-only) -------------------------------------------------

__device__ inline float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// Sum over the block (blockDim.x a multiple of 32); every thread gets the result. `sh` holds 32 floats.
__device__ inline float blockSum(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warpSum(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.f;
  v = warpSum(v);
  __syncthreads();  // sh may be reused by the next call
  return v;
}
/// Maximum over the block; every thread gets the result.
__device__ inline float blockMax(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warpMax(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -m_inf<float>();
  v = warpMax(v);
  __syncthreads();
  return v;
}

/// out = v, or out += v (rounded once to the storage type).
template <class T> __device__ inline void put(T* out, float v, bool accumulate) {
  *out = store<T>(accumulate ? load(*out) + v : v);
}

// ---- kernels ---------------------------------------------------------------------------------

template <class T> __global__ void fillKernel(T* x, float v, int64_t n) {
  const T s = store<T>(v);
  TALLY_GRID_STRIDE(i, n) x[i] = s;
}

template <class T> __global__ void scaleKernel(T* x, float s, int64_t n) {
  TALLY_GRID_STRIDE(i, n) x[i] = store<T>(load(x[i]) * s);
}

template <class T>
__global__ void binaryKernel(BinOp op, const T* a, Dims8 as, const T* b, Dims8 bs, T* out, Dims8 os,
                             bool outStrided, Dims8 shape, int rank, int64_t n, bool accumulate) {
  TALLY_GRID_STRIDE(e, n) {
    const float x = load(a[offsetOf(e, shape, as, rank)]);
    const float y = load(b[offsetOf(e, shape, bs, rank)]);
    put(out + (outStrided ? offsetOf(e, shape, os, rank) : e), binop(op, x, y), accumulate);
  }
}

/// out (+)= −dy · a / b² (the gradient of a / b with respect to b); dy and out dense unless strided.
template <class T>
__global__ void divBwdKernel(const T* a, Dims8 as, const T* b, Dims8 bs, const T* dy, Dims8 ds,
                             bool dyStrided, T* out, Dims8 os, bool outStrided, Dims8 shape, int rank,
                             int64_t n, bool accumulate) {
  TALLY_GRID_STRIDE(e, n) {
    const float bv = load(b[offsetOf(e, shape, bs, rank)]);
    const float g = load(dy[dyStrided ? offsetOf(e, shape, ds, rank) : e]);
    put(out + (outStrided ? offsetOf(e, shape, os, rank) : e),
        -g * load(a[offsetOf(e, shape, as, rank)]) / (bv * bv), accumulate);
  }
}

/// out (+)= −dy · y² / c (the gradient of c / x from its output y).
template <class T>
__global__ void divScalarBwdKernel(const T* y, const T* dy, float c, T* out, int64_t n, bool accumulate) {
  TALLY_GRID_STRIDE(i, n) {
    const float yv = load(y[i]);
    put(out + i, -load(dy[i]) * yv * yv / c, accumulate);
  }
}

template <class T>
__global__ void binaryScalarKernel(BinOp op, const T* x, float s, bool left, T* out, int64_t n,
                                   bool accumulate) {
  TALLY_GRID_STRIDE(i, n) {
    const float v = load(x[i]);
    put(out + i, left ? binop(op, s, v) : binop(op, v, s), accumulate);
  }
}

/// One block per output element: the sum over the reduced dimensions (fp32), scaled.
template <class T>
__global__ void reduceToKernel(const T* x, Dims8 keptShape, Dims8 keptX, Dims8 keptOut, int keptRank,
                               Dims8 redShape, Dims8 redX, int redRank, int64_t redCount, T* out,
                               float scale, bool accumulate) {
  __shared__ float sh[32];
  const int64_t o = blockIdx.x;
  const int64_t xBase = offsetOf(o, keptShape, keptX, keptRank);
  const int64_t outOff = offsetOf(o, keptShape, keptOut, keptRank);
  float acc = 0.f;
  for (int64_t r = threadIdx.x; r < redCount; r += blockDim.x)
    acc += load(x[xBase + offsetOf(r, redShape, redX, redRank)]);
  acc = blockSum(acc, sh);
  if (threadIdx.x == 0) put(out + outOff, acc * scale, accumulate);
}

template <class T> __global__ void stridedZeroKernel(T* out, Dims8 shape, Dims8 strides, int rank, int64_t n) {
  TALLY_GRID_STRIDE(e, n) out[offsetOf(e, shape, strides, rank)] = store<T>(0.f);
}

/// A generated kernel (codegen's fused elementwise chains): f(e) for every element.
template <class F> __global__ void fusedKernel(F f, int64_t n) {
  TALLY_GRID_STRIDE(i, n) f(i);
}

template <class T> __global__ void unaryFwdKernel(UnOp op, const T* x, T* y, int64_t n) {
  TALLY_GRID_STRIDE(i, n) y[i] = store<T>(unary(op, load(x[i])));
}

template <class T>
__global__ void unaryBwdKernel(UnOp op, const T* x, const T* y, const T* dy, T* dx, int64_t n,
                               bool accumulate) {
  TALLY_GRID_STRIDE(i, n) {
    const float xv = x ? load(x[i]) : 0.f, yv = y ? load(y[i]) : 0.f;
    put(dx + i, load(dy[i]) * unary_grad(op, xv, yv), accumulate);
  }
}

template <class T>
__global__ void dropoutFwdKernel(const T* x, T* y, uint8_t* mask, int64_t n, float p, uint64_t seed,
                                 uint64_t stream) {
  TALLY_GRID_STRIDE(i, n) {
    const bool keep = dropout_keep(seed, stream, static_cast<uint64_t>(i), p);
    if (mask) mask[i] = keep ? 1 : 0;
    y[i] = store<T>(dropout_apply(load(x[i]), keep, p));
  }
}

template <class T>
__global__ void dropoutBwdKernel(const T* dy, const uint8_t* mask, T* dx, int64_t n, float p,
                                 uint64_t seed, uint64_t stream, bool accumulate) {
  TALLY_GRID_STRIDE(i, n) {
    const bool keep = mask ? mask[i] != 0 : dropout_keep(seed, stream, static_cast<uint64_t>(i), p);
    put(dx + i, dropout_apply(load(dy[i]), keep, p), accumulate);
  }
}

/// One thread per rotated pair (b, s, h, i < hd/2).
template <class T>
__global__ void ropeKernel(const T* x, T* y, const int32_t* positions, int64_t S, int64_t H, int64_t hd,
                           float theta, float sign, int64_t pairs, bool accumulate) {
  const int64_t half = hd / 2;
  TALLY_GRID_STRIDE(e, pairs) {
    const int64_t i = e % half;
    const int64_t row = e / half;  // (b·S + s)·H + h
    const int64_t s = (row / H) % S;
    const float pos = positions ? static_cast<float>(positions[s]) : static_cast<float>(s);
    const float ang = pos * rope_inv_freq<float>(i, hd, theta);
    const float c = m_cos(ang), sn = sign * m_sin(ang);
    const int64_t base = row * hd;
    float y1, y2;
    rope_rotate(load(x[base + i]), load(x[base + i + half]), c, sn, y1, y2);
    put(y + base + i, y1, accumulate);
    put(y + base + i + half, y2, accumulate);
  }
}

/// Σ over `axis` of x [outer, axis, inner]: one block per output when inner = 1, else one thread.
template <class T>
__global__ void sumRowsKernel(const T* x, T* y, int64_t axis, float scale) {
  __shared__ float sh[32];
  const int64_t o = blockIdx.x;
  float acc = 0.f;
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) acc += load(x[o * axis + a]);
  acc = blockSum(acc, sh);
  if (threadIdx.x == 0) y[o] = store<T>(acc * scale);
}
template <class T>
__global__ void sumColsKernel(const T* x, T* y, int64_t outer, int64_t axis, int64_t inner, float scale) {
  TALLY_GRID_STRIDE(e, outer * inner) {
    const int64_t o = e / inner, in = e % inner;
    float acc = 0.f;
    for (int64_t a = 0; a < axis; ++a) acc += load(x[(o * axis + a) * inner + in]);
    y[e] = store<T>(acc * scale);
  }
}
template <class T>
__global__ void sumBwdKernel(const T* dy, T* dx, int64_t axis, int64_t inner, float scale, int64_t n,
                             bool accumulate) {
  TALLY_GRID_STRIDE(e, n) {
    const int64_t o = e / (axis * inner), in = e % inner;
    put(dx + e, load(dy[o * inner + in]) * scale, accumulate);
  }
}

static __global__ void positionsKernel(int32_t* out, int64_t S) {
  TALLY_GRID_STRIDE(i, S) out[i] = static_cast<int32_t>(i);
}
static __global__ void nextTokensKernel(const int32_t* tokens, int32_t* labels, int64_t S, int64_t n) {
  TALLY_GRID_STRIDE(e, n) labels[e] = (e % S == S - 1) ? kIgnoreLabel : tokens[e + 1];
}

template <class TS, class TD>
__global__ void copyKernel(const TS* src, Dims8 ss, TD* dst, Dims8 ds, Dims8 shape, int rank, int64_t n,
                           bool accumulate) {
  TALLY_GRID_STRIDE(e, n) {
    const float v = static_cast<float>(load(src[offsetOf(e, shape, ss, rank)]));
    put(dst + offsetOf(e, shape, ds, rank), v, accumulate);
  }
}

/// Per-block partial Σ g² (fp32) into part[blockIdx.x]; non-finite values make the partial inf.
template <class T> __global__ void sumSquaresPartKernel(const T* g, int64_t n, float* part) {
  __shared__ float sh[32];
  float acc = 0.f;
  int bad = 0;
  TALLY_GRID_STRIDE(i, n) {
    const float v = load(g[i]);
    if (!m_finite(v)) bad = 1;
    acc += v * v;
  }
  acc = blockSum(acc, sh);
  const int anyBad = __syncthreads_or(bad);
  if (threadIdx.x == 0) part[blockIdx.x] = anyBad ? m_inf<float>() : acc;
}
static __global__ void sumPartsKernel(const float* part, int parts, float* out) {
  __shared__ float sh[32];
  float acc = 0.f;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += part[i];
  acc = blockSum(acc, sh);
  if (threadIdx.x == 0) *out = m_finite(acc) ? acc : m_inf<float>();
}

// Optimizers: p fp32, g storage T scaled by gscale, pm the refreshed model copy (may be null).
template <class T>
__global__ void sgdKernel(float* p, T* pm, const T* g, float* mom, int64_t n, float lr, float mu,
                          float wd, float gscale) {
  TALLY_GRID_STRIDE(i, n) {
    float pv = p[i];
    sgd_element(pv, load(g[i]) * gscale, mom ? mom + i : nullptr, lr, mu, wd);
    p[i] = pv;
    if (pm) pm[i] = store<T>(pv);
  }
}
template <class T>
__global__ void adagradKernel(float* p, T* pm, const T* g, float* sum, int64_t n, float lr, float eps,
                              float wd, float gscale) {
  TALLY_GRID_STRIDE(i, n) {
    float pv = p[i];
    adagrad_element(pv, load(g[i]) * gscale, sum[i], lr, eps, wd);
    p[i] = pv;
    if (pm) pm[i] = store<T>(pv);
  }
}
template <class T>
__global__ void rmspropKernel(float* p, T* pm, const T* g, float* sq, float* buf, int64_t n, float lr,
                              float alpha, float eps, float wd, float mu, float gscale) {
  TALLY_GRID_STRIDE(i, n) {
    float pv = p[i];
    rmsprop_element(pv, load(g[i]) * gscale, sq[i], buf ? buf + i : nullptr, lr, alpha, eps, wd, mu);
    p[i] = pv;
    if (pm) pm[i] = store<T>(pv);
  }
}
template <class T>
__global__ void adamKernel(float* p, T* pm, const T* g, float* m, float* v, int64_t n, float lr, float b1,
                           float b2, float eps, float wd, bool decoupled, AdamScalars s, float gscale) {
  TALLY_GRID_STRIDE(i, n) {
    float pv = p[i];
    adam_element(pv, load(g[i]) * gscale, m[i], v[i], lr, b1, b2, eps, wd, decoupled, s);
    p[i] = pv;
    if (pm) pm[i] = store<T>(pv);
  }
}
template <class T>
__global__ void lionKernel(float* p, T* pm, const T* g, float* m, int64_t n, float lr, float b1, float b2,
                           float wd, float gscale) {
  TALLY_GRID_STRIDE(i, n) {
    float pv = p[i];
    lion_element(pv, load(g[i]) * gscale, m[i], lr, b1, b2, wd);
    p[i] = pv;
    if (pm) pm[i] = store<T>(pv);
  }
}

}  // namespace cu

// ---- the API (API.md) ------------------------------------------------------------------------

template <class T> void fill(Ctx& ctx, T* x, float value, int64_t n) {
  cu::launch(ctx, "fill", cu::fillKernel<T>, cu::grid1(n), cu::kThreads, 0, x, value, n);
}

template <class T> void scale(Ctx& ctx, T* x, float s, int64_t n) {
  cu::launch(ctx, "scale", cu::scaleKernel<T>, cu::grid1(n), cu::kThreads, 0, x, s, n);
}

template <class T>
void binary(Ctx& ctx, BinOp op, const T* a, const int64_t* aStrides, const T* b, const int64_t* bStrides,
            T* out, const int64_t* shape, int rank, bool accumulate, const int64_t* outStrides = nullptr) {
  const int64_t n = cu::checkedCount("binary", ctx.where, shape, rank);
  cu::launch(ctx, "binary", cu::binaryKernel<T>, cu::grid1(n), cu::kThreads, 0, op, a,
             cu::dims8(aStrides, rank), b, cu::dims8(bStrides, rank), out,
             outStrides ? cu::dims8(outStrides, rank) : cu::Dims8{}, outStrides != nullptr,
             cu::dims8(shape, rank, 1), rank, n, accumulate);
}

template <class T>
void div_bwd(Ctx& ctx, const T* a, const int64_t* aStrides, const T* b, const int64_t* bStrides, const T* dy,
             const int64_t* dyStrides, T* out, const int64_t* outStrides, const int64_t* shape, int rank,
             bool accumulate) {
  const int64_t n = cu::checkedCount("div_bwd", ctx.where, shape, rank);
  cu::launch(ctx, "div_bwd", cu::divBwdKernel<T>, cu::grid1(n), cu::kThreads, 0, a, cu::dims8(aStrides, rank), b,
             cu::dims8(bStrides, rank), dy, dyStrides ? cu::dims8(dyStrides, rank) : cu::Dims8{},
             dyStrides != nullptr, out, outStrides ? cu::dims8(outStrides, rank) : cu::Dims8{},
             outStrides != nullptr, cu::dims8(shape, rank, 1), rank, n, accumulate);
}

template <class T>
void div_scalar_bwd(Ctx& ctx, const T* y, const T* dy, float c, T* out, int64_t n, bool accumulate) {
  cu::launch(ctx, "div_scalar_bwd", cu::divScalarBwdKernel<T>, cu::grid1(n), cu::kThreads, 0, y, dy, c, out, n,
             accumulate);
}

template <class T>
void binary_scalar(Ctx& ctx, BinOp op, const T* x, float s, bool scalarLeft, T* out, int64_t n,
                   bool accumulate) {
  cu::launch(ctx, "binary_scalar", cu::binaryScalarKernel<T>, cu::grid1(n), cu::kThreads, 0, op, x, s,
             scalarLeft, out, n, accumulate);
}

template <class T>
void reduce_to(Ctx& ctx, const T* x, const int64_t* shape, int rank, T* out, const int64_t* outStrides,
               float scale, bool accumulate) {
  const char* k = "reduce_to";
  cu::checkedCount(k, ctx.where, shape, rank);
  const cu::Dims8 xs = cu::denseStrides(shape, rank);
  cu::Dims8 ks{}, kx{}, ko{}, rs{}, rx{};
  int kr = 0, rr = 0;
  int64_t outs = 1, red = 1;
  for (int i = 0; i < rank; ++i) {
    if (outStrides[i] != 0) {
      ks.d[kr] = shape[i]; kx.d[kr] = xs.d[i]; ko.d[kr] = outStrides[i]; ++kr;
      outs *= shape[i];
    } else {
      rs.d[rr] = shape[i]; rx.d[rr] = xs.d[i]; ++rr;
      red *= shape[i];
    }
  }
  if (outs > INT32_MAX) cu::fail(k, ctx.where, "more than 2^31 outputs");
  if (red == 0) {  // an empty sum: out = 0, or unchanged when accumulating
    if (!accumulate)
      cu::launch(ctx, k, cu::stridedZeroKernel<T>, cu::grid1(outs), cu::kThreads, 0, out, ks, ko, kr, outs);
    return;
  }
  cu::launch(ctx, k, cu::reduceToKernel<T>, dim3(static_cast<unsigned>(outs)), 256, 0, x, ks, kx, ko, kr, rs,
             rx, rr, red, out, scale, accumulate);
}

/// f(e) for every e < n, f a __host__ __device__ functor of the generated step (its fused
/// chains of elementwise ops).
template <class F> void fused(Ctx& ctx, int64_t n, const F& f) {
  cu::launch(ctx, "fused", cu::fusedKernel<F>, cu::grid1(n), cu::kThreads, 0, f, n);
}

template <class T> void unary_fwd(Ctx& ctx, UnOp op, const T* x, T* y, int64_t n) {
  cu::launch(ctx, "unary_fwd", cu::unaryFwdKernel<T>, cu::grid1(n), cu::kThreads, 0, op, x, y, n);
}

template <class T>
void unary_bwd(Ctx& ctx, UnOp op, const T* x, const T* y, const T* dy, T* dx, int64_t n, bool accumulate) {
  if (op != UnOp::Neg && (unary_grad_reads_x(op) ? x == nullptr : y == nullptr))
    cu::fail("unary_bwd", ctx.where, unary_grad_reads_x(op) ? "this op's gradient needs x" : "this op's gradient needs y");
  cu::launch(ctx, "unary_bwd", cu::unaryBwdKernel<T>, cu::grid1(n), cu::kThreads, 0, op, x, y, dy, dx, n,
             accumulate);
}

template <class T>
void dropout_fwd(Ctx& ctx, const T* x, T* y, uint8_t* mask, int64_t n, float p, uint64_t seed,
                 uint64_t stream) {
  cu::launch(ctx, "dropout_fwd", cu::dropoutFwdKernel<T>, cu::grid1(n), cu::kThreads, 0, x, y, mask, n, p,
             seed, stream);
}

template <class T>
void dropout_bwd(Ctx& ctx, const T* dy, const uint8_t* mask, T* dx, int64_t n, float p, uint64_t seed,
                 uint64_t stream, bool accumulate) {
  cu::launch(ctx, "dropout_bwd", cu::dropoutBwdKernel<T>, cu::grid1(n), cu::kThreads, 0, dy, mask, dx, n,
             p, seed, stream, accumulate);
}

template <class T>
void rope_fwd(Ctx& ctx, const T* x, T* y, const int32_t* positions, int64_t B, int64_t S, int64_t H,
              int64_t hd, float theta) {
  if (hd % 2 != 0) cu::fail("rope_fwd", ctx.where, "head size " + std::to_string(hd) + " is odd");
  if (!(theta > 0.f)) cu::fail("rope_fwd", ctx.where, "theta must be positive");
  const int64_t pairs = B * S * H * (hd / 2);
  cu::launch(ctx, "rope_fwd", cu::ropeKernel<T>, cu::grid1(pairs), cu::kThreads, 0, x, y, positions, S, H,
             hd, theta, 1.f, pairs, false);
}

template <class T>
void rope_bwd(Ctx& ctx, const T* dy, T* dx, const int32_t* positions, int64_t B, int64_t S, int64_t H,
              int64_t hd, float theta, bool accumulate) {
  if (hd % 2 != 0) cu::fail("rope_bwd", ctx.where, "head size " + std::to_string(hd) + " is odd");
  if (!(theta > 0.f)) cu::fail("rope_bwd", ctx.where, "theta must be positive");
  const int64_t pairs = B * S * H * (hd / 2);
  cu::launch(ctx, "rope_bwd", cu::ropeKernel<T>, cu::grid1(pairs), cu::kThreads, 0, dy, dx, positions, S,
             H, hd, theta, -1.f, pairs, accumulate);
}

template <class T>
void sum_fwd(Ctx& ctx, const T* x, T* y, int64_t outer, int64_t axis, int64_t inner, bool mean) {
  const float s = mean ? (axis > 0 ? 1.f / static_cast<float>(axis) : NAN) : 1.f;
  if (inner == 1) {
    if (outer > INT32_MAX) cu::fail("sum_fwd", ctx.where, "more than 2^31 rows");
    cu::launch(ctx, "sum_fwd", cu::sumRowsKernel<T>, dim3(static_cast<unsigned>(outer)), 256, 0, x, y, axis, s);
  } else {
    cu::launch(ctx, "sum_fwd", cu::sumColsKernel<T>, cu::grid1(outer * inner), cu::kThreads, 0, x, y, outer,
               axis, inner, s);
  }
}

template <class T>
void sum_bwd(Ctx& ctx, const T* dy, T* dx, int64_t outer, int64_t axis, int64_t inner, bool mean,
             bool accumulate) {
  const float s = mean ? (axis > 0 ? 1.f / static_cast<float>(axis) : NAN) : 1.f;
  const int64_t n = outer * axis * inner;
  cu::launch(ctx, "sum_bwd", cu::sumBwdKernel<T>, cu::grid1(n), cu::kThreads, 0, dy, dx, axis, inner, s, n,
             accumulate);
}

inline void positions(Ctx& ctx, int32_t* out, int64_t S) {
  cu::launch(ctx, "positions", cu::positionsKernel, cu::grid1(S), cu::kThreads, 0, out, S);
}

inline void next_tokens(Ctx& ctx, const int32_t* tokens, int32_t* labels, int64_t B, int64_t S) {
  cu::launch(ctx, "next_tokens", cu::nextTokensKernel, cu::grid1(B * S), cu::kThreads, 0, tokens, labels, S,
             B * S);
}

template <class TS, class TD>
void copy(Ctx& ctx, const TS* src, const int64_t* srcStrides, TD* dst, const int64_t* dstStrides,
          const int64_t* shape, int rank, bool accumulate) {
  const int64_t n = cu::checkedCount("copy", ctx.where, shape, rank);
  if (!srcStrides) cu::fail("copy", ctx.where, "srcStrides must not be null");
  const cu::Dims8 dense = cu::denseStrides(shape, rank);
  cu::launch(ctx, "copy", cu::copyKernel<TS, TD>, cu::grid1(n), cu::kThreads, 0, src,
             cu::dims8(srcStrides, rank), dst,
             dstStrides ? cu::dims8(dstStrides, rank) : dense, cu::dims8(shape, rank, 1), rank, n, accumulate);
}

template <class T> void sum_squares(Ctx& ctx, const T* g, int64_t n, float* out) {
  const int parts = static_cast<int>(std::min<int64_t>(std::max<int64_t>(cuda_plan::elementwise(n).blocks, 1), 1024));
  float* part = static_cast<float*>(cu::scratch(ctx, "sum_squares", parts * 4));
  cu::launch(ctx, "sum_squares", cu::sumSquaresPartKernel<T>, dim3(parts), cu::kThreads, 0, g, n, part);
  cu::launch(ctx, "sum_squares", cu::sumPartsKernel, dim3(1), 1024, 0, part, parts, out);
}

template <class T>
void sgd_update(Ctx& ctx, float* p, T* pm, const T* g, float* momentum, int64_t n, float lr, float mu,
                float wd, float gscale) {
  cu::launch(ctx, "sgd_update", cu::sgdKernel<T>, cu::grid1(n), cu::kThreads, 0, p, pm, g, momentum, n, lr,
             mu, wd, gscale);
}
template <class T>
void adagrad_update(Ctx& ctx, float* p, T* pm, const T* g, float* sum, int64_t n, float lr, float eps,
                    float wd, float gscale) {
  cu::launch(ctx, "adagrad_update", cu::adagradKernel<T>, cu::grid1(n), cu::kThreads, 0, p, pm, g, sum, n,
             lr, eps, wd, gscale);
}
template <class T>
void rmsprop_update(Ctx& ctx, float* p, T* pm, const T* g, float* sq, float* buf, int64_t n, float lr,
                    float alpha, float eps, float wd, float mu, float gscale) {
  cu::launch(ctx, "rmsprop_update", cu::rmspropKernel<T>, cu::grid1(n), cu::kThreads, 0, p, pm, g, sq, buf,
             n, lr, alpha, eps, wd, mu, gscale);
}
template <class T>
void adam_update(Ctx& ctx, float* p, T* pm, const T* g, float* m, float* v, int64_t n, float lr, float b1,
                 float b2, float eps, float wd, bool decoupled, int64_t step, float gscale) {
  if (step < 1) cu::fail("adam_update", ctx.where, "step is 1-based, got " + std::to_string(step));
  cu::launch(ctx, "adam_update", cu::adamKernel<T>, cu::grid1(n), cu::kThreads, 0, p, pm, g, m, v, n, lr, b1,
             b2, eps, wd, decoupled, adam_scalars(lr, b1, b2, step), gscale);
}
template <class T>
void lion_update(Ctx& ctx, float* p, T* pm, const T* g, float* m, int64_t n, float lr, float b1, float b2,
                 float wd, float gscale) {
  cu::launch(ctx, "lion_update", cu::lionKernel<T>, cu::grid1(n), cu::kThreads, 0, p, pm, g, m, n, lr, b1,
             b2, wd, gscale);
}

}  // namespace rt
