// Unit tests for ir/Dtype: sizes, names, float limits and the rounding model.
#include "ir/Dtype.h"

#include <catch.hpp>

#include <cmath>
#include <cstring>

using namespace tally;

TEST_CASE("dtype: bytes per element", "[dtype]") {
  CHECK(bytesOf(Dtype::F64) == 8);
  CHECK(bytesOf(Dtype::F32) == 4);
  CHECK(bytesOf(Dtype::TF32) == 4);
  CHECK(bytesOf(Dtype::F16) == 2);
  CHECK(bytesOf(Dtype::BF16) == 2);
  CHECK(bytesOf(Dtype::FP8E4M3) == 1);
  CHECK(bytesOf(Dtype::FP8E5M2) == 1);
  CHECK(bytesOf(Dtype::I64) == 8);
  CHECK(bytesOf(Dtype::I32) == 4);
  CHECK(bytesOf(Dtype::I8) == 1);
  CHECK(bytesOf(Dtype::U8) == 1);
  CHECK(bytesOf(Dtype::Bool) == 1);
  CHECK(bytesOf(Dtype::Invalid) == 0);
  // A 4x8 f32 tensor.
  CHECK(4 * 8 * bytesOf(Dtype::F32) == 128);
}

TEST_CASE("dtype: names round-trip and aliases parse", "[dtype]") {
  const Dtype all[] = {Dtype::F64,     Dtype::F32,     Dtype::TF32,
                       Dtype::F16,     Dtype::BF16,    Dtype::FP8E4M3,
                       Dtype::FP8E5M2, Dtype::I64,     Dtype::I32,
                       Dtype::I8,      Dtype::U8,      Dtype::Bool};
  for (Dtype d : all) {
    auto parsed = parseDtype(nameOf(d));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == d);
  }
  CHECK(nameOf(Dtype::FP8E4M3) == "fp8_e4m3");
  CHECK(nameOf(Dtype::BF16) == "bf16");
  CHECK(parseDtype("fp32") == Dtype::F32);
  CHECK(parseDtype("float32") == Dtype::F32);
  CHECK(parseDtype("fp16") == Dtype::F16);
  CHECK(parseDtype("half") == Dtype::F16);
  CHECK(parseDtype("float16") == Dtype::F16);
  CHECK(parseDtype("bfloat16") == Dtype::BF16);
  CHECK(parseDtype("fp64") == Dtype::F64);
  CHECK(parseDtype("float64") == Dtype::F64);
  CHECK(parseDtype("e4m3") == Dtype::FP8E4M3);
  CHECK(parseDtype("e5m2") == Dtype::FP8E5M2);
  CHECK(parseDtype("int32") == Dtype::I32);
  CHECK(parseDtype("int64") == Dtype::I64);
  CHECK(parseDtype("int8") == Dtype::I8);
  CHECK(parseDtype("uint8") == Dtype::U8);
  CHECK_FALSE(parseDtype("f8").has_value());
  CHECK_FALSE(parseDtype("").has_value());
  CHECK_FALSE(parseDtype("FP32").has_value());
}

TEST_CASE("dtype: float classification", "[dtype]") {
  CHECK(isFloat(Dtype::F32));
  CHECK(isFloat(Dtype::TF32));
  CHECK(isFloat(Dtype::FP8E5M2));
  CHECK_FALSE(isFloat(Dtype::I32));
  CHECK_FALSE(isFloat(Dtype::Bool));
  CHECK_FALSE(isFloat(Dtype::Invalid));
  CHECK(isInteger(Dtype::U8));
  CHECK_FALSE(isInteger(Dtype::Bool));
}

TEST_CASE("dtype: float limits", "[dtype]") {
  FloatLimits f16 = limitsOf(Dtype::F16);
  CHECK(f16.max == 65504.0);
  CHECK(f16.minNormal == Approx(6.1035e-5).epsilon(1e-4));
  CHECK(f16.minSubnormal == Approx(5.96e-8).epsilon(1e-3));
  CHECK(f16.epsilon == Approx(9.765625e-4));
  CHECK(f16.mantissaBits == 10);
  CHECK(f16.exponentBits == 5);

  FloatLimits bf16 = limitsOf(Dtype::BF16);
  CHECK(bf16.minNormal == Approx(1.1755e-38).epsilon(1e-4));
  CHECK(bf16.max == Approx(3.3895e38).epsilon(1e-4));
  CHECK(bf16.epsilon == 0.0078125);

  FloatLimits f32 = limitsOf(Dtype::F32);
  CHECK(f32.max == Approx(3.4028235e38));
  CHECK(f32.minSubnormal == Approx(1.4013e-45).epsilon(1e-4));

  FloatLimits tf32 = limitsOf(Dtype::TF32);
  CHECK(tf32.mantissaBits == 10);
  CHECK(tf32.exponentBits == 8);
  CHECK(tf32.minNormal == f32.minNormal);

  FloatLimits e4m3 = limitsOf(Dtype::FP8E4M3);
  CHECK(e4m3.max == 448.0);
  CHECK(e4m3.minNormal == std::ldexp(1.0, -6));
  CHECK(e4m3.minSubnormal == std::ldexp(1.0, -9));
  CHECK(e4m3.epsilon == 0.125);

  FloatLimits e5m2 = limitsOf(Dtype::FP8E5M2);
  CHECK(e5m2.max == 57344.0);
  CHECK(e5m2.minNormal == std::ldexp(1.0, -14));
  CHECK(e5m2.minSubnormal == std::ldexp(1.0, -16));

  CHECK(limitsOf(Dtype::I8).max == 127.0);
  CHECK(limitsOf(Dtype::Invalid).max == 0.0);
}

TEST_CASE("dtype: roundTo underflow and subnormals", "[dtype]") {
  CHECK(roundTo(Dtype::F16, 1e-8) == 0.0);
  CHECK(roundTo(Dtype::BF16, 1e-8) == Approx(1.0012e-08).epsilon(1e-4));
  // The smallest f16 subnormal survives; half of it ties to even (zero).
  double sub = limitsOf(Dtype::F16).minSubnormal;
  CHECK(roundTo(Dtype::F16, sub) == sub);
  CHECK(roundTo(Dtype::F16, sub / 2) == 0.0);
  CHECK(roundTo(Dtype::F16, sub * 0.75) == sub);
  // Signed zero is kept.
  CHECK(std::signbit(roundTo(Dtype::F16, -1e-9)));
}

TEST_CASE("dtype: roundTo overflow", "[dtype]") {
  CHECK(std::isinf(roundTo(Dtype::F16, 70000.0)));
  CHECK(roundTo(Dtype::F16, -70000.0) < 0);
  CHECK(roundTo(Dtype::F16, 65504.0) == 65504.0);
  // Between max and max + half an ulp (65520) rounds down to max; the tie
  // rounds to even, which is up (max's mantissa is odd), so to inf.
  CHECK(roundTo(Dtype::F16, 65519.0) == 65504.0);
  CHECK(std::isinf(roundTo(Dtype::F16, 65520.0)));
  CHECK(std::isinf(roundTo(Dtype::F32, 1e39)));
  CHECK(std::isinf(roundTo(Dtype::FP8E5M2, 1e6)));
  // E4M3 has no infinity: past 448 (after rounding) is NaN.
  CHECK(roundTo(Dtype::FP8E4M3, 448.0) == 448.0);
  CHECK(roundTo(Dtype::FP8E4M3, 460.0) == 448.0);
  CHECK(std::isnan(roundTo(Dtype::FP8E4M3, 500.0)));
  CHECK(std::isnan(roundTo(Dtype::FP8E4M3, INFINITY)));
  CHECK(std::isinf(roundTo(Dtype::F16, INFINITY)));
}

TEST_CASE("dtype: roundTo precision", "[dtype]") {
  CHECK(roundTo(Dtype::F64, 0.1) == 0.1);
  CHECK(roundTo(Dtype::F32, 0.1) == static_cast<double>(0.1f));
  CHECK(roundTo(Dtype::F32, 1.0 / 3.0) == static_cast<double>(1.0f / 3.0f));
  // bf16 has 8 significant bits: 1 + 2^-8 is a tie, rounds to even (1).
  CHECK(roundTo(Dtype::BF16, 1.0 + std::ldexp(1.0, -8)) == 1.0);
  CHECK(roundTo(Dtype::BF16, 1.0 + 3 * std::ldexp(1.0, -8)) ==
        1.0 + std::ldexp(1.0, -6));
  // 256 + 1 is not representable in bf16 or f16 beyond 2048.
  CHECK(roundTo(Dtype::BF16, 257.0) == 256.0);
  CHECK(roundTo(Dtype::F16, 2049.0) == 2048.0);
  CHECK(roundTo(Dtype::F16, 2051.0) == 2052.0);
  CHECK(roundTo(Dtype::TF32, 1.0 + std::ldexp(1.0, -11)) == 1.0);
  CHECK(roundTo(Dtype::TF32, 1.0 + std::ldexp(1.0, -10)) ==
        1.0 + std::ldexp(1.0, -10));
  CHECK(roundTo(Dtype::FP8E4M3, 0.3) == 0.3125);
  CHECK(roundTo(Dtype::FP8E5M2, 3.0) == 3.0);
  CHECK(roundTo(Dtype::FP8E5M2, 5.0) == 5.0);
  CHECK(roundTo(Dtype::FP8E5M2, 4.5) == 4.0);
  CHECK(std::isnan(roundTo(Dtype::F16, NAN)));
  // Integers round to nearest even and saturate.
  CHECK(roundTo(Dtype::I8, 2.5) == 2.0);
  CHECK(roundTo(Dtype::I8, 300.0) == 127.0);
  CHECK(roundTo(Dtype::U8, -3.0) == 0.0);
  CHECK(roundTo(Dtype::Bool, 0.2) == 1.0);
  CHECK(std::isnan(roundTo(Dtype::Invalid, 1.0)));
}
