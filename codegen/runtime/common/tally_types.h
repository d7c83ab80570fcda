// tally runtime, common: the 16-bit storage types (bf16, f16), their conversions, and acc_t.
// Conversions from float round to nearest, ties to even; NaN stays NaN (quiet), infinities
// stay infinities, overflow goes to infinity. Conversions to float are exact. fp16 subnormals
// (magnitudes below 2^-14, down to 2^-24) are produced and read exactly; bf16 keeps float's
// exponent range, so it has float's subnormals.
#pragma once

#include "tally_hd.h"

namespace rt {

/// float bits -> bf16 bits, round to nearest even; NaN -> quiet NaN with the same sign.
TALLY_HD inline uint16_t bf16_bits_from_float(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)                 // NaN: keep the sign, force quiet
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;                        // ties go to the even neighbour
  u += 0x7FFFu + lsb;                                   // cannot wrap: |f| <= inf here
  return static_cast<uint16_t>(u >> 16);
}

/// bf16 bits -> float (exact).
TALLY_HD inline float float_from_bf16_bits(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

/// float -> IEEE binary16 bits, round to nearest even, with subnormals; overflow -> inf.
TALLY_HD inline uint16_t f16_bits_from_float(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);      // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);     // >= 65520: inf
  int e = static_cast<int>(a >> 23) - 127;                                 // unbiased exponent
  uint32_t mant = a & 0x007FFFFFu;
  if (e >= -14) {                                                          // normal half
    uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;             // carry may bump exp
    return static_cast<uint16_t>(sign | h);
  }
  if (e < -25) return sign;                                                // below 2^-25: zero
  // Subnormal half: value = full · 2^(e-23), in units of 2^-24 that is full >> (-e-1).
  uint32_t full = mant | 0x00800000u;
  int shift = -e - 1;                                                      // 14 .. 24
  uint32_t h = full >> shift;
  uint32_t rem = full & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) h += 1;                     // may become 0x400
  return static_cast<uint16_t>(sign | h);
}

/// IEEE binary16 bits -> float (exact, subnormals included).
TALLY_HD inline float float_from_f16_bits(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;           // mant · 2^-24, exact
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (mant << 13));
  return bits_float(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

/// bfloat16 storage: 1 sign, 8 exponent, 7 mantissa bits. Trivially copyable (arrays of it are
/// plain memory); convert with the explicit constructor (rounds) and float() (exact).
struct bf16 {
  uint16_t bits;
  bf16() = default;
  TALLY_HD explicit bf16(float f) : bits(bf16_bits_from_float(f)) {}
  TALLY_HD explicit operator float() const { return float_from_bf16_bits(bits); }
  /// The bf16 with these bits.
  TALLY_HD static bf16 from_bits(uint16_t b) { bf16 r; r.bits = b; return r; }
};

/// IEEE half storage: 1 sign, 5 exponent, 10 mantissa bits (max 65504, subnormals to 2^-24).
struct f16 {
  uint16_t bits;
  f16() = default;
  TALLY_HD explicit f16(float f) : bits(f16_bits_from_float(f)) {}
  TALLY_HD explicit operator float() const { return float_from_f16_bits(bits); }
  /// The f16 with these bits.
  TALLY_HD static f16 from_bits(uint16_t b) { f16 r; r.bits = b; return r; }
};

static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2, "16-bit storage types must be 2 bytes");

/// The arithmetic type of a storage type: float for float/bf16/f16, double for double.
template <class T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <class T> using acc_t = typename AccType<T>::type;

/// Read a stored value into its arithmetic type (exact).
TALLY_HD inline float load(float x) { return x; }
TALLY_HD inline double load(double x) { return x; }
TALLY_HD inline float load(bf16 x) { return float_from_bf16_bits(x.bits); }
TALLY_HD inline float load(f16 x) { return float_from_f16_bits(x.bits); }

/// Write an arithmetic value into a storage type (16-bit types round to nearest even).
template <class T> TALLY_HD inline T store(acc_t<T> v) { return static_cast<T>(v); }
template <> TALLY_HD inline bf16 store<bf16>(float v) { return bf16::from_bits(bf16_bits_from_float(v)); }
template <> TALLY_HD inline f16 store<f16>(float v) { return f16::from_bits(f16_bits_from_float(v)); }

/// Convert between any two storage types through float (double→double stays exact).
template <class TD, class TS> TALLY_HD inline TD convert(TS x) {
  return store<TD>(static_cast<acc_t<TD>>(load(x)));
}

} // namespace rt
