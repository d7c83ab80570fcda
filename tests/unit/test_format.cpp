// test_format.cpp — numbers as text (support/Format.h), the one formatter every message,
// derivation and generated file uses. Expected strings are C's printf rules written out.
#include "support/Format.h"

#include <catch.hpp>

#include <cstdlib>

using namespace tally;

TEST_CASE("significant digits as %g writes them", "[format]") {
  CHECK(significant(0.5) == "0.5");
  CHECK(significant(1.0 / 3) == "0.333333");  // six digits by default
  CHECK(significant(1e-5) == "1e-05");
  CHECK(significant(65504, 5) == "65504");
  CHECK(significant(6.103515625e-05, 5) == "6.1035e-05"); // fp16's smallest normal, 2^-14
  CHECK(significant(1.5e20) == "1.5e+20");
  CHECK(significant(12345678, 4) == "1.235e+07");
}

TEST_CASE("exact integers print every digit", "[format]") {
  CHECK(isExactInteger(2147483648.0, 9007199254740992.0));
  CHECK_FALSE(isExactInteger(0.5, 1e6));
  CHECK_FALSE(isExactInteger(1e6, 1e6)); // the bound is exclusive
  CHECK(integerText(2147483648.0) == "2147483648");
  CHECK(integerText(-0.0) == "0");
  CHECK(integerText(1e300).size() == 301); // 1 followed by 300 digits, no buffer overrun
}

TEST_CASE("shortest text that reads back", "[format]") {
  CHECK(roundTrip(0.1) == "0.1");
  CHECK(roundTrip(1e-5) == "1e-05");
  CHECK(roundTrip(0.1 + 0.2) == "0.30000000000000004"); // 17 digits are needed
  for (double v : {3.14159, 1e-300, 123456.789, 6.02214076e23})
    CHECK(std::strtod(roundTrip(v).c_str(), nullptr) == v);
}

TEST_CASE("exponents written compactly", "[format]") {
  CHECK(compactExponent("6.3e+24") == "6.3e24");
  CHECK(compactExponent("1.244e+07") == "1.244e7");
  CHECK(compactExponent("1e-05") == "1e-5");
  CHECK(compactExponent("1234") == "1234");
}
