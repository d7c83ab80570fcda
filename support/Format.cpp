// Numbers as text (support/Format.h).
#include "support/Format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tally {

std::string significant(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

bool isExactInteger(double v, double below) { return v == std::floor(v) && std::fabs(v) < below; }

std::string integerText(double v) {
  if (v == 0)
    return "0";
  char buf[400]; // %.0f of the largest double is 309 digits
  std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string roundTrip(double v) {
  char buf[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  return buf;
}

std::string compactExponent(const std::string &text) {
  size_t e = text.find('e');
  if (e == std::string::npos)
    return text;
  std::string mant = text.substr(0, e), exp = text.substr(e + 1);
  bool negative = !exp.empty() && exp[0] == '-';
  if (!exp.empty() && (exp[0] == '+' || exp[0] == '-'))
    exp.erase(0, 1);
  while (exp.size() > 1 && exp[0] == '0')
    exp.erase(0, 1);
  return mant + "e" + (negative ? "-" : "") + exp;
}

} // namespace tally
