//===- ir/Units.h - Units of measure on literals, and human formatting ---===//
//
// Literals in a .tally file carry units: counts (15T, 70B, 512K), bytes
// (80 GiB, 40 GB), rates (989 TFLOP/s, 3.35 TB/s), durations (500 ms,
// 2 days) and ratios (40%). This file maps unit spellings to a physical
// dimension and a scale into base units, so Sema can reject a unit in the
// wrong place; and it formats base-unit values back into the short, readable
// strings every report uses, so all reports print numbers the same way.
//
//===----------------------------------------------------------------------===//
#ifndef TALLY_IR_UNITS_H
#define TALLY_IR_UNITS_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>

namespace tally {

/// The physical dimension of a literal's unit. Plain numbers (incl. count
/// suffixes 10B, 2T, 512K) are None.
enum class UnitDim : uint8_t {
  None,     ///< A plain number or a count.
  Ratio,    ///< A fraction: 40% is 0.4.
  Bytes,    ///< Memory size, base unit: bytes.
  Time,     ///< Duration, base unit: seconds.
  FlopRate, ///< Compute rate, base unit: FLOP/s.
  ByteRate, ///< Bandwidth, base unit: B/s.
  Flops,    ///< An amount of computation, base unit: FLOPs.
  Frequency ///< A clock, base unit: Hz.
};

/// A unit's dimension and its scale into base units:
/// value_in_base_units = number * scale.
struct UnitInfo {
  UnitDim dim;
  double scale;
};

/// A unit written as a separate word after a number (case-sensitive):
///  - bytes: "B", "byte", "bytes", decimal "KB","MB","GB","TB","PB" and binary
///    "KiB","MiB","GiB","TiB","PiB". Here "B" means bytes.
///  - time: "ns","us","ms","s","sec","second","seconds","min","minute",
///    "minutes","h","hour","hours","day","days","week","weeks","year","years"
///    (a year is 365 days).
///  - FLOP rates: "FLOP/s" with prefixes K,M,G,T,P,E ("TFLOP/s"); the
///    datasheet spelling with a capital S ("TFLOPS", "FLOPS") is also a rate.
///  - bandwidth: "B/s" with decimal or binary prefixes ("GB/s", "GiB/s"), and
///    network rates in bits ("Mb/s", "Gb/s", "Tb/s": 8 bits a byte).
///  - FLOP amounts: "FLOP", "FLOPs" with prefixes K,M,G,T,P,E,Z,Y
///    ("PFLOP", "EFLOPs"); the lower-case s marks a count, not a rate.
///  - "%": a ratio, 0.01.
/// nullopt if the word is not a unit.
std::optional<UnitInfo> lookupUnit(llvm::StringRef word);

/// A suffix glued to a number: "K","M","B","T" are counts (1e3,1e6,1e9,1e12;
/// dim None), "%" is Ratio 0.01; anything else falls back to lookupUnit (so
/// "80GiB" works); so "10B" = 1e10 count.
std::optional<UnitInfo> lookupSuffix(llvm::StringRef suffix);

/// A noun phrase for messages: "a plain number", "a ratio", "bytes",
/// "a duration", "a FLOP rate", "a bandwidth", "FLOPs".
llvm::StringRef describe(UnitDim d);

/// Suggest the closest known unit word (edit distance) for "did you mean";
/// empty if none close. A word that differs from a unit only in letter case
/// ("GIB", "gib") always gets that unit ("GiB").
std::string closestUnit(llvm::StringRef word);

// Human formatting used by reports (all take base units). Negative values keep
// their sign; NaN and infinities print as "nan"/"inf" with the unit.

/// Bytes in binary units: below 1024 "512 B"; then KiB/MiB/GiB/TiB/PiB with
/// two decimals, e.g. "93.41 GiB".
std::string formatBytes(double bytes);

/// A count: plain below 1e4 ("1024", "0.5"); then K/M/B/T with at most two
/// decimals, trailing zeros dropped ("124.44M", "6.74B", "1.2T"); from 1e15 in
/// scientific notation ("1.5e15").
std::string formatCount(double n);

/// An amount of computation with three significant digits and an SI prefix:
/// "512 FLOP", "1.23 PFLOP", "6.30 YFLOP" (FLOP … YFLOP).
std::string formatFlops(double f);

/// A duration in the largest unit that keeps the number at least 1: ns, us,
/// ms, s, min, h (three significant digits, trailing zeros dropped: "512 ns",
/// "3.2 ms", "1.25 s", "4.2 min", "3.1 h"), then days with two decimals
/// ("143.93 days").
std::string formatDuration(double s);

/// A rate with an SI prefix: FLOP/s for FlopRate ("989.5 TFLOP/s"), B/s with
/// decimal prefixes for ByteRate ("3.35 TB/s"); up to four significant digits,
/// trailing zeros dropped. Other dimensions are formatted by formatValue.
std::string formatRate(double v, UnitDim d);

/// A ratio as a percentage: 0.4 -> "40%", 0.4567 -> "45.67%".
std::string formatPercent(double ratio);

/// Formats v (in base units) by its dimension, using the functions above.
std::string formatValue(double v, UnitDim d);

/// Parses a quantity as written on the command line (`--budget-memory=80GiB`): a number with
/// an optional unit, glued or after a space ("80GiB", "80 GiB", "60s", "40%", "90days", "70B",
/// "15T", "0.5"), and checks that its dimension is `want` (for a Ratio a plain number in
/// (0, 1] is accepted).
/// Returns the value in base units, or nullopt with `error` set.
std::optional<double> parseQuantity(llvm::StringRef text, UnitDim want, std::string &error);

} // namespace tally

#endif // TALLY_IR_UNITS_H
