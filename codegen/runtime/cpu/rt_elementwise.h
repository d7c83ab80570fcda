// tally CPU runtime: elementwise and data-movement kernels — vectorisable fp32 math (rt::vm),
// broadcast binary ops and their reduction (reduce_to), unary ops, dropout, sums over an axis,
// index data, strided copy, fill, and the optimizer step's sum_squares and scale.
#pragma once

#include "rt_ctx.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace rt {

// ---- Elementwise math the compiler vectorises (issue 46) ----------------------------------------
// exp, erf, sigmoid and the unary ops with their derivatives, written without branches or libm
// calls in fp32 (GCC does not vectorise expf/erff without -ffast-math), one function per op so a
// kernel's loop holds one op. fp64 keeps libm: the finite-difference references run in double.
namespace vm {

/// 2^n as a float for n in [-126, 127] (exponent bits only).
inline float pow2i(int32_t n) {
  const int32_t bits = (n + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// e^x in fp32, branch-free: n = round(x·log2 e), r = x − n·ln 2 (ln 2 in two parts, Cody–Waite),
/// e^r by Cephes expf's degree-5 minimax polynomial (S. L. Moshier, Cephes Math Library, expf.c),
/// then · 2^n as two factors 2^⌊n/2⌋ · 2^(n−⌊n/2⌋) so results that overflow give +inf and results
/// in the subnormal range round gradually. x > 88.8 gives +inf, x < −104 gives 0, NaN stays NaN.
/// Relative error within 2.5e-7 of exp in double over [−87, 88.7] (step_values' [math] case).
inline float exp(float x) {
  const float xc = x > 88.8f ? 88.8f : (x < -104.0f ? -104.0f : x);
  const float n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = xc - n * 0.693359375f;   // ln 2's high part: exact in n · it for |n| < 2^12
  r = r - n * -2.12194440e-4f;       // its low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const float y = p * pow2i(n1) * pow2i(ni - n1);
  return x != x ? x : y;
}

/// erf in fp32 given e2 = e^(−x²) (gelu's derivative has it already), branch-free: rt::m_erf's two
/// fits (|x| < 1: x·P(x²); 1 <= |x| < 4: 1 − e2·R(1/|x|); |x| >= 4: ±1), both evaluated and one
/// selected.
inline float erf_given(float x, float e2) {
  const float ax = __builtin_fabsf(x);
  const float small = x * erf_small_fit(x * x);
  const float a = ax < 1.0f ? 1.0f : (ax < 4.0f ? ax : 4.0f);
  const float u = 1.0f / a;
  const float e = 1.0f - e2 * erf_large_fit(u);
  const float mid = ax < 4.0f ? e : 1.0f;
  const float big = x < 0.0f ? -mid : mid;
  return ax < 1.0f ? small : (x != x ? x : big);
}

/// erf in fp32 with vm::exp: error within 2.5e-7 of erf in double (measured 1.4e-7;
/// step_values' [math] case).
inline float erf(float x) { return erf_given(x, vm::exp(-x * x)); }

/// sigmoid(x) in fp32 without overflow: e = e^−|x|, 1/(1 + e) for x >= 0, e/(1 + e) below.
inline float sigmoid(float x) {
  const float e = vm::exp(-__builtin_fabsf(x));
  const float d = 1.0f / (1.0f + e);
  return x >= 0.0f ? d : e * d;
}

/// tanh where only its absolute error matters: 1 − 2/(e^(2x) + 1) (as rt::m_tanh_abs).
inline float tanh_abs(float x) { return 1.0f - 2.0f / (vm::exp(2.0f * x) + 1.0f); }

// The ops in fp32 (A = float) with vm's functions, and in fp64 with rt's (libm): the formulas of
// tally_math.h, one function per op and direction.
template <class A> inline A exp_(A x) { return m_exp(x); }
template <> inline float exp_(float x) { return vm::exp(x); }
template <class A> inline A sigmoid_(A x) { return rt::sigmoid(x); }
template <> inline float sigmoid_(float x) { return vm::sigmoid(x); }

template <class A> inline A gelu_erf(A x) { return rt::gelu_erf(x); }
template <> inline float gelu_erf(float x) { return 0.5f * x * (1.0f + vm::erf(x * 0.70710678118654752440f)); }
template <class A> inline A gelu_erf_grad(A x) { return rt::gelu_erf_grad(x); }
template <> inline float gelu_erf_grad(float x) {   // one exp: e^(−z²) serves erf and the pdf
  const float z = x * 0.70710678118654752440f, e = vm::exp(-z * z);
  return 0.5f * (1.0f + vm::erf_given(z, e)) + x * e * 0.39894228040143267794f;
}
template <class A> inline A gelu_tanh(A x) { return rt::gelu_tanh(x); }
template <> inline float gelu_tanh(float x) {
  const float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + vm::tanh_abs(u));
}
template <class A> inline A gelu_tanh_grad(A x) { return rt::gelu_tanh_grad(x); }
template <> inline float gelu_tanh_grad(float x) {
  const float k = 0.79788456080286535588f, c = 0.044715f;
  const float t = vm::tanh_abs(k * (x + c * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
}

/// y = f(x) for op OP (a compile-time op: the kernels' loops hold no switch). Tanh keeps libm's
/// tanhf in fp32 (its relative error near 0 matters; 1 − 2/(e^2x + 1) loses it).
template <UnOp OP, class A> inline A unary(A x) {
  if constexpr (OP == UnOp::Neg) return -x;
  else if constexpr (OP == UnOp::Relu) return x > A(0) ? x : A(0);
  else if constexpr (OP == UnOp::Gelu) return vm::gelu_erf(x);
  else if constexpr (OP == UnOp::GeluTanh) return vm::gelu_tanh(x);
  else if constexpr (OP == UnOp::Silu) return x * vm::sigmoid_(x);
  else if constexpr (OP == UnOp::Tanh) return m_tanh(x);
  else if constexpr (OP == UnOp::Sigmoid) return vm::sigmoid_(x);
  else return vm::exp_(x);
}

/// f'(·) for op OP: from x for Gelu/GeluTanh/Silu, from y for the rest (as rt::unary_grad).
template <UnOp OP, class A> inline A unary_grad(A x, A y) {
  if constexpr (OP == UnOp::Neg) return A(-1);
  else if constexpr (OP == UnOp::Relu) return y > A(0) ? A(1) : A(0);
  else if constexpr (OP == UnOp::Gelu) return vm::gelu_erf_grad(x);
  else if constexpr (OP == UnOp::GeluTanh) return vm::gelu_tanh_grad(x);
  else if constexpr (OP == UnOp::Silu) {
    const A s = vm::sigmoid_(x);
    return s * (A(1) + x * (A(1) - s));
  } else if constexpr (OP == UnOp::Tanh) return A(1) - y * y;
  else if constexpr (OP == UnOp::Sigmoid) return y * (A(1) - y);
  else return y;
}

} // namespace vm


namespace detail {
/// The most elements of one row that one task of a strided elementwise loop takes (binary,
/// copy): a collapsed dense tensor is one row, which would otherwise run on one thread.
constexpr int64_t kRowChunk = 16384;

/// f(a, b) with two flags as compile-time constants (std::bool_constant): a kernel's loop
/// written in f then holds no branch on them and vectorises (with_binop says why).
template <class F> inline void with_flags(bool a, bool b, const F& f) {
  if (a) b ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
  else b ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
}

/// f(op, accumulate) with both as compile-time constants (std::integral_constant, std::
/// bool_constant): a kernel's loop written in f then holds no switch and no branch on them and
/// vectorises. With the op chosen per element, a dense add ran at a third of copy's bandwidth
/// and a scalar multiply at a tenth (131,072 floats, 2 threads, the 2-vCPU VM: 100 and 85 us
/// against copy's 15 and scale's 9).
template <class F> inline void with_binop(BinOp op, bool accumulate, const F& f) {
  auto go = [&](auto o) {
    if (accumulate) f(o, std::true_type{});
    else f(o, std::false_type{});
  };
  switch (op) {
    case BinOp::Add: return go(std::integral_constant<BinOp, BinOp::Add>{});
    case BinOp::Sub: return go(std::integral_constant<BinOp, BinOp::Sub>{});
    case BinOp::Mul: return go(std::integral_constant<BinOp, BinOp::Mul>{});
    case BinOp::Div: return go(std::integral_constant<BinOp, BinOp::Div>{});
  }
}
} // namespace detail

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
  // Tasks: each row in chunks of kRowChunk, so a dense operand (one long row) uses every thread.
  const int64_t nch = (inner + detail::kRowChunk - 1) / detail::kRowChunk;
  detail::region(ctx.nthreads(), c.count > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t task = 0; task < rows * nch; ++task) {
    const int64_t r = task / nch, i0 = (task % nch) * detail::kRowChunk;
    const int64_t i1 = i0 + detail::kRowChunk < inner ? i0 + detail::kRowChunk : inner;
    int64_t off[3];
    detail::row_offsets(c, 3, r, off);
    T* o = out + off[0];
    const T* pa = a + off[1];
    const T* pb = b + off[2];
    if (so == 1 && sa == 1 && sb == 1) {   // the common dense case: a loop the compiler vectorises
      detail::with_binop(op, accumulate, [&](auto OP, auto ACC) {
        for (int64_t i = i0; i < i1; ++i) {
          const acc_t<T> v = binop(OP.value, load(pa[i]), load(pb[i]));
          o[i] = ACC.value ? store<T>(load(o[i]) + v) : store<T>(v);
        }
      });
    } else {
      for (int64_t i = i0; i < i1; ++i)
        detail::put(o[i * so], binop(op, load(pa[i * sa]), load(pb[i * sb])), accumulate);
    }
  }
  });
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
  detail::region(ctx.nthreads(), c.count > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off[4];
    detail::row_offsets(c, 4, r, off);
    for (int64_t i = 0; i < inner; ++i) {
      const acc_t<T> bv = load(b[off[2] + i * sb]);
      detail::put(out[off[0] + i * so], -load(dy[off[3] + i * sd]) * load(a[off[1] + i * sa]) / (bv * bv),
                  accumulate);
    }
  }
  });
}

/// The gradient of c / x from its output y = c / x: out (+)= −dy · y² / c (n elements, dense).
template <class T>
void div_scalar_bwd(Ctx& ctx, const T* y, const T* dy, float c, T* out, int64_t n, bool accumulate) {
  detail::KernelScope ks(ctx, "div_scalar_bwd");
  detail::require_sizes("div_scalar_bwd", {n});
  const acc_t<T> cv = static_cast<acc_t<T>>(c);
  detail::region(ctx.nthreads(), n > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> yv = load(y[i]);
    detail::put(out[i], -load(dy[i]) * yv * yv / cv, accumulate);
  }
  });
}

/// out (+)= x op s, or s op x when scalarLeft.
template <class T>
void binary_scalar(Ctx& ctx, BinOp op, const T* x, float s, bool scalarLeft, T* out, int64_t n,
                   bool accumulate) {
  detail::KernelScope ks(ctx, "binary_scalar");
  detail::require_sizes("binary_scalar", {n});
  const acc_t<T> sv = static_cast<acc_t<T>>(s);
  detail::with_binop(op, accumulate, [&](auto OP, auto ACC) {
    detail::region(ctx.nthreads(), n > 4096, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const acc_t<T> v = load(x[i]);
      const acc_t<T> r = scalarLeft ? binop(OP.value, sv, v) : binop(OP.value, v, sv);
      out[i] = ACC.value ? store<T>(load(out[i]) + r) : store<T>(r);
    }
    });
  });
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
      detail::region(ctx.nthreads(), c.count > 4096, [&] {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t c0 = inner * t / nt, c1 = inner * (t + 1) / nt;
        for (int64_t r = 0; r < rows; ++r) {
          int64_t off[2];
          detail::row_offsets(c, 2, r, off);
          for (int64_t i = c0; i < c1; ++i) acc[off[1] + i * so] += load(x[off[0] + i * sx]);
        }
      });
    } else {
      // The innermost dimension is reduced: row sums in parallel, then added in row order.
      std::vector<A> rowsum(static_cast<size_t>(rows));
      detail::region(ctx.nthreads(), c.count > 4096, [&] {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        int64_t off[2];
        detail::row_offsets(c, 2, r, off);
        A s = 0;
        for (int64_t i = 0; i < inner; ++i) s += load(x[off[0] + i * sx]);
        rowsum[r] = s;
      }
      });
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
  detail::region(ctx.nthreads(), kcount > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t e = 0; e < kcount; ++e) {
    int64_t rem = e, off = 0;
    for (int d = kr - 1; d >= 0; --d) {
      off += (rem % kshape[d]) * kst[d];
      rem /= kshape[d];
    }
    detail::put(out[off], sc * acc[off], accumulate);
  }
  });
}

namespace detail {
/// f(i) for every i < n as a SIMD loop over each thread's contiguous share (OpenMP's static
/// schedule), on several threads only above 4096 elements. Not the combined `omp parallel for
/// simd`: GCC 12 runs that construct 2-7x slower than this form (measured on GELU, one thread at
/// 4,096 elements 26.6 vs 4.3 us, two threads at 65,536 112 vs 34 us; docs/performance.md),
/// which made every small elementwise kernel ~9 ns an element.
template <class F> inline void simd_for(Ctx& ctx, int64_t n, const F& f) {
  detail::region(ctx.nthreads(), n > 4096, [&] {
    const int64_t threads = omp_get_num_threads(), chunk = (n + threads - 1) / threads;
    const int64_t lo = std::min<int64_t>(n, chunk * omp_get_thread_num()), hi = std::min<int64_t>(n, lo + chunk);
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) f(i);
  });
}
}  // namespace detail

/// A generated kernel over n elements: f(e) for every e < n, in any order (codegen's fused
/// chains of elementwise ops: each element's ops run in registers, docs/codegen.md). Element e
/// reads and writes only what no other element writes (passes/Fusion.cpp, step 3), so the
/// loop is also a SIMD loop: the chain's rt::vm math vectorises as the unfused kernels' does.
template <class F> void fused(Ctx& ctx, int64_t n, const F& f) {
  detail::KernelScope ks(ctx, "fused");
  detail::require_sizes("fused", {n});
  detail::simd_for(ctx, n, f);
}

namespace detail {
/// unary_fwd's loop for one op (a compile-time op: no switch per element; fp32 vectorised).
template <UnOp OP, class T> void unary_fwd_op(Ctx& ctx, const T* x, T* y, int64_t n) {
  simd_for(ctx, n, [&](int64_t i) { y[i] = store<T>(vm::unary<OP>(load(x[i]))); });
}

/// unary_bwd's loop for one op: dx (+)= dy · f'(x or y).
template <UnOp OP, bool Acc, class T>
void unary_bwd_op(Ctx& ctx, const T* x, const T* y, const T* dy, T* dx, int64_t n) {
  using A = acc_t<T>;
  constexpr bool needX = OP == UnOp::Gelu || OP == UnOp::GeluTanh || OP == UnOp::Silu;
  constexpr bool needY = !needX && OP != UnOp::Neg;
  simd_for(ctx, n, [&](int64_t i) {
    const A xv = needX ? load(x[i]) : A(0), yv = needY ? load(y[i]) : A(0);
    const A g = load(dy[i]) * vm::unary_grad<OP>(xv, yv);
    dx[i] = Acc ? store<T>(load(dx[i]) + g) : store<T>(g);
  });
}

template <UnOp OP, class T>
void unary_bwd_acc(Ctx& ctx, const T* x, const T* y, const T* dy, T* dx, int64_t n, bool accumulate) {
  if (accumulate) unary_bwd_op<OP, true>(ctx, x, y, dy, dx, n);
  else unary_bwd_op<OP, false>(ctx, x, y, dy, dx, n);
}
} // namespace detail

/// y = f(x) elementwise (the op chosen once per call; each op's loop vectorised in fp32).
template <class T> void unary_fwd(Ctx& ctx, UnOp op, const T* x, T* y, int64_t n) {
  detail::KernelScope ks(ctx, "unary_fwd");
  detail::require_sizes("unary_fwd", {n});
  switch (op) {
    case UnOp::Neg: return detail::unary_fwd_op<UnOp::Neg>(ctx, x, y, n);
    case UnOp::Relu: return detail::unary_fwd_op<UnOp::Relu>(ctx, x, y, n);
    case UnOp::Gelu: return detail::unary_fwd_op<UnOp::Gelu>(ctx, x, y, n);
    case UnOp::GeluTanh: return detail::unary_fwd_op<UnOp::GeluTanh>(ctx, x, y, n);
    case UnOp::Silu: return detail::unary_fwd_op<UnOp::Silu>(ctx, x, y, n);
    case UnOp::Tanh: return detail::unary_fwd_op<UnOp::Tanh>(ctx, x, y, n);
    case UnOp::Sigmoid: return detail::unary_fwd_op<UnOp::Sigmoid>(ctx, x, y, n);
    case UnOp::Exp: return detail::unary_fwd_op<UnOp::Exp>(ctx, x, y, n);
  }
  detail::require(false, "unary_fwd", "unknown op");
}

/// dx (+)= dy · f'(·): from x for Gelu/GeluTanh/Silu, from y for Relu/Tanh/Sigmoid/Exp.
template <class T>
void unary_bwd(Ctx& ctx, UnOp op, const T* x, const T* y, const T* dy, T* dx, int64_t n,
               bool accumulate) {
  detail::KernelScope ks(ctx, "unary_bwd");
  detail::require_sizes("unary_bwd", {n});
  const bool needX = unary_grad_reads_x(op), needY = !needX && op != UnOp::Neg;
  detail::require(!needX || x != nullptr, "unary_bwd", "this op's backward reads x, which is null");
  detail::require(!needY || y != nullptr, "unary_bwd", "this op's backward reads y, which is null");
  switch (op) {
    case UnOp::Neg: return detail::unary_bwd_acc<UnOp::Neg>(ctx, x, y, dy, dx, n, accumulate);
    case UnOp::Relu: return detail::unary_bwd_acc<UnOp::Relu>(ctx, x, y, dy, dx, n, accumulate);
    case UnOp::Gelu: return detail::unary_bwd_acc<UnOp::Gelu>(ctx, x, y, dy, dx, n, accumulate);
    case UnOp::GeluTanh: return detail::unary_bwd_acc<UnOp::GeluTanh>(ctx, x, y, dy, dx, n, accumulate);
    case UnOp::Silu: return detail::unary_bwd_acc<UnOp::Silu>(ctx, x, y, dy, dx, n, accumulate);
    case UnOp::Tanh: return detail::unary_bwd_acc<UnOp::Tanh>(ctx, x, y, dy, dx, n, accumulate);
    case UnOp::Sigmoid: return detail::unary_bwd_acc<UnOp::Sigmoid>(ctx, x, y, dy, dx, n, accumulate);
    case UnOp::Exp: return detail::unary_bwd_acc<UnOp::Exp>(ctx, x, y, dy, dx, n, accumulate);
  }
  detail::require(false, "unary_bwd", "unknown op");
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
                 uint64_t stream, int64_t first = 0) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "dropout_fwd");
  detail::require_sizes("dropout_fwd", {n, first});
  detail::require(p >= 0.0f && p <= 1.0f, "dropout_fwd", [&] { return "p = " + std::to_string(p) + " is not in [0, 1]"; });
  // One Philox block gives the uniforms of elements 4q .. 4q+3 of the whole tensor; these n are
  // its elements first .. first + n - 1 (a sequence-parallel rank's share of a row).
  const int64_t q0 = first / 4, nq = (first + n + 3) / 4 - q0;
  detail::region(ctx.nthreads(), n > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t qj = 0; qj < nq; ++qj) {
    const int64_t qi = q0 + qj;
    const u32x4 blk = philox_block(seed, stream, static_cast<uint64_t>(qi));
    for (int64_t w = 0; w < 4 && 4 * qi + w < first + n; ++w) {
      if (4 * qi + w < first)
        continue;
      const int64_t i = 4 * qi + w - first;
      const bool k = philox_word_uniform(blk.w[w]) >= p;
      if (mask) mask[i] = k ? 1 : 0;
      y[i] = store<T>(dropout_apply(load(x[i]), k, static_cast<A>(p)));
    }
  }
  });
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
  detail::region(ctx.nthreads(), n > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t qi = 0; qi < nq; ++qi) {
    u32x4 blk{};
    if (!mask) blk = philox_block(seed, stream, static_cast<uint64_t>(qi));
    for (int64_t w = 0; w < 4 && 4 * qi + w < n; ++w) {
      const int64_t i = 4 * qi + w;
      const bool k = mask ? mask[i] != 0 : philox_word_uniform(blk.w[w]) >= p;
      detail::put(dx[i], dropout_apply(load(dy[i]), k, static_cast<A>(p)), accumulate);
    }
  }
  });
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
      detail::region(ctx.nthreads(), axis > 4096, [&] {
#pragma omp for reduction(+ : s)
      for (int64_t a = 0; a < axis; ++a) s += load(px[a]);
      });
      y[o] = store<T>(s / div);
    }
    return;
  }
  const int64_t chunk = 256, nch = (inner + chunk - 1) / chunk;
  detail::region(ctx.nthreads(), outer * axis * inner > 4096, [&] {
#pragma omp for schedule(static)
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
  });
}

/// dx[o, a, i] (+)= dy[o, i] (divided by `axis` when mean).
template <class T>
void sum_bwd(Ctx& ctx, const T* dy, T* dx, int64_t outer, int64_t axis, int64_t inner, bool mean,
             bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "sum_bwd");
  detail::require_sizes("sum_bwd", {outer, axis, inner});
  const A div = mean ? static_cast<A>(axis) : A(1);
  detail::region(ctx.nthreads(), outer * axis * inner > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < outer * axis; ++r) {
    const int64_t o = r / axis;
    for (int64_t i = 0; i < inner; ++i)
      detail::put(dx[r * inner + i], load(dy[o * inner + i]) / div, accumulate);
  }
  });
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
/// strided when dstStrides is given. A dense copy of one type is memcpy, split into one
/// contiguous chunk per thread when it is large; other copies split their rows, and long rows
/// into chunks, over the threads (a dense tensor collapses to one row).
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
  const int nt = ctx.nthreads();
  if constexpr (std::is_same_v<TS, TD>) {
    if (rows == 1 && sd == 1 && ss == 1 && !accumulate) {
      // Below 1 MiB one thread copies at full bandwidth and a team's start would cost more;
      // overlapping ranges (not emitted today) take one memmove.
      const int64_t bytes = inner * static_cast<int64_t>(sizeof(TD));
      const bool apart = dst + inner <= src || src + inner <= dst;
      if (nt <= 1 || bytes < (int64_t(1) << 20) || !apart) {
        std::memmove(dst, src, static_cast<size_t>(bytes));
        return;
      }
#pragma omp parallel num_threads(nt)
      {
        const int64_t k = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t e0 = inner * t / k, e1 = inner * (t + 1) / k;
        std::memcpy(dst + e0, src + e0, static_cast<size_t>(e1 - e0) * sizeof(TD));
      }
      return;
    }
  }
  // Tasks: each row in chunks of kRowChunk, so few long rows still use every thread.
  const int64_t chunk = detail::kRowChunk, nch = (inner + chunk - 1) / chunk;
  detail::region(nt, c.count > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t task = 0; task < rows * nch; ++task) {
    const int64_t r = task / nch, i0 = (task % nch) * chunk;
    const int64_t i1 = i0 + chunk < inner ? i0 + chunk : inner;
    int64_t off[2];
    detail::row_offsets(c, 2, r, off);
    TD* d = dst + off[0];
    const TS* s = src + off[1];
    if (sd == 1 && ss == 1) {
      for (int64_t i = i0; i < i1; ++i) detail::put(d[i], static_cast<acc_t<TD>>(load(s[i])), accumulate);
    } else {
      for (int64_t i = i0; i < i1; ++i) detail::put(d[i * sd], static_cast<acc_t<TD>>(load(s[i * ss])), accumulate);
    }
  }
  });
}

/// x[i] = value for i < n (zero-grad is fill(…, 0)).
template <class T> void fill(Ctx& ctx, T* x, float value, int64_t n) {
  detail::KernelScope ks(ctx, "fill");
  detail::require_sizes("fill", {n});
  const T v = store<T>(static_cast<acc_t<T>>(value));
  detail::region(ctx.nthreads(), n > 65536, [&] {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = v;
  });
}

/// *out = Σ g² (summed in double, returned as float); +inf when any g is NaN or infinite
/// (the fp16 loss-scaling overflow check).
template <class T> void sum_squares(Ctx& ctx, const T* g, int64_t n, float* out) {
  detail::KernelScope ks(ctx, "sum_squares");
  detail::require_sizes("sum_squares", {n});
  double s = 0.0;
  int bad = 0;
  detail::region(ctx.nthreads(), n > 4096, [&] {
#pragma omp for reduction(+ : s) reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(load(g[i]));
    if (!m_finite(v)) bad = 1;
    s += v * v;
  }
  });
  *out = bad ? m_inf<float>() : static_cast<float>(s);
}

/// x[i] *= s (unscale, clip).
template <class T> void scale(Ctx& ctx, T* x, float s, int64_t n) {
  detail::KernelScope ks(ctx, "scale");
  detail::require_sizes("scale", {n});
  const acc_t<T> sv = static_cast<acc_t<T>>(s);
  detail::region(ctx.nthreads(), n > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = store<T>(load(x[i]) * sv);
  });
}

} // namespace rt
