//===- ir/Dtype.h - Element types and their numeric limits ---------------===//
//
// The element types a tensor can hold, how many bytes each takes, the names a
// .tally file may spell them with, and an exact model of each float format
// (range, precision, rounding). Memory accounting uses bytesOf; the precision
// lints (underflow, overflow, lost increments) use limitsOf and roundTo.
//
//===----------------------------------------------------------------------===//
#ifndef TALLY_IR_DTYPE_H
#define TALLY_IR_DTYPE_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tally {

/// An element type. Invalid marks "not yet known" or a parse failure.
enum class Dtype : uint8_t {
  Invalid,
  F64,
  F32,
  TF32, ///< Tensor-core input format: f32 storage, 10 mantissa bits computed.
  F16,
  BF16,
  FP8E4M3, ///< OCP FP8 E4M3 ("fn"): no infinities, max 448.
  FP8E5M2, ///< OCP FP8 E5M2: IEEE-like, max 57344, has infinities.
  I64,
  I32,
  I8,
  U8,
  Bool,
  INT4, ///< 4-bit integer storage of quantized weights (two per byte), with block-wise scales.
  NF4   ///< 4-bit NormalFloat (Dettmers et al. 2023, QLoRA): quantized weights only.
};

/// Storage size of one element in bytes, for memory accounting. TF32 is stored
/// as a 4-byte f32; fp8 and Bool take one byte; Invalid takes 0. Inline: every tensor's
/// bytes read it, millions of times in a deep model's analysis.
inline unsigned bytesOf(Dtype d) {
  switch (d) {
  case Dtype::F64:
  case Dtype::I64:
    return 8;
  case Dtype::F32:
  case Dtype::TF32:
  case Dtype::I32:
    return 4;
  case Dtype::F16:
  case Dtype::BF16:
    return 2;
  case Dtype::FP8E4M3:
  case Dtype::FP8E5M2:
  case Dtype::I8:
  case Dtype::U8:
  case Dtype::Bool:
    return 1;
  case Dtype::INT4: // two per byte: storageBytes says 0.5; a byte is the smallest addressable unit
  case Dtype::NF4:
    return 1;
  case Dtype::Invalid:
    return 0;
  }
  return 0;
}

/// Storage of one element in bytes, exact for the sub-byte formats: 0.5 for int4 and nf4,
/// bytesOf otherwise. A tensor's bytes (Graph::bytes) read it.
inline double storageBytes(Dtype d) {
  return d == Dtype::INT4 || d == Dtype::NF4 ? 0.5 : static_cast<double>(bytesOf(d));
}

/// True for the storage formats of block-quantized weights: int8, int4, nf4. A parameter in
/// one of them is frozen and dequantized before each matrix product that reads it.
inline bool isQuantized(Dtype d) { return d == Dtype::I8 || d == Dtype::INT4 || d == Dtype::NF4; }

/// Block-wise quantization of a weight, as bitsandbytes stores it: `block` consecutive
/// elements share one absmax scale of `scale` dtype; with double quantization (QLoRA, Dettmers
/// et al. 2023, §3) those scales are themselves quantized to 8 bits in blocks of `doubleBlock`,
/// each block keeping one scale of `scale` dtype. doubleBlock 0: no double quantization.
struct QuantSpec {
  Dtype dtype = Dtype::Invalid; ///< Invalid: no quantized weights
  int64_t block = 64;
  Dtype scale = Dtype::F32;
  int64_t doubleBlock = 0;
};

/// The defaults for a quantized dtype: nf4 as QLoRA trains (block 64, fp32 scales
/// double-quantized to 8 bits in blocks of 256); int4 block 64 with fp32 scales; int8 block
/// 64 with fp32 scales (bitsandbytes' blockwise quantization), no double quantization.
QuantSpec defaultQuant(Dtype d);

/// Bits of storage per quantized element, scales included:
/// bits(dtype) + bits(scale)/block, or with double quantization
/// bits(dtype) + 8/block + bits(scale)/(block·doubleBlock). nf4/64/fp32/256 gives
/// 4 + 8/64 + 32/16384 = 4.1270 bits (0.5159 bytes).
double quantBitsPerElement(const QuantSpec &q);

/// The canonical spelling used in diagnostics and reports: "f64", "f32",
/// "tf32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i64", "i32", "i8", "u8",
/// "bool", "int4", "nf4"; "invalid" for Invalid.
llvm::StringRef nameOf(Dtype d);

/// Parses a dtype name as a user may write it: the canonical names plus the
/// aliases fp64/float64/double, fp32/float32/float, fp16/half/float16,
/// bfloat16, e4m3/float8_e4m3fn, e5m2/float8_e5m2, int64, int32, int8, uint8,
/// boolean, i4. Case-sensitive (lower case). nullopt if unknown.
std::optional<Dtype> parseDtype(llvm::StringRef s);

/// True for the floating-point formats (F64 … FP8E5M2).
bool isFloat(Dtype d);

/// True for the integer formats (I64, I32, I8, U8); Bool is not an integer.
bool isInteger(Dtype d);

/// The numeric envelope of a float format. All values are positive magnitudes.
struct FloatLimits {
  double max;          ///< Largest finite value.
  double minNormal;    ///< Smallest positive normal value.
  double minSubnormal; ///< Smallest positive (subnormal) value.
  double epsilon;      ///< Gap between 1 and the next value: 2^-mantissaBits.
  int mantissaBits;    ///< Stored fraction bits (excluding the implicit 1).
  int exponentBits;
};

/// Limits of a float dtype. TF32 has f32's range with 10 mantissa bits.
/// For integer dtypes, max is the largest value and epsilon is 1 (the other
/// fields are 0); Bool has max 1; Invalid gives all zeros.
FloatLimits limitsOf(Dtype d);

/// The value v takes after conversion to d: rounded to the nearest
/// representable value, ties to even, with gradual underflow (subnormals) and
/// signed zero. Overflow gives +-inf, except in FP8E4M3, which has no infinity:
/// there a value that rounds above 448 becomes NaN (the OCP spec's
/// non-saturating conversion), so an analysis sees it as unrepresentable rather
/// than silently clamped. NaN stays NaN; F64 returns v unchanged. Integer
/// dtypes round to the nearest integer (ties to even) and saturate at their
/// range; Bool gives 1 for any nonzero v; Invalid gives NaN.
double roundTo(Dtype d, double v);

/// The canonical dtype names, in declaration order ("f64", "f32", ..., "bool"): the list a
/// diagnostic shows after an unknown dtype.
std::vector<std::string> dtypeNames();
/// dtypeNames plus the common aliases parseDtype accepts (fp32, bfloat16, int8, ...): the
/// candidates of a "did you mean" for an unknown dtype.
std::vector<std::string> dtypeSpellings();

} // namespace tally

#endif // TALLY_IR_DTYPE_H
