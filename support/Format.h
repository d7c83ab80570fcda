// Numbers as text, written once. Every message, derivation, formula, chart label and generated
// source line that prints a bare number goes through these (units — bytes, FLOP/s, seconds —
// are formatted by ir/Units.h on top of them). Reports must be byte-identical run to run, so
// these use C's printf rules, which are locale-free here (tally never calls setlocale).
#pragma once

#include <string>

namespace tally {

/// `v` with at most `digits` significant digits, as C's %g writes it: "0.5", "1e-05",
/// "65504", "1.5e+20" (no trailing zeros).
std::string significant(double v, int digits = 6);

/// Whether `v` is an integer whose magnitude is below `below` (so it prints exactly as digits).
bool isExactInteger(double v, double below);

/// An integer-valued double as its digits: "2147483648", "0" (also for -0).
std::string integerText(double v);

/// The shortest %g text that reads back as exactly `v` ("1e-05", "0.1", "3.0000000000000004").
std::string roundTrip(double v);

/// A %g text with its exponent written without sign padding or zeros: "6.3e+24" → "6.3e24",
/// "1e-05" → "1e-5"; text without an exponent is returned as it is.
std::string compactExponent(const std::string &text);

} // namespace tally
