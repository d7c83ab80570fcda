// Unit tests for ir/Units: unit lookup, suggestions and report formatting.
#include "ir/Units.h"

#include <catch.hpp>

#include <cmath>

using namespace tally;

namespace {
/// The value of "number word" in base units; NaN if the word is not a unit.
double valueOf(double number, llvm::StringRef word) {
  auto u = lookupUnit(word);
  return u ? number * u->scale : NAN;
}
UnitDim dimOf(llvm::StringRef word) {
  auto u = lookupUnit(word);
  REQUIRE(u.has_value());
  return u->dim;
}
} // namespace

TEST_CASE("units: byte units", "[units]") {
  CHECK(valueOf(80, "GiB") == 80.0 * 1024 * 1024 * 1024);
  CHECK(valueOf(40, "GB") == 40e9);
  CHECK(valueOf(512, "MB") == 512e6);
  CHECK(valueOf(4, "KiB") == 4096);
  CHECK(valueOf(2, "TB") == 2e12);
  CHECK(valueOf(7, "B") == 7);
  CHECK(valueOf(7, "bytes") == 7);
  CHECK(dimOf("GiB") == UnitDim::Bytes);
  CHECK(dimOf("B") == UnitDim::Bytes);
}

TEST_CASE("units: rates", "[units]") {
  CHECK(valueOf(989, "TFLOP/s") == Approx(989e12));
  CHECK(dimOf("TFLOP/s") == UnitDim::FlopRate);
  CHECK(valueOf(3.35, "TB/s") == Approx(3.35e12));
  CHECK(dimOf("TB/s") == UnitDim::ByteRate);
  CHECK(valueOf(64, "GB/s") == Approx(64e9));
  // Network rates are in bits: 400 Gb/s is 50 GB/s, 200 Gb/s (InfiniBand HDR) 25 GB/s.
  CHECK(valueOf(400, "Gb/s") == Approx(50e9));
  CHECK(valueOf(200, "Gb/s") == Approx(25e9));
  CHECK(valueOf(100, "Mb/s") == Approx(12.5e6));
  CHECK(valueOf(1, "GiB/s") == 1024.0 * 1024 * 1024);
  CHECK(valueOf(1, "PFLOP/s") == 1e15);
  CHECK(dimOf("TFLOPS") == UnitDim::FlopRate);
  CHECK(dimOf("FLOP/s") == UnitDim::FlopRate);
}

TEST_CASE("units: durations", "[units]") {
  CHECK(valueOf(500, "ms") == Approx(0.5));
  CHECK(valueOf(2, "days") == 172800);
  CHECK(valueOf(1, "day") == 86400);
  CHECK(valueOf(3, "h") == 10800);
  CHECK(valueOf(1, "hours") == 3600);
  CHECK(valueOf(5, "min") == 300);
  CHECK(valueOf(1, "weeks") == 604800);
  CHECK(valueOf(1, "year") == 365 * 86400.0);
  CHECK(valueOf(20, "us") == Approx(20e-6));
  CHECK(valueOf(512, "ns") == Approx(512e-9));
  CHECK(dimOf("s") == UnitDim::Time);
}

TEST_CASE("units: FLOP amounts", "[units]") {
  CHECK(dimOf("FLOPs") == UnitDim::Flops);
  CHECK(dimOf("FLOP") == UnitDim::Flops);
  CHECK(valueOf(6, "EFLOP") == 6e18);
  CHECK(valueOf(3, "GFLOP") == 3e9);
  CHECK(valueOf(2, "TFLOPs") == 2e12);
  CHECK(dimOf("TFLOPs") == UnitDim::Flops);
}

TEST_CASE("units: suffixes glued to numbers", "[units]") {
  auto pct = lookupSuffix("%");
  REQUIRE(pct.has_value());
  CHECK(pct->dim == UnitDim::Ratio);
  CHECK(40 * pct->scale == Approx(0.4));

  auto t = lookupSuffix("T");
  REQUIRE(t.has_value());
  CHECK(t->dim == UnitDim::None);
  CHECK(15 * t->scale == 15e12);

  auto b = lookupSuffix("B");
  REQUIRE(b.has_value());
  CHECK(b->dim == UnitDim::None); // 70B is a count ...
  CHECK(70 * b->scale == 70e9);
  CHECK(lookupUnit("B")->dim == UnitDim::Bytes); // ... but "70 B" is bytes.

  CHECK(lookupSuffix("K")->scale == 1e3);
  CHECK(lookupSuffix("M")->scale == 1e6);
  auto gib = lookupSuffix("GiB"); // 80GiB
  REQUIRE(gib.has_value());
  CHECK(gib->dim == UnitDim::Bytes);
  CHECK(80 * gib->scale == 80.0 * (1ull << 30));
  CHECK(lookupSuffix("ms")->dim == UnitDim::Time);
  CHECK_FALSE(lookupSuffix("Q").has_value());
}

TEST_CASE("units: unknown words", "[units]") {
  CHECK_FALSE(lookupUnit("GIB").has_value());
  CHECK_FALSE(lookupUnit("parsecs").has_value());
  CHECK_FALSE(lookupUnit("").has_value());
  CHECK_FALSE(lookupUnit("K").has_value()); // a count suffix, not a unit word
}

TEST_CASE("units: did-you-mean suggestions", "[units]") {
  CHECK(closestUnit("GIB") == "GiB");
  CHECK(closestUnit("Gib") == "GiB");
  CHECK(closestUnit("gb") == "GB");
  CHECK(closestUnit("TFLOP/S") == "TFLOP/s");
  CHECK(closestUnit("dayss") == "days");
  CHECK(closestUnit("hourss") == "hours");
  CHECK(closestUnit("GBs") == "GB");
  CHECK(closestUnit("parsecs") == "");
  CHECK(closestUnit("x") == "");
  CHECK(closestUnit("") == "");
}

TEST_CASE("units: describe dimensions", "[units]") {
  CHECK(describe(UnitDim::None) == "a plain number");
  CHECK(describe(UnitDim::Ratio) == "a ratio");
  CHECK(describe(UnitDim::Bytes) == "bytes");
  CHECK(describe(UnitDim::Time) == "a duration");
  CHECK(describe(UnitDim::FlopRate) == "a FLOP rate");
  CHECK(describe(UnitDim::ByteRate) == "a bandwidth");
  CHECK(describe(UnitDim::Flops) == "FLOPs");
}

TEST_CASE("units: formatBytes", "[units]") {
  CHECK(formatBytes(0) == "0 B");
  CHECK(formatBytes(512) == "512 B");
  CHECK(formatBytes(1023) == "1023 B");
  CHECK(formatBytes(1024) == "1.00 KiB");
  CHECK(formatBytes(1536) == "1.50 KiB");
  CHECK(formatBytes(93.41 * (1ull << 30)) == "93.41 GiB");
  CHECK(formatBytes(80e9) == "74.51 GiB");
  CHECK(formatBytes(124439808.0 * 4) == "474.70 MiB");
  CHECK(formatBytes(2.5 * (1ull << 40)) == "2.50 TiB");
  // Rounding up to the next unit moves to it.
  CHECK(formatBytes(1024.0 * 1024 - 1) == "1.00 MiB");
  CHECK(formatBytes(-2048) == "-2.00 KiB");
}

TEST_CASE("units: formatCount", "[units]") {
  CHECK(formatCount(0) == "0");
  CHECK(formatCount(1024) == "1024");
  CHECK(formatCount(9999) == "9999");
  CHECK(formatCount(0.5) == "0.5");
  CHECK(formatCount(12000) == "12K");
  CHECK(formatCount(124439808) == "124.44M");
  CHECK(formatCount(6738415616.0) == "6.74B");
  CHECK(formatCount(1.2e12) == "1.2T");
  CHECK(formatCount(15e12) == "15T");
  CHECK(formatCount(10e9) == "10B");
  CHECK(formatCount(999999) == "1M");
  CHECK(formatCount(1.5e15) == "1.5e15");
  CHECK(formatCount(9.999e15) == "1e16");
}

TEST_CASE("units: formatFlops", "[units]") {
  CHECK(formatFlops(0) == "0 FLOP");
  CHECK(formatFlops(512) == "512 FLOP");
  CHECK(formatFlops(1.234e15) == "1.23 PFLOP");
  CHECK(formatFlops(6.3e24) == "6.30 YFLOP");
  CHECK(formatFlops(2.0 * 1024 * (1024 * 1024 + 1024 * 64)) == "2.28 GFLOP");
  CHECK(formatFlops(45.6e18) == "45.6 EFLOP");
  CHECK(formatFlops(999.9e9) == "1.00 TFLOP");
}

TEST_CASE("units: formatDuration", "[units]") {
  CHECK(formatDuration(0) == "0 s");
  CHECK(formatDuration(512e-9) == "512 ns");
  CHECK(formatDuration(3.2e-3) == "3.2 ms");
  CHECK(formatDuration(1.25) == "1.25 s");
  CHECK(formatDuration(4.2 * 60) == "4.2 min");
  CHECK(formatDuration(3.1 * 3600) == "3.1 h");
  CHECK(formatDuration(143.93 * 86400) == "143.93 days");
  CHECK(formatDuration(86400) == "1 day");
  CHECK(formatDuration(20e-6) == "20 us");
  CHECK(formatDuration(59.999) == "1 min");
  CHECK(formatDuration(23.999 * 3600) == "1 day");
}

TEST_CASE("units: formatRate and friends", "[units]") {
  CHECK(formatRate(989.5e12, UnitDim::FlopRate) == "989.5 TFLOP/s");
  CHECK(formatRate(3.35e12, UnitDim::ByteRate) == "3.35 TB/s");
  CHECK(formatRate(1979e12, UnitDim::FlopRate) == "1.979 PFLOP/s");
  CHECK(formatRate(64e9, UnitDim::ByteRate) == "64 GB/s");
  CHECK(formatRate(450e9, UnitDim::ByteRate) == "450 GB/s");
  CHECK(formatRate(66.9e12, UnitDim::FlopRate) == "66.9 TFLOP/s");
  CHECK(formatRate(512, UnitDim::ByteRate) == "512 B/s");
  CHECK(formatPercent(0.4) == "40%");
  CHECK(formatPercent(0.4567) == "45.67%");
  CHECK(formatValue(1024, UnitDim::Bytes) == "1.00 KiB");
  CHECK(formatValue(0.5, UnitDim::Time) == "500 ms");
  CHECK(formatValue(70e9, UnitDim::None) == "70B");
}
