// tally runtime, common: scalar math in float and double, and every elementwise op with its
// derivative (PyTorch's formulas: gelu erf and tanh forms, silu, sigmoid, tanh, relu, exp).
#pragma once

#include "tally_hd.h"

namespace rt {

/// Elementwise binary operators (`binary`, `binary_scalar`).
enum class BinOp : int { Add, Sub, Mul, Div };
/// Elementwise unary operators (`unary_fwd`, `unary_bwd`).
enum class UnOp : int { Neg, Relu, Gelu, GeluTanh, Silu, Tanh, Sigmoid, Exp };

/// m_erf's two fits, shared with the CPU runtime's branch-free erf (rt::vm::erf_given):
/// P(t) of degree 6 in t = x² (erf(x) = x·P for |x| < 1) and R(u) of degree 9 in u = 1/|x|
/// (erf(x) = 1 − e^(−x²)·R for 1 <= |x| < 4).
TALLY_HD inline float erf_small_fit(float t) {
  float p = 7.93277925e-05f;
  p = p * t - 8.03462160e-04f;
  p = p * t + 5.19119124e-03f;
  p = p * t - 2.68553838e-02f;
  p = p * t + 1.12836253e-01f;
  p = p * t - 3.76126298e-01f;
  return p * t + 1.12837917e+00f;
}
TALLY_HD inline float erf_large_fit(float u) {
  float r = 2.99710302e-02f;
  r = r * u - 1.74941046e-01f;
  r = r * u + 4.25131163e-01f;
  r = r * u - 5.16698701e-01f;
  r = r * u + 2.18937405e-01f;
  r = r * u + 2.42343781e-01f;
  r = r * u - 3.80596186e-01f;
  r = r * u + 2.16981450e-02f;
  r = r * u + 5.61607416e-01f;
  return r * u + 1.30583948e-04f;
}

// Float and double overloads of the libm functions, callable on host and device.
TALLY_HD inline float m_exp(float x) { return expf(x); }
TALLY_HD inline double m_exp(double x) { return exp(x); }
TALLY_HD inline float m_log(float x) { return logf(x); }
TALLY_HD inline double m_log(double x) { return log(x); }
TALLY_HD inline float m_sqrt(float x) { return sqrtf(x); }
TALLY_HD inline double m_sqrt(double x) { return sqrt(x); }
/// erf in fp32 without libm's erff (several times slower than expf on the CPU): |x| < 1:
/// x·P(x²) with P of degree 6; 1 <= |x| < 4: 1 − e^(−x²)·R(1/|x|) with R of degree 9 (R fits
/// erfc(a)·e^(a²)); |x| >= 4: ±1 (erfc(4) = 1.5e-8 is below half an ulp of 1). Least-squares fits
/// to erf in double (tally's own, made with numpy.polyfit); error within 2e-7 of erf everywhere
/// (pinned by step_tests), against erff's 6e-8.
TALLY_HD inline float m_erf(float x) {
  const float ax = fabsf(x);
  if (ax < 1.0f) {
    const float t = x * x;
    return x * erf_small_fit(t);
  }
  if (!(ax < 4.0f)) return x != x ? x : (x > 0.0f ? 1.0f : -1.0f);   // NaN stays NaN
  const float u = 1.0f / ax;
  const float e = 1.0f - expf(-ax * ax) * erf_large_fit(u);
  return x > 0.0f ? e : -e;
}
TALLY_HD inline double m_erf(double x) { return erf(x); }
TALLY_HD inline float m_tanh(float x) { return tanhf(x); }
TALLY_HD inline double m_tanh(double x) { return tanh(x); }
/// tanh where only its absolute error matters (inside gelu_tanh, where it is added to 1):
/// fp32 as 1 − 2/(e^(2x) + 1) (absolute error ~1e-7, one expf instead of the slower tanhf);
/// fp64 exact.
TALLY_HD inline float m_tanh_abs(float x) { return 1.0f - 2.0f / (expf(2.0f * x) + 1.0f); }
TALLY_HD inline double m_tanh_abs(double x) { return tanh(x); }
TALLY_HD inline float m_cos(float x) { return cosf(x); }
TALLY_HD inline double m_cos(double x) { return cos(x); }
TALLY_HD inline float m_sin(float x) { return sinf(x); }
TALLY_HD inline double m_sin(double x) { return sin(x); }
TALLY_HD inline float m_pow(float x, float y) { return powf(x, y); }
TALLY_HD inline double m_pow(double x, double y) { return pow(x, y); }
TALLY_HD inline float m_abs(float x) { return fabsf(x); }
TALLY_HD inline double m_abs(double x) { return fabs(x); }
/// IEEE infinity of type A.
template <class A> TALLY_HD inline A m_inf() { return static_cast<A>(HUGE_VAL); }
/// True when x is neither NaN nor infinite.
template <class A> TALLY_HD inline bool m_finite(A x) { return x - x == A(0); }

/// a op b.
template <class A> TALLY_HD inline A binop(BinOp op, A a, A b) {
  switch (op) {
    case BinOp::Add: return a + b;
    case BinOp::Sub: return a - b;
    case BinOp::Mul: return a * b;
    case BinOp::Div: return a / b;
  }
  return a;
}

/// sigmoid(x) = 1 / (1 + e^-x), written to avoid overflow for large |x|.
template <class A> TALLY_HD inline A sigmoid(A x) {
  if (x >= A(0)) return A(1) / (A(1) + m_exp(-x));
  A e = m_exp(x);
  return e / (A(1) + e);
}

/// gelu(x) = x/2 · (1 + erf(x/√2))  (torch.nn.functional.gelu, approximate='none').
template <class A> TALLY_HD inline A gelu_erf(A x) {
  return A(0.5) * x * (A(1) + m_erf(x * A(0.70710678118654752440)));
}
/// d gelu / dx = Φ(x) + x·φ(x) = (1 + erf(x/√2))/2 + x · e^(−x²/2) / √(2π).
template <class A> TALLY_HD inline A gelu_erf_grad(A x) {
  A cdf = A(0.5) * (A(1) + m_erf(x * A(0.70710678118654752440)));
  A pdf = m_exp(A(-0.5) * x * x) * A(0.39894228040143267794);
  return cdf + x * pdf;
}

/// gelu_tanh(x) = x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))  (approximate='tanh').
template <class A> TALLY_HD inline A gelu_tanh(A x) {
  A u = A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
  return A(0.5) * x * (A(1) + m_tanh_abs(u));
}
/// d gelu_tanh / dx = (1 + t)/2 + x/2 · (1 − t²) · √(2/π) · (1 + 3·0.044715 x²), t = tanh(u).
template <class A> TALLY_HD inline A gelu_tanh_grad(A x) {
  const A k = A(0.79788456080286535588), c = A(0.044715);
  A t = m_tanh_abs(k * (x + c * x * x * x));
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * k * (A(1) + A(3) * c * x * x);
}

/// silu(x) = x · sigmoid(x).
template <class A> TALLY_HD inline A silu(A x) { return x * sigmoid(x); }
/// d silu / dx = s · (1 + x · (1 − s)), s = sigmoid(x).
template <class A> TALLY_HD inline A silu_grad(A x) {
  A s = sigmoid(x);
  return s * (A(1) + x * (A(1) - s));
}

/// y = f(x) for a unary op.
template <class A> TALLY_HD inline A unary(UnOp op, A x) {
  switch (op) {
    case UnOp::Neg: return -x;
    case UnOp::Relu: return x > A(0) ? x : A(0);
    case UnOp::Gelu: return gelu_erf(x);
    case UnOp::GeluTanh: return gelu_tanh(x);
    case UnOp::Silu: return silu(x);
    case UnOp::Tanh: return m_tanh(x);
    case UnOp::Sigmoid: return sigmoid(x);
    case UnOp::Exp: return m_exp(x);
  }
  return x;
}

/// True when the op's derivative is computed from the input x (else from the output y).
TALLY_HD inline bool unary_grad_reads_x(UnOp op) {
  return op == UnOp::Gelu || op == UnOp::GeluTanh || op == UnOp::Silu;
}

/// f'(·) for a unary op: from x for Gelu/GeluTanh/Silu, from y for Relu/Tanh/Sigmoid/Exp
/// (relu'(0) = 0, as PyTorch), constant −1 for Neg.
template <class A> TALLY_HD inline A unary_grad(UnOp op, A x, A y) {
  switch (op) {
    case UnOp::Neg: return A(-1);
    case UnOp::Relu: return y > A(0) ? A(1) : A(0);
    case UnOp::Gelu: return gelu_erf_grad(x);
    case UnOp::GeluTanh: return gelu_tanh_grad(x);
    case UnOp::Silu: return silu_grad(x);
    case UnOp::Tanh: return A(1) - y * y;
    case UnOp::Sigmoid: return y * (A(1) - y);
    case UnOp::Exp: return y;
  }
  return A(0);
}

/// Dropout output for one element: keep ? x / (1 − p) : 0 (p = 1 drops everything).
template <class A> TALLY_HD inline A dropout_apply(A x, bool keep, A p) {
  return keep ? x / (A(1) - p) : A(0);
}

} // namespace rt
