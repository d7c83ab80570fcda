// tally runtime, common: small host-only helpers for the generated drivers (the main() that
// loads weights, runs training steps and prints a JSON report): a steady clock in seconds and a
// JSON string escaper. Host code only (not TALLY_HD); C++17, no dependencies.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace rt {

/// Seconds on a steady (monotonic) clock since an unspecified start: subtract two readings.
inline double now_seconds() {
  const auto t = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration<double>(t).count();
}

/// The contents of a JSON string literal for s, without the surrounding quotes: write
/// `"\"" + rt::json_escape(s) + "\""`. Escapes `"` and `\`, writes \n \r \t \b \f for those
/// control characters and \u00XX for the other bytes below 0x20 and for 0x7F; every other byte
/// is copied unchanged (UTF-8 in, UTF-8 out).
inline std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

}  // namespace rt
