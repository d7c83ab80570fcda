// tally CPU runtime: per-row kernels — softmax, layer norm, RMS norm, rotary embedding,
// embedding lookup and cross-entropy. Rows run in parallel (OpenMP); the arithmetic of each
// element is common/tally_rows.h. Gradients of norm and embedding weights accumulate.
#pragma once

#include "rt_ctx.h"
#include "rt_elementwise.h"

#include <type_traits>

namespace rt {
namespace detail {

/// Adds per-thread partial column sums into dst (dst[j] (+)= Σ_t part[t][j]); always accumulates.
template <class T, class A>
void add_partials(Ctx& ctx, const std::vector<std::vector<A>>& part, T* dst, int64_t cols) {
  detail::region(ctx.nthreads(), cols > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t j = 0; j < cols; ++j) {
    A s = 0;
    for (const auto& p : part) s += p[j];
    dst[j] = store<T>(load(dst[j]) + s);
  }
  });
}

/// Mean and rstd of one row in the arithmetic type (two passes: mean, then Σ (x − mean)²).
template <class T>
void row_mean_rstd(const T* x, int64_t cols, acc_t<T> eps, acc_t<T>& mean, acc_t<T>& rstd) {
  using A = acc_t<T>;
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < cols; ++j) s += load(x[j]);
  mean = s / static_cast<A>(cols);
  A v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t j = 0; j < cols; ++j) {
    A d = load(x[j]) - mean;
    v += d * d;
  }
  rstd = norm_rstd(v / static_cast<A>(cols), eps);
}

/// rstd of one row for RMS norm: 1/√(mean(x²) + eps).
template <class T> acc_t<T> row_rms_rstd(const T* x, int64_t cols, acc_t<T> eps) {
  using A = acc_t<T>;
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < cols; ++j) {
    A v = load(x[j]);
    s += v * v;
  }
  return norm_rstd(s / static_cast<A>(cols), eps);
}

/// True for the fp64 test instantiation: backward kernels that can recompute a saved fp32
/// log-sum-exp from their inputs alone (cross-entropy, attention) do so in double, so that
/// finite differences can be tight.
template <class T> constexpr bool kExactStats = std::is_same<T, double>::value;

} // namespace detail

/// y = softmax(x) over the last dimension (rows × cols).
template <class T> void softmax_fwd(Ctx& ctx, const T* x, T* y, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "softmax_fwd");
  detail::require_sizes("softmax_fwd", {rows, cols});
  detail::region(ctx.nthreads(), rows * cols > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* px = x + r * cols;
    T* py = y + r * cols;
    A m = -m_inf<A>();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < cols; ++j) m = load(px[j]) > m ? load(px[j]) : m;
    A s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) s += m_exp(load(px[j]) - m);
    const A inv = A(1) / s;
    for (int64_t j = 0; j < cols; ++j) py[j] = store<T>(m_exp(load(px[j]) - m) * inv);
  }
  });
}

/// dx (+)= y · (dy − Σ y·dy) per row.
template <class T>
void softmax_bwd(Ctx& ctx, const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "softmax_bwd");
  detail::require_sizes("softmax_bwd", {rows, cols});
  detail::region(ctx.nthreads(), rows * cols > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* py = y + r * cols;
    const T* pd = dy + r * cols;
    A dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < cols; ++j) dot += load(py[j]) * load(pd[j]);
    for (int64_t j = 0; j < cols; ++j)
      detail::put(dx[r * cols + j], softmax_grad(load(py[j]), load(pd[j]), dot), accumulate);
  }
  });
}

namespace detail {
/// The prologue of a norm without one.
struct NoPrologue {
  void operator()(int64_t) const {}
};
}  // namespace detail

/// y = (x − mean) · rstd · w + b per row (biased variance, eps inside the root); saves mean, rstd.
/// w null: no weight and no bias (y = (x − mean) · rstd, PyTorch's elementwise_affine = False).
/// layer_norm_fwd_fused first runs `pro` (a generated functor, the step's fused elementwise run
/// that computes x) on every element of the row, which writes x, then normalises the row.
template <class T, class F>
void layer_norm_fwd_fused(Ctx& ctx, const F& pro, const T* x, const T* w, const T* b, T* y, float* mean,
                          float* rstd, int64_t rows, int64_t cols, float eps) {
  using A = acc_t<T>;
  constexpr bool plain = std::is_same<F, detail::NoPrologue>::value;
  const char* kernel = plain ? "layer_norm_fwd" : "fused";
  detail::KernelScope ks(ctx, kernel);
  detail::require_sizes(kernel, {rows, cols});
  detail::require(w != nullptr || b == nullptr, kernel, "a bias needs a weight (w is null, b is not)");
  detail::region(ctx.nthreads(), rows * cols > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    if (!plain)
      for (int64_t j = 0; j < cols; ++j) pro(r * cols + j);
    const T* px = x + r * cols;
    A mu, rs;
    detail::row_mean_rstd(px, cols, static_cast<A>(eps), mu, rs);
    if (mean) mean[r] = static_cast<float>(mu);
    if (rstd) rstd[r] = static_cast<float>(rs);
    for (int64_t j = 0; j < cols; ++j)
      y[r * cols + j] = store<T>(layer_norm_y(load(px[j]), mu, rs, w ? load(w[j]) : A(1), b ? load(b[j]) : A(0)));
  }
  });
}

template <class T>
void layer_norm_fwd(Ctx& ctx, const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,
                    int64_t rows, int64_t cols, float eps) {
  layer_norm_fwd_fused(ctx, detail::NoPrologue{}, x, w, b, y, mean, rstd, rows, cols, eps);
}

/// dx (+)= rstd · (g − mean(g) − x̂ · mean(g·x̂)), g = w·dy; dw += Σ_rows dy·x̂; db += Σ_rows dy.
/// Uses the fp32 mean/rstd the forward saved (for every storage type, fp64 included). w null: the
/// norm had no weight (g = dy), and dw, db must be null.
template <class T>
void layer_norm_bwd(Ctx& ctx, const T* x, const T* w, const float* mean, const float* rstd,
                    const T* dy, T* dx, T* dw, T* db, int64_t rows, int64_t cols, bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "layer_norm_bwd");
  detail::require_sizes("layer_norm_bwd", {rows, cols});
  detail::require(mean != nullptr && rstd != nullptr, "layer_norm_bwd", "mean and rstd must not be null");
  detail::require(w != nullptr || (dw == nullptr && db == nullptr), "layer_norm_bwd",
                  "a norm without a weight (w null) has no dw or db");
  const int nt = ctx.nthreads();
  // Per-thread partial sums of dw and db (sized for nt threads even when the region runs on fewer).
  std::vector<std::vector<A>> pw(nt, std::vector<A>(static_cast<size_t>(dw ? cols : 0), A(0)));
  std::vector<std::vector<A>> pb(nt, std::vector<A>(static_cast<size_t>(db ? cols : 0), A(0)));
  // The flags are chosen once, outside the row loop, and every inner loop reads only locals:
  // with the choice inside (a lambda per row, `w ?` per element) no loop but the first
  // vectorised and the kernel ran at 140 us for 512 rows of 256 floats on 2 threads, 6x
  // layer_norm_fwd; 27 us so (docs/performance.md).
  detail::region(nt, rows * cols > 4096, [&] {
    const int t = omp_get_thread_num();
    A* qw = dw ? pw[t].data() : nullptr;
    A* qb = db ? pb[t].data() : nullptr;
    auto rowLoop = [&](auto ACC, auto HAS_W) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* px = x + r * cols;
      const T* pd = dy + r * cols;
      const T* pwt = w; // a local: `w` itself is read through the closure, and `omp simd` gathers it
      const A mu = static_cast<A>(mean[r]), rs = static_cast<A>(rstd[r]);
      A mg = 0, mgx = 0;
#pragma omp simd reduction(+ : mg, mgx)
      for (int64_t j = 0; j < cols; ++j) {
        const A xh = (load(px[j]) - mu) * rs, g = (HAS_W.value ? load(pwt[j]) : A(1)) * load(pd[j]);
        mg += g;
        mgx += g * xh;
      }
      mg /= static_cast<A>(cols);
      mgx /= static_cast<A>(cols);
      if (dx) {
        T* dxr = dx + r * cols;
        for (int64_t j = 0; j < cols; ++j) {
          const A xh = (load(px[j]) - mu) * rs, g = (HAS_W.value ? load(pwt[j]) : A(1)) * load(pd[j]);
          const A v = layer_norm_dx(xh, g, mg, mgx, rs);
          dxr[j] = ACC.value ? store<T>(load(dxr[j]) + v) : store<T>(v);
        }
      }
      if (qw && qb)
        for (int64_t j = 0; j < cols; ++j) {
          const A d = load(pd[j]);
          qw[j] += d * ((load(px[j]) - mu) * rs);
          qb[j] += d;
        }
      else if (qw)
        for (int64_t j = 0; j < cols; ++j) qw[j] += load(pd[j]) * ((load(px[j]) - mu) * rs);
      else if (qb)
        for (int64_t j = 0; j < cols; ++j) qb[j] += load(pd[j]);
    }
    };
    detail::with_flags(accumulate, w != nullptr, rowLoop);
  });
  if (dw) detail::add_partials(ctx, pw, dw, cols);
  if (db) detail::add_partials(ctx, pb, db, cols);
}

/// y = x · rstd · w, rstd = 1/√(mean(x²) + eps) per row; saves rstd. The _fused form runs a
/// prologue on each row first, as layer_norm_fwd_fused.
template <class T, class F>
void rms_norm_fwd_fused(Ctx& ctx, const F& pro, const T* x, const T* w, T* y, float* rstd, int64_t rows,
                        int64_t cols, float eps) {
  using A = acc_t<T>;
  constexpr bool plain = std::is_same<F, detail::NoPrologue>::value;
  const char* kernel = plain ? "rms_norm_fwd" : "fused";
  detail::KernelScope ks(ctx, kernel);
  detail::require_sizes(kernel, {rows, cols});
  detail::require(w != nullptr, kernel, "w must not be null");
  detail::region(ctx.nthreads(), rows * cols > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    if (!plain)
      for (int64_t j = 0; j < cols; ++j) pro(r * cols + j);
    const T* px = x + r * cols;
    A rs = detail::row_rms_rstd(px, cols, static_cast<A>(eps));
    if (rstd) rstd[r] = static_cast<float>(rs);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = store<T>(rms_norm_y(load(px[j]), rs, load(w[j])));
  }
  });
}

template <class T>
void rms_norm_fwd(Ctx& ctx, const T* x, const T* w, T* y, float* rstd, int64_t rows, int64_t cols, float eps) {
  rms_norm_fwd_fused(ctx, detail::NoPrologue{}, x, w, y, rstd, rows, cols, eps);
}

/// dx (+)= rstd · (g − x̂ · mean(g·x̂)), g = w·dy, x̂ = x·rstd; dw += Σ_rows dy·x̂.
template <class T>
void rms_norm_bwd(Ctx& ctx, const T* x, const T* w, const float* rstd, const T* dy, T* dx, T* dw,
                  int64_t rows, int64_t cols, bool accumulate) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "rms_norm_bwd");
  detail::require_sizes("rms_norm_bwd", {rows, cols});
  detail::require(w != nullptr && rstd != nullptr, "rms_norm_bwd", "w and rstd must not be null");
  const int nt = ctx.nthreads();
  std::vector<std::vector<A>> pw(nt, std::vector<A>(static_cast<size_t>(dw ? cols : 0), A(0)));
  detail::region(nt, rows * cols > 4096, [&] {
    A* qw = dw ? pw[omp_get_thread_num()].data() : nullptr;
    auto rowLoop = [&](auto ACC, auto HAS_DW) { // as layer_norm_bwd's
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* px = x + r * cols;
      const T* pd = dy + r * cols;
      const T* pwt = w; // a local, as layer_norm_bwd's
      const A rs = static_cast<A>(rstd[r]);
      A mgx = 0;
#pragma omp simd reduction(+ : mgx)
      for (int64_t j = 0; j < cols; ++j) mgx += load(pwt[j]) * load(pd[j]) * load(px[j]) * rs;
      mgx /= static_cast<A>(cols);
      if (dx) {
        T* dxr = dx + r * cols;
        for (int64_t j = 0; j < cols; ++j) {
          const A v = rms_norm_dx(load(px[j]) * rs, load(pwt[j]) * load(pd[j]), mgx, rs);
          dxr[j] = ACC.value ? store<T>(load(dxr[j]) + v) : store<T>(v);
        }
      }
      if (HAS_DW.value)
        for (int64_t j = 0; j < cols; ++j) qw[j] += load(pd[j]) * (load(px[j]) * rs);
    }
    };
    detail::with_flags(accumulate, dw != nullptr, rowLoop);
  });
  if (dw) detail::add_partials(ctx, pw, dw, cols);
}

namespace detail {
/// Rotates every head of every row of x [B, S, H·hd] by angle pos·inv_freq(i), or by its
/// negative (sgn = −1, the backward); out (+)= the result.
template <class T>
void rope_apply(Ctx& ctx, const char* name, const T* x, T* out, const int32_t* positions, int64_t B,
                int64_t S, int64_t H, int64_t hd, float theta, acc_t<T> sgn, bool accumulate) {
  using A = acc_t<T>;
  require_sizes(name, {B, S, H, hd});
  require(hd % 2 == 0, name, [&] { return "head size " + std::to_string(hd) + " is odd"; });
  require(theta > 0.0f, name, "theta must be positive");
  const int64_t half = hd / 2, width = H * hd;
  std::vector<A> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[i] = rope_inv_freq<A>(i, hd, static_cast<A>(theta));
  detail::region(ctx.nthreads(), B * S * width > 4096, [&] {
    std::vector<A> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < B * S; ++row) {
      const int64_t s = row % S;
      const A pos = static_cast<A>(positions ? positions[s] : s);
      for (int64_t i = 0; i < half; ++i) {
        A ang = pos * inv[i];
        cs[i] = m_cos(ang);
        sn[i] = sgn * m_sin(ang);
      }
      for (int64_t h = 0; h < H; ++h) {
        const T* px = x + row * width + h * hd;
        T* po = out + row * width + h * hd;
        for (int64_t i = 0; i < half; ++i) {
          A y1, y2;
          rope_rotate(load(px[i]), load(px[i + half]), cs[i], sn[i], y1, y2);
          put(po[i], y1, accumulate);
          put(po[i + half], y2, accumulate);
        }
      }
    }
  });
}
} // namespace detail

/// Rotary embedding (rotate-half pairing: i with i + hd/2 in each head), angle pos · theta^(−2i/hd).
template <class T>
void rope_fwd(Ctx& ctx, const T* x, T* y, const int32_t* positions, int64_t B, int64_t S, int64_t H,
              int64_t hd, float theta) {
  detail::KernelScope ks(ctx, "rope_fwd");
  detail::rope_apply(ctx, "rope_fwd", x, y, positions, B, S, H, hd, theta, acc_t<T>(1), false);
}

/// dx (+)= the rotation of dy by the negative angle.
template <class T>
void rope_bwd(Ctx& ctx, const T* dy, T* dx, const int32_t* positions, int64_t B, int64_t S, int64_t H,
              int64_t hd, float theta, bool accumulate) {
  detail::KernelScope ks(ctx, "rope_bwd");
  detail::rope_apply(ctx, "rope_bwd", dy, dx, positions, B, S, H, hd, theta, acc_t<T>(-1), accumulate);
}

namespace detail {
/// Throws unless every id is in [lo, vocab) (lo = −1 for labels).
inline void check_ids(Ctx& ctx, const char* name, const int32_t* ids, int64_t rows, int64_t lo, int64_t vocab) {
  int64_t bad = -1;
  detail::region(ctx.nthreads(), rows > 65536, [&] {
#pragma omp for reduction(max : bad)
  for (int64_t r = 0; r < rows; ++r)
    if (ids[r] < lo || ids[r] >= vocab) bad = r > bad ? r : bad;
  });
  if (bad >= 0)
    throw Error(std::string("rt::") + name + ": index " + std::to_string(ids[bad]) + " at row " +
                std::to_string(bad) + " is outside [" + std::to_string(lo) + ", " + std::to_string(vocab) + ")");
}
} // namespace detail

/// out[r] = w[ids[r]] (rows × d); ids must be in [0, vocab).
template <class T>
void embedding_fwd(Ctx& ctx, const int32_t* ids, const T* w, T* out, int64_t rows, int64_t d, int64_t vocab) {
  detail::KernelScope ks(ctx, "embedding_fwd");
  detail::require_sizes("embedding_fwd", {rows, d, vocab});
  detail::check_ids(ctx, "embedding_fwd", ids, rows, 0, vocab);
  detail::region(ctx.nthreads(), rows * d > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = w[static_cast<int64_t>(ids[r]) * d + j];
  });
}

/// dw[ids[r]] += dy[r] (scatter-add; threads own disjoint column ranges, so repeats never race).
template <class T>
void embedding_bwd(Ctx& ctx, const int32_t* ids, const T* dy, T* dw, int64_t rows, int64_t d, int64_t vocab) {
  detail::KernelScope ks(ctx, "embedding_bwd");
  detail::require_sizes("embedding_bwd", {rows, d, vocab});
  detail::check_ids(ctx, "embedding_bwd", ids, rows, 0, vocab);
  detail::region(ctx.nthreads(), rows * d > 4096, [&] {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = d * t / nt, c1 = d * (t + 1) / nt;
    for (int64_t r = 0; r < rows; ++r) {
      T* pw = dw + static_cast<int64_t>(ids[r]) * d;
      const T* pd = dy + r * d;
      for (int64_t j = c0; j < c1; ++j) pw[j] = store<T>(load(pw[j]) + load(pd[j]));
    }
  });
}

namespace detail {
/// log Σ e^x of one row. In fp32 arithmetic two vectorised passes, the maximum m and then
/// Σ e^(x − m) with rt::vm::exp (8 or 16 partial sums: no worse than one running sum), m + log of
/// it; a row with +inf gives +inf, an empty or all −inf row −inf. In fp64 the online softmax with
/// libm (the finite-difference references).
template <class T> inline acc_t<T> row_lse(const T* px, int64_t V) {
  using A = acc_t<T>;
  if constexpr (std::is_same<A, float>::value) {
    float m = -m_inf<float>();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < V; ++j) m = load(px[j]) > m ? load(px[j]) : m;
    if (m == -m_inf<float>() || m == m_inf<float>()) return m;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += vm::exp(load(px[j]) - m);
    return m + m_log(s);
  } else {
    OnlineSoftmax<A> os = online_softmax_init<A>();
    for (int64_t j = 0; j < V; ++j) online_softmax_add(os, load(px[j]));
    return online_softmax_lse(os);
  }
}

/// dlogits[j] (+)= g · e^(x_j − lse) for j in [j0, j1) (no label among them), fp32 arithmetic.
template <class T>
inline void dlogits_run(const T* px, T* pd, int64_t j0, int64_t j1, float l, float g, bool accumulate) {
  if (accumulate) {
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) pd[j] = store<T>(load(pd[j]) + g * vm::exp(load(px[j]) - l));
  } else {
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) pd[j] = store<T>(g * vm::exp(load(px[j]) - l));
  }
}
} // namespace detail

/// loss = mean over rows with label != −1 of (lse − logit[label]); saves lse per row (fp32).
/// No counted row gives 0/0 = NaN, as PyTorch. Rows are `ld` apart (0: V), of which the first
/// V columns are read: a padded head's logits (ld = V' > V; tally's passes/HeadPadding.h).
template <class T>
void cross_entropy_fwd(Ctx& ctx, const T* logits, const int32_t* labels, float* loss, float* lse,
                       int64_t rows, int64_t V, int64_t ld = 0) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "cross_entropy_fwd");
  detail::require_sizes("cross_entropy_fwd", {rows, V});
  if (ld == 0) ld = V;
  detail::require(ld >= V, "cross_entropy_fwd", "the row stride is below the valid width");
  detail::check_ids(ctx, "cross_entropy_fwd", labels, rows, kIgnoreLabel, V);
  double total = 0.0;
  int64_t count = 0;
  detail::region(ctx.nthreads(), rows * V > 4096, [&] {
#pragma omp for reduction(+ : total, count) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* px = logits + r * ld;
    A l = detail::row_lse(px, V);
    if (lse) lse[r] = static_cast<float>(l);
    if (labels[r] != kIgnoreLabel) {
      total += static_cast<double>(cross_entropy_row_loss(l, load(px[labels[r]])));
      count += 1;
    }
  }
  });
  *loss = static_cast<float>(total / static_cast<double>(count));
}

/// dlogits (+)= dloss/count · (softmax(logits) − onehot(label)); 0 on ignored rows. Rows `ld`
/// apart (0: V): columns V..ld−1 of dlogits (a padded head's) get 0 (+0 when accumulating).
template <class T>
void cross_entropy_bwd(Ctx& ctx, const T* logits, const int32_t* labels, const float* lse,
                       const float* dloss, T* dlogits, int64_t rows, int64_t V, bool accumulate,
                       int64_t ld = 0) {
  using A = acc_t<T>;
  detail::KernelScope ks(ctx, "cross_entropy_bwd");
  detail::require_sizes("cross_entropy_bwd", {rows, V});
  if (ld == 0) ld = V;
  detail::require(ld >= V, "cross_entropy_bwd", "the row stride is below the valid width");
  detail::require(dloss != nullptr && lse != nullptr, "cross_entropy_bwd", "lse and dloss must not be null");
  detail::check_ids(ctx, "cross_entropy_bwd", labels, rows, kIgnoreLabel, V);
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) count += labels[r] != kIgnoreLabel ? 1 : 0;
  const A g = static_cast<A>(*dloss) / static_cast<A>(count);
  detail::region(ctx.nthreads(), rows * V > 4096, [&] {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* px = logits + r * ld;
    T* pd = dlogits + r * ld;
    const int32_t lab = labels[r];
    if (!accumulate)
      for (int64_t j = V; j < ld; ++j) pd[j] = store<T>(A(0));
    if (lab == kIgnoreLabel) {
      if (!accumulate)
        for (int64_t j = 0; j < V; ++j) pd[j] = store<T>(A(0));
      continue;
    }
    A l = static_cast<A>(lse[r]);
    if (detail::kExactStats<T>) {
      OnlineSoftmax<A> os = online_softmax_init<A>();
      for (int64_t j = 0; j < V; ++j) online_softmax_add(os, load(px[j]));
      l = online_softmax_lse(os);
    }
    if constexpr (std::is_same<A, float>::value) { // vm::exp, vectorised: the label's apart
      detail::dlogits_run(px, pd, 0, lab, l, g, accumulate);
      detail::put(pd[lab], g * (vm::exp(load(px[lab]) - l) - 1.0f), accumulate);
      detail::dlogits_run(px, pd, lab + 1, V, l, g, accumulate);
    } else {
      for (int64_t j = 0; j < V; ++j)
        detail::put(pd[j], cross_entropy_dlogit(load(px[j]), l, j == lab, g), accumulate);
    }
  }
  });
}

} // namespace rt
