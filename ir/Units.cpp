//===- ir/Units.cpp - Units of measure on literals, and human formatting -===//
//
// One table lists every unit word with its dimension and scale; lookup,
// suggestions and the tests all read that table. The formatters share two
// helpers: pick the largest unit that keeps the number >= 1, and move up one
// unit when rounding pushes the printed number to the next unit's size.
//
//===----------------------------------------------------------------------===//
#include "ir/Units.h"
#include "support/Format.h"
#include "support/Suggest.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace tally {

namespace {

struct UnitWord {
  const char *word;
  UnitDim dim;
  double scale;
};

constexpr double KiB = 1024.0;
constexpr double MiB = KiB * 1024.0;
constexpr double GiB = MiB * 1024.0;
constexpr double TiB = GiB * 1024.0;
constexpr double PiB = TiB * 1024.0;
constexpr double Day = 86400.0;

/// Every unit word. Order matters only for suggestions: earlier rows win ties.
const std::vector<UnitWord> &unitTable() {
  static const std::vector<UnitWord> table = {
      // Bytes.
      {"B", UnitDim::Bytes, 1},
      {"byte", UnitDim::Bytes, 1},
      {"bytes", UnitDim::Bytes, 1},
      {"KB", UnitDim::Bytes, 1e3},
      {"MB", UnitDim::Bytes, 1e6},
      {"GB", UnitDim::Bytes, 1e9},
      {"TB", UnitDim::Bytes, 1e12},
      {"PB", UnitDim::Bytes, 1e15},
      {"KiB", UnitDim::Bytes, KiB},
      {"MiB", UnitDim::Bytes, MiB},
      {"GiB", UnitDim::Bytes, GiB},
      {"TiB", UnitDim::Bytes, TiB},
      {"PiB", UnitDim::Bytes, PiB},
      // Durations.
      {"ns", UnitDim::Time, 1e-9},
      {"us", UnitDim::Time, 1e-6},
      {"ms", UnitDim::Time, 1e-3},
      {"s", UnitDim::Time, 1},
      {"sec", UnitDim::Time, 1},
      {"second", UnitDim::Time, 1},
      {"seconds", UnitDim::Time, 1},
      {"min", UnitDim::Time, 60},
      {"minute", UnitDim::Time, 60},
      {"minutes", UnitDim::Time, 60},
      {"h", UnitDim::Time, 3600},
      {"hour", UnitDim::Time, 3600},
      {"hours", UnitDim::Time, 3600},
      {"day", UnitDim::Time, Day},
      {"days", UnitDim::Time, Day},
      {"week", UnitDim::Time, 7 * Day},
      {"weeks", UnitDim::Time, 7 * Day},
      {"year", UnitDim::Time, 365 * Day},
      {"years", UnitDim::Time, 365 * Day},
      // Amounts of computation.
      {"FLOP", UnitDim::Flops, 1},
      {"FLOPs", UnitDim::Flops, 1},
      {"KFLOP", UnitDim::Flops, 1e3},
      {"MFLOP", UnitDim::Flops, 1e6},
      {"GFLOP", UnitDim::Flops, 1e9},
      {"TFLOP", UnitDim::Flops, 1e12},
      {"PFLOP", UnitDim::Flops, 1e15},
      {"EFLOP", UnitDim::Flops, 1e18},
      {"ZFLOP", UnitDim::Flops, 1e21},
      {"YFLOP", UnitDim::Flops, 1e24},
      {"KFLOPs", UnitDim::Flops, 1e3},
      {"MFLOPs", UnitDim::Flops, 1e6},
      {"GFLOPs", UnitDim::Flops, 1e9},
      {"TFLOPs", UnitDim::Flops, 1e12},
      {"PFLOPs", UnitDim::Flops, 1e15},
      {"EFLOPs", UnitDim::Flops, 1e18},
      {"ZFLOPs", UnitDim::Flops, 1e21},
      {"YFLOPs", UnitDim::Flops, 1e24},
      // Compute rates.
      {"FLOP/s", UnitDim::FlopRate, 1},
      {"KFLOP/s", UnitDim::FlopRate, 1e3},
      {"MFLOP/s", UnitDim::FlopRate, 1e6},
      {"GFLOP/s", UnitDim::FlopRate, 1e9},
      {"TFLOP/s", UnitDim::FlopRate, 1e12},
      {"PFLOP/s", UnitDim::FlopRate, 1e15},
      {"EFLOP/s", UnitDim::FlopRate, 1e18},
      {"FLOPS", UnitDim::FlopRate, 1},
      {"KFLOPS", UnitDim::FlopRate, 1e3},
      {"MFLOPS", UnitDim::FlopRate, 1e6},
      {"GFLOPS", UnitDim::FlopRate, 1e9},
      {"TFLOPS", UnitDim::FlopRate, 1e12},
      {"PFLOPS", UnitDim::FlopRate, 1e15},
      {"EFLOPS", UnitDim::FlopRate, 1e18},
      // Bandwidths.
      {"B/s", UnitDim::ByteRate, 1},
      {"KB/s", UnitDim::ByteRate, 1e3},
      {"MB/s", UnitDim::ByteRate, 1e6},
      {"GB/s", UnitDim::ByteRate, 1e9},
      {"TB/s", UnitDim::ByteRate, 1e12},
      {"PB/s", UnitDim::ByteRate, 1e15},
      {"KiB/s", UnitDim::ByteRate, KiB},
      {"MiB/s", UnitDim::ByteRate, MiB},
      {"GiB/s", UnitDim::ByteRate, GiB},
      {"TiB/s", UnitDim::ByteRate, TiB},
      // Network rates in bits per second (InfiniBand, Ethernet): 8 bits a byte.
      {"Mb/s", UnitDim::ByteRate, 1e6 / 8},
      {"Gb/s", UnitDim::ByteRate, 1e9 / 8},
      {"Tb/s", UnitDim::ByteRate, 1e12 / 8},
      // Clocks.
      {"Hz", UnitDim::Frequency, 1},
      {"kHz", UnitDim::Frequency, 1e3},
      {"MHz", UnitDim::Frequency, 1e6},
      {"GHz", UnitDim::Frequency, 1e9},
      // Ratios.
      {"%", UnitDim::Ratio, 0.01},
  };
  return table;
}

/// A unit used by the formatters: its printed name and size in base units.
struct Scale {
  std::string name;
  double size;
};

/// Rounds x to `decimals` places, as printf would print it.
double roundedAt(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return std::strtod(buf, nullptr);
}

/// Prints x with `decimals` places, optionally dropping trailing zeros.
std::string fixed(double x, int decimals, bool trim) {
  // From 1e15 up a fixed-point number has more digits than a double holds (and from 1e62 more
  // than the buffer): scientific, three significant digits, as formatCount prints large counts.
  if (std::isfinite(x) && std::fabs(x) >= 1e15) {
    char sci[32];
    std::snprintf(sci, sizeof sci, "%.2e", x);
    std::string m = sci, e;
    size_t at = m.find('e');
    e = m.substr(at + 1);
    m = m.substr(0, at);
    while (m.back() == '0')
      m.pop_back();
    if (m.back() == '.')
      m.pop_back();
    if (!e.empty() && e[0] == '+')
      e = e.substr(1);
    return m + "e" + e;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  std::string s = buf;
  if (trim && s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0')
      s.pop_back();
    if (!s.empty() && s.back() == '.')
      s.pop_back();
  }
  if (s == "-0")
    s = "0";
  return s;
}

/// Decimal places that give `sig` significant digits for |x| >= 1.
int decimalsFor(double x, int sig) {
  double a = std::fabs(x);
  int intDigits = a < 1 ? 1 : static_cast<int>(std::floor(std::log10(a))) + 1;
  return intDigits >= sig ? 0 : sig - intDigits;
}

/// "nan B", "inf B", "-inf B" for non-finite values; empty for finite ones.
std::string nonFinite(double v, llvm::StringRef unit) {
  if (std::isnan(v))
    return "nan " + unit.str();
  if (std::isinf(v))
    return (v < 0 ? "-inf " : "inf ") + unit.str();
  return "";
}

/// Formats v in the largest of `scales` (ascending) that keeps the number
/// >= 1, printing with decimals chosen by `decimalsOf`; moves up a unit if the
/// rounded number reaches the next unit's size. Scales[0] is used for tiny v.
template <typename DecimalsFn>
std::string formatScaled(double v, const std::vector<Scale> &scales,
                         DecimalsFn decimalsOf, bool trim,
                         const std::string &separator = " ") {
  double a = std::fabs(v);
  size_t i = 0;
  while (i + 1 < scales.size() && a >= scales[i + 1].size)
    ++i;
  double x = v / scales[i].size;
  int dec = decimalsOf(x);
  if (i + 1 < scales.size() &&
      std::fabs(roundedAt(x, dec)) >= scales[i + 1].size / scales[i].size) {
    ++i;
    x = v / scales[i].size;
    dec = decimalsOf(x);
  }
  return fixed(x, dec, trim) + separator + scales[i].name;
}

} // namespace

std::optional<UnitInfo> lookupUnit(llvm::StringRef word) {
  for (const UnitWord &u : unitTable())
    if (word == u.word)
      return UnitInfo{u.dim, u.scale};
  return std::nullopt;
}

std::optional<UnitInfo> lookupSuffix(llvm::StringRef suffix) {
  if (suffix == "K")
    return UnitInfo{UnitDim::None, 1e3};
  if (suffix == "M")
    return UnitInfo{UnitDim::None, 1e6};
  if (suffix == "B")
    return UnitInfo{UnitDim::None, 1e9};
  if (suffix == "T")
    return UnitInfo{UnitDim::None, 1e12};
  if (suffix == "%")
    return UnitInfo{UnitDim::Ratio, 0.01};
  return lookupUnit(suffix);
}

llvm::StringRef describe(UnitDim d) {
  switch (d) {
  case UnitDim::None: return "a plain number";
  case UnitDim::Ratio: return "a ratio";
  case UnitDim::Bytes: return "bytes";
  case UnitDim::Time: return "a duration";
  case UnitDim::FlopRate: return "a FLOP rate";
  case UnitDim::ByteRate: return "a bandwidth";
  case UnitDim::Flops: return "FLOPs";
  case UnitDim::Frequency: return "a clock";
  }
  return "a plain number";
}

std::string closestUnit(llvm::StringRef word) {
  if (word.empty())
    return "";
  // 1. Same letters, different case: the user knew the unit.
  for (const UnitWord &u : unitTable())
    if (word.equals_insensitive(u.word))
      return u.word;
  // 2. Otherwise the nearest by edit distance, if it is close enough that the
  //    suggestion is plausible: one edit for short words, two for longer ones,
  //    and never as many edits as the word has characters.
  unsigned limit = word.size() <= 3 ? 1 : 2;
  if (limit >= word.size())
    limit = static_cast<unsigned>(word.size()) - 1;
  std::string best;
  unsigned bestDist = limit + 1;
  for (const UnitWord &u : unitTable()) {
    unsigned dist = word.edit_distance(u.word, /*AllowReplacements=*/true,
                                       /*MaxEditDistance=*/limit + 1);
    if (dist < bestDist) {
      bestDist = dist;
      best = u.word;
    }
  }
  return best;
}

std::string formatBytes(double bytes) {
  std::string bad = nonFinite(bytes, "B");
  if (!bad.empty())
    return bad;
  if (std::fabs(bytes) < 1024 && roundedAt(std::fabs(bytes), 0) < 1024)
    return fixed(bytes, 0, false) + " B";
  static const std::vector<Scale> scales = {
      {"KiB", KiB}, {"MiB", MiB}, {"GiB", GiB}, {"TiB", TiB}, {"PiB", PiB}};
  return formatScaled(
      bytes, scales, [](double) { return 2; }, /*trim=*/false);
}

std::string formatCount(double n) {
  if (std::isnan(n))
    return "nan";
  if (std::isinf(n))
    return n < 0 ? "-inf" : "inf";
  double a = std::fabs(n);
  if (a < 1e4) {
    if (n == std::floor(n))
      return fixed(n, 0, false);
    return significant(n, 4);
  }
  static const std::vector<Scale> scales = {
      {"K", 1e3}, {"M", 1e6}, {"B", 1e9}, {"T", 1e12}};
  if (a < 1e15 && roundedAt(a / 1e12, 2) < 1000)
    return formatScaled(
        n, scales, [](double) { return 2; }, /*trim=*/true, "");
  // Scientific: mantissa with at most two decimals, then the exponent.
  int exp10 = static_cast<int>(std::floor(std::log10(a)));
  double mant = n / std::pow(10.0, exp10);
  if (std::fabs(roundedAt(mant, 2)) >= 10) {
    ++exp10;
    mant = n / std::pow(10.0, exp10);
  }
  return fixed(mant, 2, true) + "e" + std::to_string(exp10);
}

std::string formatFlops(double f) {
  std::string bad = nonFinite(f, "FLOP");
  if (!bad.empty())
    return bad;
  if (f == 0)
    return "0 FLOP";
  static const std::vector<Scale> scales = {
      {"FLOP", 1},     {"KFLOP", 1e3},  {"MFLOP", 1e6},
      {"GFLOP", 1e9},  {"TFLOP", 1e12}, {"PFLOP", 1e15},
      {"EFLOP", 1e18}, {"ZFLOP", 1e21}, {"YFLOP", 1e24}};
  if (std::fabs(f) < 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g FLOP", f);
    return buf;
  }
  return formatScaled(
      f, scales, [](double x) { return decimalsFor(x, 3); },
      /*trim=*/false);
}

std::string formatDuration(double s) {
  std::string bad = nonFinite(s, "s");
  if (!bad.empty())
    return bad;
  if (s == 0)
    return "0 s";
  // Days get two decimals (the headline run time, where a fraction of a day
  // matters); shorter durations get three significant digits.
  double hours = std::fabs(s) / 3600.0;
  if (std::fabs(s) >= Day || roundedAt(hours, decimalsFor(hours, 3)) >= 24) {
    std::string num = fixed(s / Day, 2, true);
    return num + (num == "1" ? " day" : " days");
  }
  static const std::vector<Scale> scales = {
      {"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3},
      {"s", 1},     {"min", 60},  {"h", 3600}};
  if (std::fabs(s) < 1e-9) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g ns", s * 1e9);
    return buf;
  }
  return formatScaled(
      s, scales, [](double x) { return decimalsFor(x, 3); }, /*trim=*/true);
}

std::string formatRate(double v, UnitDim d) {
  const char *unit = nullptr;
  if (d == UnitDim::FlopRate)
    unit = "FLOP/s";
  else if (d == UnitDim::ByteRate)
    unit = "B/s";
  else
    return formatValue(v, d);
  std::string bad = nonFinite(v, unit);
  if (!bad.empty())
    return bad;
  std::string u = unit;
  const std::vector<Scale> named = {
      {u, 1},           {"K" + u, 1e3},  {"M" + u, 1e6}, {"G" + u, 1e9},
      {"T" + u, 1e12}, {"P" + u, 1e15}, {"E" + u, 1e18}};
  if (std::fabs(v) < 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g %s", v, unit);
    return buf;
  }
  return formatScaled(
      v, named, [](double x) { return decimalsFor(x, 4); }, /*trim=*/true);
}

std::string formatPercent(double ratio) {
  if (std::isnan(ratio))
    return "nan%";
  if (std::isinf(ratio))
    return ratio < 0 ? "-inf%" : "inf%";
  // A ratio that is not zero but rounds to 0.00% keeps two significant digits (0.00099%).
  if (ratio != 0 && std::fabs(ratio * 100.0) < 0.005) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2g%%", ratio * 100.0);
    return buf;
  }
  return fixed(ratio * 100.0, 2, true) + "%";
}

std::string formatValue(double v, UnitDim d) {
  switch (d) {
  case UnitDim::None: return formatCount(v);
  case UnitDim::Ratio: return formatPercent(v);
  case UnitDim::Bytes: return formatBytes(v);
  case UnitDim::Time: return formatDuration(v);
  case UnitDim::FlopRate:
  case UnitDim::ByteRate: return formatRate(v, d);
  case UnitDim::Flops: return formatFlops(v);
  case UnitDim::Frequency: return significant(v / 1e9, 4) + " GHz";
  }
  return formatCount(v);
}

std::optional<double> parseQuantity(llvm::StringRef text, UnitDim want, std::string &error) {
  std::string s = text.trim().str();
  if (s.empty()) {
    error = "expected a number, such as 80GiB";
    return std::nullopt;
  }
  char *end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v)) {
    error = "'" + s + "' is not a number";
    return std::nullopt;
  }
  llvm::StringRef unit = llvm::StringRef(end).trim();
  UnitInfo info{UnitDim::None, 1};
  if (!unit.empty()) {
    // For bytes "B" is a byte, not a billion: try the unit words first unless a count is wanted.
    std::optional<UnitInfo> u = want == UnitDim::None ? lookupSuffix(unit) : lookupUnit(unit);
    if (!u)
      u = lookupSuffix(unit);
    if (!u) {
      error = "unknown unit '" + unit.str() + "'" + didYouMean(closestUnit(unit));
      return std::nullopt;
    }
    info = *u;
  }
  double value = v * info.scale;
  bool fits = info.dim == want ||
              (want == UnitDim::Ratio && info.dim == UnitDim::None && value > 0 && value <= 1);
  if (!fits) {
    error = "'" + s + "' is " + describe(info.dim).str() + ", not " + describe(want).str();
    return std::nullopt;
  }
  if (!(value > 0)) {
    error = "'" + s + "' must be positive";
    return std::nullopt;
  }
  return value;
}

} // namespace tally
