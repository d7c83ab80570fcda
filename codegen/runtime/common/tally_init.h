// tally runtime, common (host code): the default initialisation's normal values. The reference
// definition is philox_normal (Box–Muller in double on two Philox uniforms, libm's log and cos);
// philox_normal_floats gives float(scale · philox_normal(e)) for a run of elements bit for bit,
// many at a time: the Philox blocks and a polynomial log and cos in loops the compiler
// vectorises, then every value whose float rounding the polynomial's error could change (about
// one in 10^4) recomputed by the reference. GPT-2 124M's weights took ~11 s one by one.
#pragma once

#include "tally_philox.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace rt {

/// normal(0, 1) of element e of stream `stream` under `seed`: Box–Muller on the uniforms 2e and
/// 2e + 1 of the stream (u1 = 1 − uniform(2e), so log never sees 0).
inline double philox_normal(uint64_t seed, uint64_t stream, uint64_t e) {
  double u1 = 1.0 - philox_uniform(seed, stream, 2 * e);
  double u2 = philox_uniform(seed, stream, 2 * e + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

namespace detail {

/// Elements per batch of philox_normal_floats (even).
constexpr int kNormalBatch = 256;

/// The fast path's values for elements 2q0 .. 2q0 + 2·nb − 1 (nb <= kNormalBatch / 2) into
/// v (doubles), with exact[i] set where the reference must decide.
inline void philox_normal_batch(uint64_t seed, uint64_t stream, uint64_t q0, int nb, double scale, double* v,
                                uint32_t* exact) {
  // The two uniforms' 24-bit integers of each element: block q holds element 2q (words 0, 1)
  // and 2q + 1 (words 2, 3).
  uint32_t w1[kNormalBatch], w2[kNormalBatch];
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t s0 = static_cast<uint32_t>(stream), s1 = static_cast<uint32_t>(stream >> 32);
  for (int b = 0; b < nb; ++b) {
    const uint64_t q = q0 + static_cast<uint64_t>(b);
    u32x4 c;
    c.w[0] = static_cast<uint32_t>(q);
    c.w[1] = static_cast<uint32_t>(q >> 32);
    c.w[2] = s0;
    c.w[3] = s1;
    u32x4 o = philox4x32_10(c, k0, k1);
    w1[b] = o.w[0] >> 8;
    w2[b] = o.w[1] >> 8;
    w1[nb + b] = o.w[2] >> 8;
    w2[nb + b] = o.w[3] >> 8;
  }
  const int n = 2 * nb;
  // |fast − exact| / |value| is below ~1e-15 (the series' truncation and a few roundings);
  // anything within kSlack of a float rounding boundary goes to the reference.
  const double kSlack = 1e-11;
  const double kSqrtHalf = 0.70710678118654752440;
  const double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  // π/2 in three parts of 33 bits (fdlibm's pio2_1, pio2_2, pio2_3): k · part is exact for k <= 4.
  const double kP1 = 1.57079632673412561417e+00, kP2 = 6.07710050630396597660e-11,
               kP3 = 2.02226624871116645580e-21;
  for (int i = 0; i < n; ++i) {
    // log(u1), u1 = d · 2^-24 with the integer d = 2^24 − w1 in [1, 2^24]: d = m · 2^e with m in
    // [√½, √2), found by halving steps (selects, no bit fiddling: the loop stays vectorisable).
    double m = static_cast<double>(static_cast<int32_t>(0x1000000u - w1[i]));
    double de = -24.0;
    bool big;
    big = m >= kSqrtHalf * 0x1p16, m = big ? m * 0x1p-16 : m, de = big ? de + 16 : de;
    big = m >= kSqrtHalf * 0x1p8, m = big ? m * 0x1p-8 : m, de = big ? de + 8 : de;
    big = m >= kSqrtHalf * 0x1p4, m = big ? m * 0x1p-4 : m, de = big ? de + 4 : de;
    big = m >= kSqrtHalf * 0x1p2, m = big ? m * 0x1p-2 : m, de = big ? de + 2 : de;
    big = m >= kSqrtHalf * 0x1p1, m = big ? m * 0x1p-1 : m, de = big ? de + 1 : de;
    // log m = 2 atanh(s), s = (m − 1) / (m + 1), |s| <= 0.1716: 2s (1 + z/3 + … + z^9/19).
    const double s = (m - 1.0) / (m + 1.0), z = s * s;
    double p = 1.0 / 19;
    p = p * z + 1.0 / 17;
    p = p * z + 1.0 / 15;
    p = p * z + 1.0 / 13;
    p = p * z + 1.0 / 11;
    p = p * z + 1.0 / 9;
    p = p * z + 1.0 / 7;
    p = p * z + 1.0 / 5;
    p = p * z + 1.0 / 3;
    const double logm = 2.0 * s + 2.0 * s * z * p;
    const double lg = de * kLn2Hi + (de * kLn2Lo + logm);
    const double r1 = std::sqrt(-2.0 * lg);
    // cos(x), x = 2π u2 in [0, 2π): x = kπ/2 + r, |r| <= π/4 (+ an ulp or so).
    const double x = 6.283185307179586 * (static_cast<double>(static_cast<int32_t>(w2[i])) * 0x1p-24);
    const int k = static_cast<int>((w2[i] + 0x200000u) >> 22);   // round(4 u2) in 0 .. 4
    const double kd = static_cast<double>(k);
    const double r = ((x - kd * kP1) - kd * kP2) - kd * kP3;
    const double rr = r * r;
    double sp = 1.0 / 355687428096000.0;   // 1/17!
    sp = sp * rr - 1.0 / 1307674368000.0;   // 1/15!
    sp = sp * rr + 1.0 / 6227020800.0;      // 1/13!
    sp = sp * rr - 1.0 / 39916800.0;        // 1/11!
    sp = sp * rr + 1.0 / 362880.0;          // 1/9!
    sp = sp * rr - 1.0 / 5040.0;            // 1/7!
    sp = sp * rr + 1.0 / 120.0;             // 1/5!
    sp = sp * rr - 1.0 / 6.0;               // 1/3!
    const double sinr = r + r * rr * sp;
    double cp = 1.0 / 20922789888000.0;     // 1/16!
    cp = cp * rr - 1.0 / 87178291200.0;     // 1/14!
    cp = cp * rr + 1.0 / 479001600.0;       // 1/12!
    cp = cp * rr - 1.0 / 3628800.0;         // 1/10!
    cp = cp * rr + 1.0 / 40320.0;           // 1/8!
    cp = cp * rr - 1.0 / 720.0;             // 1/6!
    cp = cp * rr + 1.0 / 24.0;              // 1/4!
    cp = cp * rr - 0.5;                     // 1/2!
    const double cosr = 1.0 + rr * cp;
    // cos(kπ/2 + r) = cos r, −sin r, −cos r, sin r for k mod 4 = 0, 1, 2, 3.
    const double c = (k & 1) ? sinr : cosr;
    const double val = scale * (r1 * (((k + 1) & 2) ? -c : c));
    v[i] = val;
    const float lo = static_cast<float>(val * (1.0 - kSlack)), hi = static_cast<float>(val * (1.0 + kSlack));
    // The reference decides: float neighbours, u1 = 1 (a signed zero), cos near a zero.
    const uint32_t neighbours = lo != hi ? 1u : 0u, zero = w1[i] == 0 ? 1u : 0u,
                   nearZero = std::fabs(r) < 1e-6 ? static_cast<uint32_t>(k & 1) : 0u;
    exact[i] = neighbours | zero | nearZero;
  }
}

} // namespace detail

/// out[i] = float(scale · philox_normal(seed, stream, begin + i)) for 0 <= i < n, bit for bit.
inline void philox_normal_floats(uint64_t seed, uint64_t stream, uint64_t begin, int64_t n, double scale,
                                 float* out) {
  auto ref = [&](uint64_t e) { return static_cast<float>(scale * philox_normal(seed, stream, e)); };
  int64_t i = 0;
  if (n > 0 && (begin & 1)) {   // an odd first element: its block's other half is not ours
    out[0] = ref(begin);
    i = 1;
  }
  double v[detail::kNormalBatch];
  uint32_t exact[detail::kNormalBatch];
  while (n - i >= 2) {
    const int nb = static_cast<int>(std::min<int64_t>((n - i) / 2, detail::kNormalBatch / 2));
    const uint64_t e0 = begin + static_cast<uint64_t>(i);
    detail::philox_normal_batch(seed, stream, e0 / 2, nb, scale, v, exact);
    float* o = out + i;
    for (int b = 0; b < nb; ++b) {
      o[2 * b] = static_cast<float>(v[b]);
      o[2 * b + 1] = static_cast<float>(v[nb + b]);
    }
    for (int b = 0; b < nb; ++b) {
      if (exact[b]) o[2 * b] = ref(e0 + 2 * static_cast<uint64_t>(b));
      if (exact[nb + b]) o[2 * b + 1] = ref(e0 + 2 * static_cast<uint64_t>(b) + 1);
    }
    i += 2 * nb;
  }
  if (i < n) out[i] = ref(begin + static_cast<uint64_t>(i));
}

} // namespace rt
