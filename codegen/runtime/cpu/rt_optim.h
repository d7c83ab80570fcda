// tally CPU runtime: the optimizers over one flat parameter region. p is fp32 (the weights, or
// their fp32 master copy) or, for 16-bit parameters without a master copy, the storage type PT:
// each element is widened to fp32, updated in fp32 and rounded back (to nearest even) once. g
// (storage type T) is multiplied by gscale first; pm (the model-dtype copy, may be null) is
// refreshed from p. The per-element formulas are common/tally_optim.h.
#pragma once

#include "rt_ctx.h"

namespace rt {
namespace detail {
/// Runs f(i, g_i, p_i) over i < n in parallel on p_i widened to fp32, stores it back in PT, then
/// refreshes pm[i] from it when pm is given.
template <class PT, class T, class F>
void optim_loop(Ctx& ctx, const char* name, PT* p, T* pm, const T* g, int64_t n, float gscale, F f) {
  require_sizes(name, {n});
  require(p != nullptr && g != nullptr, name, "p and g must not be null");
  // Each thread works on its own copy of f and of the pointers: the captures then stay in
  // registers, and the loop vectorises (reading them through the shared closure, which the
  // stores to p might alias, kept it scalar: ~3 ns per Adam element, bound by scalar divides).
  detail::region(ctx.nthreads(), n > 4096, [&] {
    F fl = f;
    PT *pl = p;
    T *pml = pm;
    const T *gl = g;
    const float gs = gscale;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float pi = static_cast<float>(load(pl[i]));
      fl(i, static_cast<float>(load(gl[i])) * gs, pi);
      pl[i] = store<PT>(pi);
      if (pml) pml[i] = store<T>(static_cast<acc_t<T>>(pi));
    }
  });
}
} // namespace detail

/// SGD (momentum buffer null: none; dampening 0, no Nesterov).
template <class T, class PT = float>
void sgd_update(Ctx& ctx, PT* p, T* pm, const T* g, float* momentum, int64_t n, float lr, float mu,
                float wd, float gscale) {
  detail::KernelScope ks(ctx, "sgd_update");
  detail::optim_loop(ctx, "sgd_update", p, pm, g, n, gscale, [=](int64_t i, float gi, float& pi) {
    sgd_element(pi, gi, momentum ? momentum + i : nullptr, lr, mu, wd);
  });
}

/// AdaGrad (sum: the running Σ g², starts at 0).
template <class T, class PT = float>
void adagrad_update(Ctx& ctx, PT* p, T* pm, const T* g, float* sum, int64_t n, float lr, float eps,
                    float wd, float gscale) {
  detail::KernelScope ks(ctx, "adagrad_update");
  detail::require(sum != nullptr, "adagrad_update", "sum must not be null");
  detail::optim_loop(ctx, "adagrad_update", p, pm, g, n, gscale,
                     [=](int64_t i, float gi, float& pi) { adagrad_element(pi, gi, sum[i], lr, eps, wd); });
}

/// RMSprop (sq: running mean of g²; buf: momentum buffer, null without momentum).
template <class T, class PT = float>
void rmsprop_update(Ctx& ctx, PT* p, T* pm, const T* g, float* sq, float* buf, int64_t n, float lr,
                    float alpha, float eps, float wd, float mu, float gscale) {
  detail::KernelScope ks(ctx, "rmsprop_update");
  detail::require(sq != nullptr, "rmsprop_update", "sq must not be null");
  detail::require(mu == 0.0f || buf != nullptr, "rmsprop_update", "momentum needs a buffer");
  detail::optim_loop(ctx, "rmsprop_update", p, pm, g, n, gscale, [=](int64_t i, float gi, float& pi) {
    rmsprop_element(pi, gi, sq[i], buf ? buf + i : nullptr, lr, alpha, eps, wd, mu);
  });
}

/// Adam (decoupled = false) or AdamW (decoupled = true); step is 1-based.
template <class T, class PT = float>
void adam_update(Ctx& ctx, PT* p, T* pm, const T* g, float* m, float* v, int64_t n, float lr, float b1,
                 float b2, float eps, float wd, bool decoupled, int64_t step, float gscale) {
  detail::KernelScope ks(ctx, "adam_update");
  detail::require(m != nullptr && v != nullptr, "adam_update", "m and v must not be null");
  detail::require(step >= 1, "adam_update", [&] { return "step " + std::to_string(step) + " is not 1-based"; });
  const AdamScalars sc = adam_scalars(lr, b1, b2, step);
  detail::optim_loop(ctx, "adam_update", p, pm, g, n, gscale, [=](int64_t i, float gi, float& pi) {
    adam_element(pi, gi, m[i], v[i], lr, b1, b2, eps, wd, decoupled, sc);
  });
}

/// Lion (m: the momentum, starts at 0).
template <class T, class PT = float>
void lion_update(Ctx& ctx, PT* p, T* pm, const T* g, float* m, int64_t n, float lr, float b1, float b2,
                 float wd, float gscale) {
  detail::KernelScope ks(ctx, "lion_update");
  detail::require(m != nullptr, "lion_update", "m must not be null");
  detail::optim_loop(ctx, "lion_update", p, pm, g, n, gscale,
                     [=](int64_t i, float gi, float& pi) { lion_element(pi, gi, m[i], lr, b1, b2, wd); });
}

} // namespace rt
