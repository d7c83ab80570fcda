// test_run_timing.cpp — report/RunTiming.cpp: when `tally run` says its timing is unreliable
// (issue 42): a spread of the timed steps above 1.5 (max / min) or a load average above the cores.
#include "report/RunTiming.h"

#include <catch.hpp>

#include <cmath>

using namespace tally;

TEST_CASE("run timing: steady steps on an idle machine give no warning", "[run-timing]") {
  CHECK(runTimingWarnings(1e-3, 1.4e-3, 0.5, 2).empty());
  CHECK(runTimingWarnings(1e-3, 1.5e-3, 2.0, 2).empty()); // at the limits: not above them
  CHECK(runTimingWarnings(1e-3, 1e-3, NAN, 2).empty());   // load unknown: no verdict on it
}

TEST_CASE("run timing: a spread above 1.5 warns with the range and the ratio", "[run-timing]") {
  // The run: 1.16 ms to 655 ms.
  std::vector<std::string> w = runTimingWarnings(1.16e-3, 0.655, 0.5, 16);
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("from 1.16 ms to 655 ms") != std::string::npos);
  CHECK(w[0].find("565 times the fastest, more than 1.5") != std::string::npos);
  CHECK(w[0].find("unreliable") != std::string::npos);
}

TEST_CASE("run timing: a load above the cores warns with both", "[run-timing]") {
  // The calibration: load 11.2.
  std::vector<std::string> w = runTimingWarnings(1e-3, 1.1e-3, 11.2, 2);
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("load average was 11.2 on 2 cores") != std::string::npos);
  w = runTimingWarnings(1e-3, 2e-3, 3.0, 1);
  REQUIRE(w.size() == 2);
  CHECK(w[1].find("on 1 core:") != std::string::npos);
}
