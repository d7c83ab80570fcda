// tally CPU runtime: elementwise and data-movement kernels — broadcast binary ops and their
// reduction (reduce_to), unary ops, dropout, sums over an axis, index data, strided copy, fill,
// and the optimizer step's sum_squares and scale.
#pragma once

#include "rt_ctx.h"

#include <cmath>

namespace rt {

/// out[io] (+)= a[ia] op b[ib] over `shape` (rank <= 8); strides in elements, 0 on broadcast dims;
/// outStrides null = out dense (a gradient written into a view passes the view's strides).
template <class T>
void binary(Ctx& ctx, BinOp op, const T* a, const int64_t* aStrides, const T* b,
            const int64_t* bStrides, T* out, const int64_t* shape, int rank, bool accumulate,
            const int64_t* outStrides = nullptr) {
  detail::KernelScope ks(ctx, "binary");
  const int64_t* st[3] = {outStrides, aStrides, bStrides};
  detail::require(aStrides && bStrides, "binary", "stride vectors must not be null");
  detail::Collapsed c = detail::collapse("binary", shape, rank, 3, st);
  if (c.count == 0) return;
  const int64_t inner = c.shape[c.rank - 1];
  const int64_t rows = c.count / inner;
  const int64_t so = c.st[0][c.rank - 1], sa = c.st[1][c.rank - 1], sb = c.st[2][c.rank - 1];
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (c.count > 4096)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off[3];
    detail::row_offsets(c, 3, r, off);
    T* o = out + off[0];
    const T* pa = a + off[1];
    const T* pb = b + off[2];
    if (so == 1 && sa == 1 && sb == 1) {   // the common dense case: a loop the compiler vectorises
      for (int64_t i = 0; i < inner; ++i) detail::put(o[i], binop(op, load(pa[i]), load(pb[i])), accumulate);
    } else {
      for (int64_t i = 0; i < inner; ++i)
        detail::put(o[i * so], binop(op, load(pa[i * sa]), load(pb[i * sb])), accumulate);
    }
  }
}

/// The gradient of a / b with respect to b: out (+)= −dy · a / b² over `shape` (rank <= 8); a and b
/// strided like binary's operands (0 on broadcast dims), dy and out dense unless their strides
/// are given (null = dense).
template <class T>
void div_bwd(Ctx& ctx, const T* a, const int64_t* aStrides, const T* b, const int64_t* bStrides,
             const T* dy, const int64_t* dyStrides, T* out, const int64_t* outStrides,
             const int64_t* shape, int rank, bool accumulate) {
  detail::KernelScope ks(ctx, "div_bwd");
  detail::require(aStrides && bStrides, "div_bwd", "a and b need stride vectors");
  const int64_t* st[4] = {outStrides, aStrides, bStrides, dyStrides};
  detail::Collapsed c = detail::collapse("div_bwd", shape, rank, 4, st);
  if (c.count == 0) return;
  const int64_t inner = c.shape[c.rank - 1];
  const int64_t rows = c.count / inner;
  const int64_t so = c.st[0][c.rank - 1], sa = c.st[1][c.rank - 1], sb = c.st[2][c.rank - 1],
                sd = c.st[3][c.rank - 1];
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (c.count > 4096)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off[4];
    detail::row_offsets(c, 4, r, off);
    for (int64_t i = 0; i < inner; ++i) {
      const acc_t<T> bv = load(b[off[2] + i * sb]);
      detail::put(out[off[0] + i * so], -load(dy[off[3] + i * sd]) * load(a[off[1] + i * sa]) / (bv * bv),
                  accumulate);
    }
  }
}

/// The gradient of c / x from its output y = c / x: out (+)= −dy · y² / c (n elements, dense).
template <class T>
void div_scalar_bwd(Ctx& ctx, const T* y, const T* dy, float c, T* out, int64_t n, bool accumulate) {
  detail::KernelScope ks(ctx, "div_scalar_bwd");
  detail::require_sizes("div_scalar_bwd", {n});
  const acc_t<T> cv = static_cast<acc_t<T>>(c);
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> yv = load(y[i]);
    detail::put(out[i], -load(dy[i]) * yv * yv / cv, accumulate);
  }
}

/// out (+)= x op s, or s op x when scalarLeft.
template <class T>
void binary_scalar(Ctx& ctx, BinOp op, const T* x, float s, bool scalarLeft, T* out, int64_t n,
                   bool accumulate) {
  detail::KernelScope ks(ctx, "binary_scalar");
  detail::require_sizes("binary_scalar", {n});
  const acc_t<T> sv = static_cast<acc_t<T>>(s);
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) {
    acc_t<T> v = load(x[i]);
    detail::put(out[i], scalarLeft ? binop(op, sv, v) : binop(op, v, sv), accumulate);
  }
}

/// out (+)= scale · Σ x over the dimensions where outStrides is 0; x dense over `shape`.
template <class T>
void reduce_to(Ctx& ctx, const T* x, const int64_t* shape, int rank, T* out,
               const int64_t* outStrides, float scale, bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "reduce_to");
  detail::require(outStrides != nullptr, "reduce_to", "outStrides must not be null");
  const int64_t* st[2] = {nullptr, outStrides};
  detail::Collapsed c = detail::collapse("reduce_to", shape, rank, 2, st);
  // The output's extent: 1 + the largest offset it is written at (strides are >= 0).
  int64_t outSize = 1;
  for (int d = 0; d < rank; ++d) {
    detail::require(outStrides[d] >= 0, "reduce_to", "negative output stride");
    if (shape[d] > 0) outSize += (shape[d] - 1) * outStrides[d];
  }
  std::vector<A> acc(static_cast<size_t>(outSize), A(0));
  if (c.count > 0) {
    const int64_t inner = c.shape[c.rank - 1];
    const int64_t rows = c.count / inner;
    const int64_t sx = c.st[0][c.rank - 1], so = c.st[1][c.rank - 1];
    if (so != 0) {
      // The innermost dimension is kept: threads own disjoint column ranges, so no two threads
      // add into the same output element.
#pragma omp parallel num_threads(ctx.nthreads()) if (c.count > 4096)
      {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t c0 = inner * t / nt, c1 = inner * (t + 1) / nt;
        for (int64_t r = 0; r < rows; ++r) {
          int64_t off[2];
          detail::row_offsets(c, 2, r, off);
          for (int64_t i = c0; i < c1; ++i) acc[off[1] + i * so] += load(x[off[0] + i * sx]);
        }
      }
    } else {
      // The innermost dimension is reduced: row sums in parallel, then added in row order.
      std::vector<A> rowsum(static_cast<size_t>(rows));
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (c.count > 4096)
      for (int64_t r = 0; r < rows; ++r) {
        int64_t off[2];
        detail::row_offsets(c, 2, r, off);
        A s = 0;
        for (int64_t i = 0; i < inner; ++i) s += load(x[off[0] + i * sx]);
        rowsum[r] = s;
      }
      for (int64_t r = 0; r < rows; ++r) {
        int64_t off[2];
        detail::row_offsets(c, 2, r, off);
        acc[off[1]] += rowsum[r];
      }
    }
  }
  // Write every output element (an empty reduced dimension gives 0).
  const A sc = static_cast<A>(scale);
  // Each output offset appears in acc exactly at positions reachable by the kept dimensions;
  // iterate those: the kept dimensions of `shape` with their output strides.
  int64_t kshape[detail::kMaxRank], kst[detail::kMaxRank];
  int kr = 0;
  for (int d = 0; d < rank; ++d)
    if (outStrides[d] != 0 && shape[d] != 1) { kshape[kr] = shape[d]; kst[kr] = outStrides[d]; ++kr; }
  int64_t kcount = 1;
  for (int d = 0; d < kr; ++d) kcount *= kshape[d];
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (kcount > 4096)
  for (int64_t e = 0; e < kcount; ++e) {
    int64_t rem = e, off = 0;
    for (int d = kr - 1; d >= 0; --d) {
      off += (rem % kshape[d]) * kst[d];
      rem /= kshape[d];
    }
    detail::put(out[off], sc * acc[off], accumulate);
  }
}

/// A generated kernel over n elements: f(e) for every e < n, in any order (codegen's fused
/// chains of elementwise ops: each element's ops run in registers, docs/codegen.md).
template <class F> void fused(Ctx& ctx, int64_t n, const F& f) {
  detail::KernelScope ks(ctx, "fused");
  detail::require_sizes("fused", {n});
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t e = 0; e < n; ++e) f(e);
}

/// y = f(x) elementwise.
template <class T> void unary_fwd(Ctx& ctx, UnOp op, const T* x, T* y, int64_t n) {
  detail::KernelScope ks(ctx, "unary_fwd");
  detail::require_sizes("unary_fwd", {n});
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(unary(op, load(x[i])));
}

/// dx (+)= dy · f'(·): from x for Gelu/GeluTanh/Silu, from y for Relu/Tanh/Sigmoid/Exp.
template <class T>
void unary_bwd(Ctx& ctx, UnOp op, const T* x, const T* y, const T* dy, T* dx, int64_t n,
               bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "unary_bwd");
  detail::require_sizes("unary_bwd", {n});
  const bool needX = unary_grad_reads_x(op), needY = !needX && op != UnOp::Neg;
  detail::require(!needX || x != nullptr, "unary_bwd", "this op's backward reads x, which is null");
  detail::require(!needY || y != nullptr, "unary_bwd", "this op's backward reads y, which is null");
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) {
    A xv = needX ? load(x[i]) : A(0), yv = needY ? load(y[i]) : A(0);
    detail::put(dx[i], load(dy[i]) * unary_grad(op, xv, yv), accumulate);
  }
}

namespace detail {
/// Dropout decisions for consecutive elements, one Philox block per four of them.
class KeepStream {
 public:
  KeepStream(uint64_t seed, uint64_t stream, float p) : seed_(seed), stream_(stream), p_(p) {}
  /// keep decision for element e (cheap when called for consecutive e).
  bool keep(uint64_t e) {
    uint64_t q = e >> 2;
    if (!valid_ || q != q_) {
      block_ = philox_block(seed_, stream_, q);
      q_ = q;
      valid_ = true;
    }
    return philox_word_uniform(block_.w[e & 3u]) >= p_;
  }

 private:
  uint64_t seed_, stream_;
  float p_;
  u32x4 block_{};
  uint64_t q_ = 0;
  bool valid_ = false;
};
} // namespace detail

/// y = keep ? x / (1 − p) : 0, keep iff philox_uniform(seed, stream, e) >= p; mask records keep.
template <class T>
void dropout_fwd(Ctx& ctx, const T* x, T* y, uint8_t* mask, int64_t n, float p, uint64_t seed,
                 uint64_t stream) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "dropout_fwd");
  detail::require_sizes("dropout_fwd", {n});
  detail::require(p >= 0.0f && p <= 1.0f, "dropout_fwd", [&] { return "p = " + std::to_string(p) + " is not in [0, 1]"; });
  // One Philox block gives the uniforms of elements 4q .. 4q+3.
  const int64_t nq = (n + 3) / 4;
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t qi = 0; qi < nq; ++qi) {
    const u32x4 blk = philox_block(seed, stream, static_cast<uint64_t>(qi));
    for (int64_t w = 0; w < 4 && 4 * qi + w < n; ++w) {
      const int64_t i = 4 * qi + w;
      const bool k = philox_word_uniform(blk.w[w]) >= p;
      if (mask) mask[i] = k ? 1 : 0;
      y[i] = store<T>(dropout_apply(load(x[i]), k, static_cast<A>(p)));
    }
  }
}

/// dx (+)= keep ? dy / (1 − p) : 0, keep from mask or regenerated from (seed, stream).
template <class T>
void dropout_bwd(Ctx& ctx, const T* dy, const uint8_t* mask, T* dx, int64_t n, float p,
                 uint64_t seed, uint64_t stream, bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "dropout_bwd");
  detail::require_sizes("dropout_bwd", {n});
  detail::require(p >= 0.0f && p <= 1.0f, "dropout_bwd", [&] { return "p = " + std::to_string(p) + " is not in [0, 1]"; });
  const int64_t nq = (n + 3) / 4;
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t qi = 0; qi < nq; ++qi) {
    u32x4 blk{};
    if (!mask) blk = philox_block(seed, stream, static_cast<uint64_t>(qi));
    for (int64_t w = 0; w < 4 && 4 * qi + w < n; ++w) {
      const int64_t i = 4 * qi + w;
      const bool k = mask ? mask[i] != 0 : philox_word_uniform(blk.w[w]) >= p;
      detail::put(dx[i], dropout_apply(load(dy[i]), k, static_cast<A>(p)), accumulate);
    }
  }
}

/// y[o, i] = Σ_a x[o, a, i] (divided by `axis` when mean).
template <class T>
void sum_fwd(Ctx& ctx, const T* x, T* y, int64_t outer, int64_t axis, int64_t inner, bool mean) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "sum_fwd");
  detail::require_sizes("sum_fwd", {outer, axis, inner});
  const A div = mean ? static_cast<A>(axis) : A(1);
  if (inner == 1 && outer < ctx.nthreads()) {
    // Few long reductions (the loss, a full sum): each one parallel.
    for (int64_t o = 0; o < outer; ++o) {
      A s = 0;
      const T* px = x + o * axis;
#pragma omp parallel for num_threads(ctx.nthreads()) reduction(+ : s) if (axis > 4096)
      for (int64_t a = 0; a < axis; ++a) s += load(px[a]);
      y[o] = store<T>(s / div);
    }
    return;
  }
  const int64_t chunk = 256, nch = (inner + chunk - 1) / chunk;
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (outer * axis * inner > 4096)
  for (int64_t task = 0; task < outer * nch; ++task) {
    const int64_t o = task / nch, i0 = (task % nch) * chunk;
    const int64_t i1 = i0 + chunk < inner ? i0 + chunk : inner;
    A acc[256];
    for (int64_t i = i0; i < i1; ++i) acc[i - i0] = 0;
    for (int64_t a = 0; a < axis; ++a) {
      const T* px = x + (o * axis + a) * inner;
      for (int64_t i = i0; i < i1; ++i) acc[i - i0] += load(px[i]);
    }
    for (int64_t i = i0; i < i1; ++i) y[o * inner + i] = store<T>(acc[i - i0] / div);
  }
}

/// dx[o, a, i] (+)= dy[o, i] (divided by `axis` when mean).
template <class T>
void sum_bwd(Ctx& ctx, const T* dy, T* dx, int64_t outer, int64_t axis, int64_t inner, bool mean,
             bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "sum_bwd");
  detail::require_sizes("sum_bwd", {outer, axis, inner});
  const A div = mean ? static_cast<A>(axis) : A(1);
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (outer * axis * inner > 4096)
  for (int64_t r = 0; r < outer * axis; ++r) {
    const int64_t o = r / axis;
    for (int64_t i = 0; i < inner; ++i)
      detail::put(dx[r * inner + i], load(dy[o * inner + i]) / div, accumulate);
  }
}

/// out[i] = i for i < S.
inline void positions(Ctx& ctx, int32_t* out, int64_t S) {
  detail::KernelScope ks(ctx, "positions");
  detail::require(S >= 0 && S <= INT32_MAX, "positions", [&] { return "S = " + std::to_string(S) + " is not in 0..2^31-1"; });
  for (int64_t i = 0; i < S; ++i) out[i] = static_cast<int32_t>(i);
}

/// labels[b, i] = tokens[b, i + 1]; −1 at i = S − 1 (no next token).
inline void next_tokens(Ctx& ctx, const int32_t* tokens, int32_t* labels, int64_t B, int64_t S) {
  detail::KernelScope ks(ctx, "next_tokens");
  detail::require_sizes("next_tokens", {B, S});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i)
      labels[b * S + i] = i + 1 < S ? tokens[b * S + i + 1] : kIgnoreLabel;
}

/// dst (+)= src over `shape` (rank <= 8), converting the storage type; src strided, dst dense or
/// strided when dstStrides is given.
template <class TS, class TD>
void copy(Ctx& ctx, const TS* src, const int64_t* srcStrides, TD* dst, const int64_t* dstStrides,
          const int64_t* shape, int rank, bool accumulate) {
  detail::KernelScope ks(ctx, "copy");
  detail::require(srcStrides != nullptr || rank == 0, "copy", "srcStrides must not be null");
  const int64_t* st[2] = {dstStrides, srcStrides};
  detail::Collapsed c = detail::collapse("copy", shape, rank, 2, st);
  if (c.count == 0) return;
  const int64_t inner = c.shape[c.rank - 1];
  const int64_t rows = c.count / inner;
  const int64_t sd = c.st[0][c.rank - 1], ss = c.st[1][c.rank - 1];
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (c.count > 4096)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off[2];
    detail::row_offsets(c, 2, r, off);
    TD* d = dst + off[0];
    const TS* s = src + off[1];
    for (int64_t i = 0; i < inner; ++i) {
      acc_t<TD> v = static_cast<acc_t<TD>>(load(s[i * ss]));
      detail::put(d[i * sd], v, accumulate);
    }
  }
}

/// x[i] = value for i < n (zero-grad is fill(…, 0)).
template <class T> void fill(Ctx& ctx, T* x, float value, int64_t n) {
  detail::KernelScope ks(ctx, "fill");
  detail::require_sizes("fill", {n});
  const T v = store<T>(static_cast<acc_t<T>>(value));
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

/// *out = Σ g² (summed in double, returned as float); +inf when any g is NaN or infinite
/// (the fp16 loss-scaling overflow check).
template <class T> void sum_squares(Ctx& ctx, const T* g, int64_t n, float* out) {
  detail::KernelScope ks(ctx, "sum_squares");
  detail::require_sizes("sum_squares", {n});
  double s = 0.0;
  int bad = 0;
#pragma omp parallel for num_threads(ctx.nthreads()) reduction(+ : s) reduction(| : bad) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(load(g[i]));
    if (!m_finite(v)) bad = 1;
    s += v * v;
  }
  *out = bad ? m_inf<float>() : static_cast<float>(s);
}

/// x[i] *= s (unscale, clip).
template <class T> void scale(Ctx& ctx, T* x, float s, int64_t n) {
  detail::KernelScope ks(ctx, "scale");
  detail::require_sizes("scale", {n});
  const acc_t<T> sv = static_cast<acc_t<T>>(s);
#pragma omp parallel for num_threads(ctx.nthreads()) schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) x[i] = store<T>(load(x[i]) * sv);
}

} // namespace rt
