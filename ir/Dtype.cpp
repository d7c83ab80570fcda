//===- ir/Dtype.cpp - Element types and their numeric limits -------------===//
//
// Every float format is described by one row of parameters (mantissa bits,
// exponent bits, bias, largest finite value, whether it has infinities); the
// limits and the rounding model are derived from that row, so the formats
// cannot disagree with each other.
//
//===----------------------------------------------------------------------===//
#include "ir/Dtype.h"

#include <cmath>
#include <limits>

namespace tally {

namespace {

/// The parameters that define a binary floating-point format.
struct FloatFormat {
  int mantissaBits; ///< p: stored fraction bits.
  int exponentBits;
  int bias;         ///< Exponent bias; the smallest normal exponent is 1 - bias.
  double max;       ///< Largest finite value.
  bool hasInf;      ///< Whether overflow can produce an infinity.
};

/// An IEEE 754 style format: all-ones exponent reserved for inf/NaN.
FloatFormat ieeeFormat(int mantissaBits, int exponentBits) {
  int bias = (1 << (exponentBits - 1)) - 1;
  double max = std::ldexp(2.0 - std::ldexp(1.0, -mantissaBits), bias);
  return {mantissaBits, exponentBits, bias, max, true};
}

/// The format row for a float dtype; nullopt for everything else.
std::optional<FloatFormat> formatOf(Dtype d) {
  switch (d) {
  case Dtype::F64:
    return ieeeFormat(52, 11);
  case Dtype::F32:
    return ieeeFormat(23, 8);
  case Dtype::TF32:
    return ieeeFormat(10, 8);
  case Dtype::F16:
    return ieeeFormat(10, 5);
  case Dtype::BF16:
    return ieeeFormat(7, 8);
  case Dtype::FP8E4M3:
    // OCP 8-bit Floating Point Specification (OFP8) E4M3: bias 7, only
    // S.1111.111 is NaN, so the top binade is usable: max = 1.75 * 2^8 = 448.
    return FloatFormat{3, 4, 7, 448.0, false};
  case Dtype::FP8E5M2:
    return ieeeFormat(2, 5); // max = 1.75 * 2^15 = 57344
  default:
    return std::nullopt;
  }
}

} // namespace

llvm::StringRef nameOf(Dtype d) {
  switch (d) {
  case Dtype::Invalid: return "invalid";
  case Dtype::F64: return "f64";
  case Dtype::F32: return "f32";
  case Dtype::TF32: return "tf32";
  case Dtype::F16: return "f16";
  case Dtype::BF16: return "bf16";
  case Dtype::FP8E4M3: return "fp8_e4m3";
  case Dtype::FP8E5M2: return "fp8_e5m2";
  case Dtype::I64: return "i64";
  case Dtype::I32: return "i32";
  case Dtype::I8: return "i8";
  case Dtype::U8: return "u8";
  case Dtype::Bool: return "bool";
  case Dtype::INT4: return "int4";
  case Dtype::NF4: return "nf4";
  }
  return "invalid";
}

std::optional<Dtype> parseDtype(llvm::StringRef s) {
  struct Alias {
    const char *name;
    Dtype dtype;
  };
  static const Alias aliases[] = {
      {"f64", Dtype::F64},         {"fp64", Dtype::F64},
      {"float64", Dtype::F64},     {"double", Dtype::F64},
      {"f32", Dtype::F32},         {"fp32", Dtype::F32},
      {"float32", Dtype::F32},     {"float", Dtype::F32},
      {"tf32", Dtype::TF32},       {"f16", Dtype::F16},
      {"fp16", Dtype::F16},        {"half", Dtype::F16},
      {"float16", Dtype::F16},     {"bf16", Dtype::BF16},
      {"bfloat16", Dtype::BF16},   {"fp8_e4m3", Dtype::FP8E4M3},
      {"e4m3", Dtype::FP8E4M3},    {"float8_e4m3fn", Dtype::FP8E4M3},
      {"fp8_e5m2", Dtype::FP8E5M2}, {"e5m2", Dtype::FP8E5M2},
      {"float8_e5m2", Dtype::FP8E5M2}, {"i64", Dtype::I64},
      {"int64", Dtype::I64},       {"i32", Dtype::I32},
      {"int32", Dtype::I32},       {"i8", Dtype::I8},
      {"int8", Dtype::I8},         {"u8", Dtype::U8},
      {"uint8", Dtype::U8},        {"bool", Dtype::Bool},
      {"boolean", Dtype::Bool},    {"int4", Dtype::INT4},
      {"i4", Dtype::INT4},         {"nf4", Dtype::NF4},
  };
  for (const Alias &a : aliases)
    if (s == a.name)
      return a.dtype;
  return std::nullopt;
}

QuantSpec defaultQuant(Dtype d) {
  QuantSpec q;
  q.dtype = d;
  q.block = 64;
  q.scale = Dtype::F32;
  q.doubleBlock = d == Dtype::NF4 ? 256 : 0;
  return q;
}

double quantBitsPerElement(const QuantSpec &q) {
  double bits = storageBytes(q.dtype) * 8;
  double block = static_cast<double>(q.block > 0 ? q.block : 1);
  double scaleBits = static_cast<double>(bytesOf(q.scale)) * 8;
  if (q.doubleBlock <= 0)
    return bits + scaleBits / block;
  return bits + 8 / block + scaleBits / (block * static_cast<double>(q.doubleBlock));
}

bool isFloat(Dtype d) { return formatOf(d).has_value(); }

bool isInteger(Dtype d) {
  return d == Dtype::I64 || d == Dtype::I32 || d == Dtype::I8 ||
         d == Dtype::U8;
}

namespace {

/// Largest value of an integer dtype (I64's is rounded to the double 2^63).
double integerMax(Dtype d) {
  switch (d) {
  case Dtype::I64: return std::ldexp(1.0, 63);
  case Dtype::I32: return 2147483647.0;
  case Dtype::I8: return 127.0;
  case Dtype::U8: return 255.0;
  default: return 0.0;
  }
}

/// Smallest value of an integer dtype.
double integerMin(Dtype d) {
  switch (d) {
  case Dtype::I64: return -std::ldexp(1.0, 63);
  case Dtype::I32: return -2147483648.0;
  case Dtype::I8: return -128.0;
  default: return 0.0; // U8
  }
}

} // namespace

FloatLimits limitsOf(Dtype d) {
  if (std::optional<FloatFormat> f = formatOf(d)) {
    int minExp = 1 - f->bias;
    return FloatLimits{f->max,
                       std::ldexp(1.0, minExp),
                       std::ldexp(1.0, minExp - f->mantissaBits),
                       std::ldexp(1.0, -f->mantissaBits),
                       f->mantissaBits,
                       f->exponentBits};
  }
  if (isInteger(d))
    return FloatLimits{integerMax(d), 0, 0, 1, 0, 0};
  if (d == Dtype::Bool)
    return FloatLimits{1, 0, 0, 1, 0, 0};
  return FloatLimits{0, 0, 0, 0, 0, 0};
}

double roundTo(Dtype d, double v) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  if (d == Dtype::F64)
    return v;
  if (d == Dtype::Invalid)
    return nan;
  if (std::isnan(v))
    return v;
  if (d == Dtype::Bool)
    return v != 0 ? 1.0 : 0.0;
  if (isInteger(d)) {
    if (v >= integerMax(d))
      return integerMax(d);
    if (v <= integerMin(d))
      return integerMin(d);
    return std::nearbyint(v); // default rounding mode: ties to even
  }

  FloatFormat f = *formatOf(d);
  double a = std::fabs(v);
  if (a == 0)
    return v; // keeps the sign of zero
  if (std::isinf(a))
    return f.hasInf ? v : nan;

  // 1. The binade of a: a = m * 2^e with m in [1, 2). Below the normal range
  //    the spacing stops shrinking (gradual underflow), so clamp e to emin.
  int frexpExp = 0;
  std::frexp(a, &frexpExp); // a = m' * 2^frexpExp, m' in [0.5, 1)
  int e = frexpExp - 1;
  int minExp = 1 - f.bias;
  if (e < minExp)
    e = minExp;
  // 2. Values in that binade are multiples of 2^(e - p). Scale so the quantum
  //    is 1 (exact: a power-of-two scale), round ties-to-even, scale back.
  double units = std::nearbyint(std::ldexp(a, f.mantissaBits - e));
  double r = std::ldexp(units, e - f.mantissaBits);
  // 3. Rounding can carry into the next binade; past max is overflow.
  if (r > f.max)
    return f.hasInf ? std::copysign(inf, v) : nan;
  return std::copysign(r, v);
}

std::vector<std::string> dtypeNames() {
  std::vector<std::string> out;
  // Every enumerator after Invalid, in declaration order, until nameOf no longer knows one.
  for (unsigned i = static_cast<unsigned>(Dtype::Invalid) + 1; i < 256; ++i) {
    llvm::StringRef n = nameOf(static_cast<Dtype>(i));
    if (n == "invalid")
      break;
    out.push_back(n.str());
  }
  return out;
}

std::vector<std::string> dtypeSpellings() {
  std::vector<std::string> out = dtypeNames();
  // The aliases people type most (PyTorch's and the papers' names); kept only where parseDtype
  // accepts them, so a suggestion is always a name that parses.
  for (const char *alias : {"fp64", "fp32", "fp16", "bfloat16", "float32", "float16", "int64",
                            "int32", "int8", "uint8"})
    if (parseDtype(alias))
      out.push_back(alias);
  return out;
}

} // namespace tally
