// Unit tests for the HTML and SARIF renderers' helpers: every diagnostic kind has SARIF rule
// text, artifact URIs, XML escaping, and the chart scales (values derived by hand).
#include "report/Report.h"
#include "report/Sarif.h"
#include "report/Svg.h"

#include <catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

using namespace tally;

TEST_CASE("sarif: every diagnostic kind has a rule with its texts", "[reports]") {
  for (unsigned k = 0; k < NumDiagKinds; ++k) {
    DiagKind kind = static_cast<DiagKind>(k);
    INFO(codeOf(kind).str());
    const SarifRuleText *r = sarifRuleText(kind);
    REQUIRE(r != nullptr);
    CHECK(codeOf(kind) == r->code);
    CHECK(std::string(r->shortDescription).size() > 10);
    CHECK(std::string(r->fullDescription).size() > 10);
    CHECK(std::string(r->help).size() > 5);
  }
}

TEST_CASE("sarif: file paths become URIs", "[reports]") {
  CHECK(sarifUri("/work/a b/m.tally") == "file:///work/a%20b/m.tally");
  CHECK(sarifUri("models/gpt2.tally") == "models/gpt2.tally");
  CHECK(sarifUri("<stdin>") == "%3Cstdin%3E");
  // UTF-8 bytes are percent-encoded one by one: é is C3 A9.
  CHECK(sarifUri("caf\xc3\xa9.tally") == "caf%C3%A9.tally");
}

TEST_CASE("svg: text is escaped for XML", "[reports]") {
  CHECK(xmlEscape("a<b & \"c\" > 'd'") == "a&lt;b &amp; &quot;c&quot; &gt; &#39;d&#39;");
}

TEST_CASE("svg: a log scale spans whole decades", "[reports]") {
  // 0.2 .. 3000 needs the decades 10^-1 .. 10^4: five decades over 500 pixels, 100 each.
  LogScale s = LogScale::covering(0.2, 3000, 0, 500);
  CHECK(s.lo == -1);
  CHECK(s.hi == 4);
  CHECK(s(0.1) == Approx(0));
  CHECK(s(1) == Approx(100));
  CHECK(s(10000) == Approx(500));
  // One value: still one decade wide.
  LogScale one = LogScale::covering(100, 100, 0, 1);
  CHECK(one.hi - one.lo == 1);
}

TEST_CASE("svg: a linear scale ends at a 1-2-5 multiple", "[reports]") {
  // 74.5 / 5 = 14.9 → step 20, max 80; 80 maps to the far end, 20 to a quarter of it.
  LinearScale s = LinearScale::upTo(74.5, 100, 500);
  CHECK(s.step == Approx(20));
  CHECK(s.max == Approx(80));
  CHECK(s(20) == Approx(200));
  CHECK(s(80) == Approx(500));
  // 0.031 / 5 = 0.0062 → step 0.01, max 0.04.
  LinearScale small = LinearScale::upTo(0.031, 0, 1);
  CHECK(small.step == Approx(0.01));
  CHECK(small.max == Approx(0.04));
  // Nothing to draw: a unit axis rather than a division by zero.
  LinearScale zero = LinearScale::upTo(0, 0, 1);
  CHECK(zero.max == Approx(1));
}

TEST_CASE("json: a streamed number is written as llvm::json writes it", "[reports]") {
  // The report's large arrays format doubles with std::to_chars (writeJsonNumber); llvm::json
  // formats a Value's double with printf's "%.17g". The two must agree byte for byte.
  auto viaLlvm = [](double v) {
    std::string s;
    llvm::raw_string_ostream os(s);
    llvm::json::OStream(os).value(v);
    return os.str();
  };
  auto viaUs = [](double v) {
    std::string s;
    llvm::raw_string_ostream os(s);
    llvm::json::OStream j(os);
    writeJsonNumber(j, v);
    return os.str();
  };
  std::vector<double> values{0.0, -0.0, 1.0, -2.5, 3.0, 0.1, 1e16, 1e17, 123456789012345678.0,
                             1e21, 1e-300, 5e-324, std::numeric_limits<double>::max(),
                             std::numeric_limits<double>::min(), 124439808.0, 6.02e23};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (std::isfinite(d))
      values.push_back(d);
    values.push_back(std::ldexp(static_cast<double>(rng() >> 11), static_cast<int>(rng() % 160) - 80));
    // Integers take a path of their own below 10^17: every magnitude up to it, and past it.
    double scale = std::pow(10.0, static_cast<double>(rng() % 19));
    values.push_back(std::trunc(static_cast<double>(rng() >> 11) / 0x1p53 * scale));
    values.push_back(-std::trunc(static_cast<double>(rng() >> 11) / 0x1p53 * scale));
  }
  for (double v : {99999999999999984.0, 1e17 - 16, -99999999999999984.0, 0x1p53, 0x1p53 + 2, 1e15 + 1,
                   -1.0, 1e16 + 2, 100000000000000016.0})
    values.push_back(v);
  for (double v : values) {
    INFO(viaLlvm(v));
    CHECK(viaUs(v) == viaLlvm(v));
  }
  CHECK(viaUs(std::numeric_limits<double>::infinity()) == "null");
  CHECK(viaUs(std::nan("")) == "null");
}
